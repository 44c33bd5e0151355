"""``models.import_hook.after_import``: the callback runs once, after the module's own code, whether the module
was imported before or after; a callback that fails warns without failing the import (timm in both orders:
tests/test_startup.py)."""

from __future__ import annotations

import sys

import pytest

from laplacianformer.models.import_hook import _AfterImport, after_import


@pytest.fixture
def module_dir(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    names = []

    def make(name: str) -> str:
        (tmp_path / f"{name}.py").write_text("VALUE = 7\n")
        names.append(name)
        return name

    yield make
    for name in names:
        sys.modules.pop(name, None)
    sys.meta_path[:] = [f for f in sys.meta_path if not (isinstance(f, _AfterImport) and f.name in names)]


def _hooked(name: str) -> bool:
    return any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path)


def test_runs_after_a_later_import_once_with_the_real_loader(module_dir):
    name = module_dir("lf_hook_later")
    seen = []
    after_import(name, lambda: seen.append(sys.modules[name].VALUE))
    assert seen == [] and _hooked(name)
    module = __import__(name)
    assert seen == [7]
    assert type(module.__loader__).__name__ == "SourceFileLoader" and module.__spec__.loader is module.__loader__
    assert not _hooked(name)


def test_runs_at_once_when_already_imported(module_dir):
    name = module_dir("lf_hook_earlier")
    __import__(name)
    seen = []
    after_import(name, lambda: seen.append(1))
    assert seen == [1]
    assert not _hooked(name)


def test_a_failing_callback_warns_and_the_import_succeeds(module_dir):
    name = module_dir("lf_hook_failing")

    def broken():
        raise RuntimeError("no")

    after_import(name, broken)
    with pytest.warns(RuntimeWarning, match=f"after importing {name}: .*broken failed .*no"):
        assert __import__(name).VALUE == 7

"""``after_import(name, callback)``: run ``callback()`` once the top-level module ``name`` is imported.

At once when the module is already in ``sys.modules``; otherwise a one-shot finder at the head of
``sys.meta_path`` finds the module through the other finders, and its loader runs the callback right
after the module's own code (the module keeps its real loader). This is how ``laplacianformer.models``
registers its models with timm without importing timm (docs/MODELS.md, "timm"): ``import timm`` pulls
in ``torch._dynamo`` and torchvision, over a second.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from importlib.abc import Loader, MetaPathFinder


def after_import(name: str, callback: Callable[[], object]) -> None:
    """``callback()`` now if ``name`` is imported, else right after its import (once; a failed import
    leaves the hook for the next try). A callback that raises warns instead of failing the import."""
    if name in sys.modules:
        if sys.modules[name] is not None:  # None: the import is blocked (``sys.modules[name] = None``)
            callback()
        return
    sys.meta_path.insert(0, _AfterImport(name, callback))


class _AfterImport(MetaPathFinder):
    def __init__(self, name: str, callback: Callable[[], object]):
        self.name = name
        self.callback = callback

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _ThenLoader(spec.loader, self)
        return spec

    def fire(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        try:
            self.callback()
        except Exception as exc:  # the module itself imported: its import must not fail for us
            warnings.warn(f"after importing {self.name}: {self.callback.__qualname__} failed "
                          f"({type(exc).__name__}: {exc})", RuntimeWarning, stacklevel=2)


class _ThenLoader(Loader):
    """The module's own loader, then the hook's callback."""

    def __init__(self, loader: Loader, hook: _AfterImport):
        self.loader = loader
        self.hook = hook

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        module.__loader__ = module.__spec__.loader = self.loader  # the module sees its real loader
        self.loader.exec_module(module)
        self.hook.fire()

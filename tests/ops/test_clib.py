"""ops/_clib.py: a C source's build is keyed by the local headers it includes as well as by the source."""

from __future__ import annotations

from pathlib import Path

from laplacianformer.ops import _clib, builds

OPS = Path(_clib.__file__).resolve().parent


def test_source_text_follows_local_includes(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.c").write_text('#include <stdlib.h>\n#include "sub/b.h"\n#include __FILE__\n')
    (tmp_path / "sub" / "b.h").write_text('#include "../c.h"\n#include "../c.h"\n')
    (tmp_path / "c.h").write_text("/* c */\n")
    text = _clib.source_text(tmp_path / "a.c")
    assert text == (tmp_path / "a.c").read_bytes() + (tmp_path / "sub" / "b.h").read_bytes() + b"/* c */\n"
    before = text
    (tmp_path / "c.h").write_text("/* c, changed */\n")
    assert _clib.source_text(tmp_path / "a.c") != before


def test_shared_header_is_part_of_the_sources_that_include_it():
    header = (OPS / "csrc" / "lf_template.h").read_bytes()
    instances = (OPS / "csrc" / "lf_instances.h").read_bytes()
    for src in (OPS / "csrc" / "normalization.c", OPS / "csrc" / "grid.c"):
        assert _clib.source_text(src) == src.read_bytes() + header + instances
    pairwise = OPS / "kernel" / "csrc" / "pairwise.c"
    assert _clib.source_text(pairwise) == pairwise.read_bytes() + header
    ns = OPS / "newton_schulz" / "csrc" / "newton_schulz.c"
    assert _clib.source_text(ns) == ns.read_bytes()  # no local header: the key is as before


def test_cache_follows_xdg_and_the_override(monkeypatch, tmp_path):
    monkeypatch.delenv("LAPLACIANFORMER_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _clib.cache_dir() == tmp_path / "xdg" / "laplacianformer"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")  # the XDG spec: relative paths are invalid
    assert _clib.cache_dir() == Path.home() / ".cache" / "laplacianformer"
    monkeypatch.setenv("LAPLACIANFORMER_CACHE", str(tmp_path / "mine"))
    assert _clib.cache_dir() == tmp_path / "mine"


def _run(code: str, env: dict) -> "subprocess.CompletedProcess":
    import os
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})


def test_failed_build_warns_once_with_reason_and_cost(tmp_path):
    """No working compiler: the first CPU attention call warns once (reason, cost, remedy) and still runs."""
    code = ("import torch, laplacianformer as lf\n"
            "q = torch.randn(1, 2, 64, 8)\n"
            "for _ in range(2): lf.laplacian_attention(q, q, q, hw=(8, 8), landmarks=(2, 2))\n"
            "print('ran')")
    proc = _run(code, {"CC": str(tmp_path / "no-cc"), "LAPLACIANFORMER_CACHE": str(tmp_path / "cache")})
    assert proc.returncode == 0 and "ran" in proc.stdout, proc.stderr
    assert proc.stderr.count("could not be built") == 1, proc.stderr
    assert "2x slower" in proc.stderr and "laplacianformer build" in proc.stderr and "no-cc" in proc.stderr
    quiet = _run(code, {"LAPLACIANFORMER_NO_NATIVE": "1"})  # disabled on purpose: no warning
    assert quiet.returncode == 0 and "could not be built" not in quiet.stderr


def test_build_command_reports_every_library(tmp_path):
    code = "import sys; from laplacianformer.cli import main; sys.exit(main(['build']))"
    bad = _run(code, {"CC": str(tmp_path / "no-cc"), "LAPLACIANFORMER_CACHE": str(tmp_path / "cache")})
    libraries = len(_clib.LIBRARIES)  # every library (importing builds registers them all)
    assert bad.returncode == 1 and bad.stdout.count("unavailable") == libraries and "2x slower" in bad.stderr
    good = _run(code, {})
    if good.returncode == 0:  # a machine with a C compiler (CI has one)
        assert good.stdout.count(": built ") == libraries

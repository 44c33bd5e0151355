"""ops/_clib.py: a C source's build is keyed by the local headers it includes as well as by the source."""

from __future__ import annotations

from pathlib import Path

from laplacianformer.ops import _clib

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
    for src in (OPS / "csrc" / "normalization.c", OPS / "kernel" / "csrc" / "pairwise.c"):
        assert _clib.source_text(src) == src.read_bytes() + header
    ns = OPS / "newton_schulz" / "csrc" / "newton_schulz.c"
    assert _clib.source_text(ns) == ns.read_bytes()  # no local header: the key is as before

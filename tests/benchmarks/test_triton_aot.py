"""benchmarks/triton_aot.py: the fast subset compiles for sm_80 and sm_90 without spills or shared memory
over the per-block limit (``--strict``), on a machine without a GPU (ptxas from the triton wheel)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

pytest.importorskip("triton")

from benchmarks import triton_aot  # noqa: E402


def test_specialisations_come_from_the_launchers():
    specs = triton_aot.collect()
    families = {s[5].split()[0] for s in specs}
    assert families == {"kernel_fwd", "kernel_bwd_dx", "kernel_bwd_dy", "matmul_fwd", "matmul_bwd_dx",
                        "matmul_bwd_dy", "ns_fwd", "ns_grad", "norm_gram", "norm_key_fwd", "norm_key_bwd",
                        "norm_rows", "stream_query", "stream_combine", "stream_key", "stream_out"}
    from laplacianformer.ops.kernel import triton as kt

    # the model's call: d = 64 -> two 32-wide chunks, the configuration the launcher uses
    fwd = [s for s in specs if s[5] == "kernel_fwd dtype=fp32 kind=L1 d=64"]
    assert len(fwd) == 1 and fwd[0][2]["NUM_D"] == kt.fwd_config(64)["NUM_D"] == 2
    for kernel, sig, const, warps, stages, label, *options in specs:
        assert set(sig) | set(const) == set(kernel.arg_names), label
    fast = triton_aot.collect(subset="fast")
    assert 0 < len(fast) < len(specs) / 10
    # the normalisation on the model's path: float32, m = 49 -> 64, e = 64, injective
    norm = {s[5] for s in fast if s[5].startswith("norm_")}
    assert {label.split()[0] for label in norm} == {"norm_gram", "norm_key_fwd", "norm_key_bwd", "norm_rows"}
    assert all("dtype=fp32 m=64" in label and "e=16" not in label and "e=32" not in label and "inj=0" not in label
               for label in norm), norm
    assert len(norm) == 10, norm


def test_match_words():
    specs = triton_aot.collect(match="norm m=64 dtype=fp64")
    assert specs and all(s[5].startswith("norm_") and {"m=64", "dtype=fp64"} <= set(s[5].split()) for s in specs)
    assert {s[5].split()[0] for s in triton_aot.collect(match="norm_key_bwd e=16")} == {"norm_key_bwd"}
    assert not triton_aot.collect(match="m=6")  # key=value words match whole words only


def test_fast_subset_fits_on_sm80_and_sm90(tmp_path):
    out = tmp_path / "aot.json"
    rc = triton_aot.main(["--subset", "fast", "--strict", "--quiet", "--json", str(out)])
    data = json.loads(out.read_text())
    bad = [r for r in data["rows"] if r["error"] or max(r["spill_stores"] or 0, r["spill_loads"] or 0)
           or r["shared"] > r["shared_limit"]]
    assert rc == 0 and not bad, bad
    assert {r["target"] for r in data["rows"]} == {"sm_80", "sm_90"}
    assert all(r["registers"] and r["registers"] <= 255 for r in data["rows"])


def test_parse_ptxas_log():
    log = ("ptxas info    : Function properties for k\n    440 bytes stack frame, 620 bytes spill stores, "
           "544 bytes spill loads\nptxas info    : Used 255 registers, used 1 barriers\n")
    assert triton_aot.parse_ptxas_log(log) == {"registers": 255, "spill_stores": 620, "spill_loads": 544,
                                               "stack": 440}


def test_roofline_table_is_the_committed_one():
    from laplacianformer.bench import roofline

    data = json.loads((REPO_ROOT / "benchmarks" / "results" / "roofline_h100.json").read_text())
    assert data["rows"] == json.loads(json.dumps(roofline.cases())), \
        "rerun python -m laplacianformer.bench.roofline --write --publish"
    assert {r["kernel"] for r in data["rows"]} == {"kernel_fwd", "kernel_bwd", "ns_fwd", "ns_grad"}
    assert all(r["est_us"] > 0 for r in data["rows"])

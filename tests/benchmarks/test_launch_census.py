"""benchmarks/launch_census.py: the launch counter itself, and the ratchet on the launches of one Laplacian
attention layer per Tiny stage at 512² (``LAUNCH_BUDGET``, today's counts; issue 29's targets in ``TARGETS``).

On a CPU without a GPU: Triton's launchers record and skip (tests/benchmarks/test_launch_census.py never runs
a kernel). The whole-backbone counts are the benchmark's (``python -m benchmarks.launch_census``).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from benchmarks import launch_census as lc  # noqa: E402


@triton.jit
def _fill_kernel(OUT, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(OUT + offs, 1.0, mask=offs < n)


def test_counter_rule_and_skipped_launch():
    out = torch.zeros(100)
    x = torch.randn(4, 6)
    with lc.counting() as census:
        _fill_kernel[(triton.cdiv(100, 32),)](out, 100, BLOCK=32)
        _fill_kernel[lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),)](out, 100, BLOCK=64)
        torch.empty(8)                          # allocation: no launch
        y = x.view(6, 4).t().unsqueeze(0)       # views: no launch
        y = y.contiguous()                      # the copy: 1
        y = y.reshape(-1) + 1                   # reshape of a contiguous tensor is a view; add: 1
        z = torch.zeros(3)                      # fill: 1
        host = float(y.sum())                   # sum: 1, and a host read
    assert census.triton == [("_fill_kernel", (4,)), ("_fill_kernel", (2,))]
    assert (out == 0).all(), "the counted launch ran"
    assert sum(census.torch_ops.values()) == 4, census.torch_ops
    assert census.launches == 6 and sum(census.host_reads.values()) == 1
    assert z.shape == (3,) and host == pytest.approx(float(x.sum()) + 24)


def test_backends_forced_and_restored():
    from laplacianformer.ops import _runtime

    assert lc.triton_backends()["newton_schulz"] == "triton"
    flag = _runtime.triton_interpreted()
    with lc.counting():
        assert _runtime.triton_interpreted()
    assert _runtime.triton_interpreted() == flag


@pytest.fixture(scope="module")
def layer_rows():
    """Each Laplacian layer of Tiny at 512² (stage tokens 16384 / 4096 / 1024 / 256), inference and
    training, each counted three times (a warm-up, then two that must agree)."""
    return lc.layer_rows(attns=("laplacian",))


def test_layer_shapes_are_tiny_at_512(layer_rows):
    assert [(r["stage"], r["tokens"], r["heads"]) for r in layer_rows if r["mode"] == "infer"] == [
        (0, 16384, 1), (1, 4096, 2), (2, 1024, 5), (3, 256, 8)]


def test_layer_launches_within_budget(layer_rows):
    """The ratchet: no row above today's count (lower ``LAUNCH_BUDGET`` when a fused kernel lands)."""
    over = [(r["stage"], r["mode"], r["launches"], lc.LAUNCH_BUDGET[("laplacian", r["stage"], r["mode"])])
            for r in layer_rows if r["launches"] > lc.LAUNCH_BUDGET[("laplacian", r["stage"], r["mode"])]]
    assert not over, f"(stage, mode, launches, budget) over budget: {over}"
    assert all(r["host_reads"] == 0 for r in layer_rows), "a host read of device data in the attention layer"
    assert all(r["triton"] > 0 for r in layer_rows), "no Triton launch: the backends were not forced"


def test_layer_launches_meet_the_inference_target(layer_rows):
    """Issue 29's inference target (<= 8 launches per Laplacian layer) holds at every stage since DWConv(V) is
    fused into the streaming output pass and q, k come from one product (8 = 5 Triton + 3 linears)."""
    for r in layer_rows:
        if r["mode"] == "infer":
            assert r["launches"] <= lc.TARGETS["layer_infer"], (r["stage"], r["launches"])


def test_layer_launches_meet_the_training_target(layer_rows):
    """Issue 29's training target (<= 25 launches per Laplacian layer, forward and backward) holds at every stage
    since the fused training path (op ``fused_training``): 18 = 10 Triton (5 forward, 5 backward passes) + the
    qkv and output linears (2 forward, 6 backward: two products and a bias sum each)."""
    for r in layer_rows:
        if r["mode"] == "train":
            assert r["launches"] <= lc.TARGETS["layer_train"], (r["stage"], r["launches"])

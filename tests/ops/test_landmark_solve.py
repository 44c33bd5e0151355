"""The op ``landmark_solve`` (ops/streaming/landmarks.py): the landmarks, W and W⁺ of the core in one launch.

- the ``torch`` backend (``pool_landmarks`` + ``laplace_kernel`` + ``regularise`` + the reference iteration)
  equals the core's steps in float64 through the one dispatch point of ``attention_core``;
- the Triton kernel (marked ``triton``: CUDA, or TRITON_INTERPRET=1, which ``test_triton_suite_under_interpreter``
  sets in a subprocess) equals the float64 reference to float32 round-off on grids that are not multiples of the
  landmark grid, m = 49 and m < 49, d in {16, 32, 64}, every kernel family of the Triton profile (the Laplacian
  and the Gaussian on every grid, a case each for the others), several (batch, head) groups read through
  the strides of a permuted q; keeps the best iterate on ill-conditioned W as the reference does; runs the
  whole operator; every launch is in the AOT list;
- the registry's refusals, one per condition, and a training call, which never asks the op.
"""

from __future__ import annotations

import os
import re

import pytest
import torch

from laplacianformer import laplacian_attention
from laplacianformer.ops import _runtime, explain, use
from laplacianformer.ops.dispatch import BackendRefused
from laplacianformer.ops.kernel.limits import TRITON_KERNEL_IDS
from laplacianformer.ops.kernel_families import KERNEL_FAMILIES
from laplacianformer.ops.settings import AttentionSettings
from laplacianformer.ops.streaming.landmarks import LANDMARK_SOLVE, landmark_solve, landmark_solve_reference

TRITON_HERE = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif(not TRITON_HERE, reason="needs CUDA or TRITON_INTERPRET=1")


def _permuted_q(gen, b, h, n, d, dtype=torch.float32, scale=1.0):
    """q (B, H, N, d) as the layers hold it: a permuted (B, N, H, d) tensor (not contiguous)."""
    return (scale * torch.randn(b, n, h, d, generator=gen, dtype=dtype)).permute(0, 2, 1, 3)


def _rel(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


# --- the torch backend is the steps (float64) ------------------------------------------------------------


@pytest.mark.parametrize("kernel", ["laplacian", "gaussian"])
def test_reference_equals_the_steps(seeded, kernel):
    _, gen = seeded
    q, k, v = (_permuted_q(gen, 1, 2, 13 * 9, 16, torch.float64) for _ in range(3))
    kwargs = dict(hw=(13, 9), landmarks=(7, 7), kernel=kernel, return_stats=True)
    with use(landmark_solve="steps"):
        want, want_stats = laplacian_attention(q, k, v, **kwargs)
    with use(landmark_solve="torch"), _runtime.recording() as calls:
        got, stats = laplacian_attention(q, k, v, **kwargs)
    ops = [op for op, _, _ in calls]
    # the specification's own pooling and W calls, then the steps after the solve; no solver call
    assert ops[:4] == ["landmark_solve", "pooling", "kernel", "streaming"] and "newton_schulz" not in ops, ops
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(stats["residual"], want_stats["residual"], rtol=1e-8, atol=1e-12)


# --- the registry ----------------------------------------------------------------------------------------


def _inputs(gen, gh=6, gw=6, lh=3, lw=3, d=8, dtype=torch.float32, **settings):
    q = _permuted_q(gen, 1, 2, gh * gw, d, dtype)
    return q, q, q, (gh, gw), (lh, lw), AttentionSettings(head_dim=d, **settings), None, 0


def test_auto_runs_the_steps_on_the_cpu(seeded, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    _, gen = seeded
    inputs = _inputs(gen)
    assert landmark_solve(*inputs) is None
    text = explain("landmark_solve", *inputs)
    assert text.startswith("landmark_solve: selection 'auto' runs 'steps'"), text
    assert "triton: tensors on ['cpu'], not cuda" in text and "torch: not chosen automatically" in text, text
    with use(landmark_solve="triton"), pytest.raises(BackendRefused, match="not cuda"):
        landmark_solve(*inputs)
    q = inputs[0]
    report = __import__("laplacianformer").ops.explain_all(q, q, q, hw=(6, 6), landmarks=(3, 3))
    assert "] landmark_solve: selection 'auto' runs 'steps'" in report, report


def test_forced_backends_refuse_with_the_reason(seeded, monkeypatch):
    """One refusal per condition the op serves under, for both solve backends (the dtype, the device and Triton
    itself: ``triton`` only)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # CPU tensors pass the device check; no kernel runs here
    _, gen = seeded
    q, k, v, hw, grid, s, mask, prefix = _inputs(gen)
    cases = [
        ((q, k, v, hw, grid, s, torch.zeros(1, 36, dtype=torch.bool), 0), "a key_padding_mask"),
        ((q, k, v, hw, grid, s, None, 4), "4 prefix tokens"),
        ((q, k, v, None, 9, s, None, 0), "a 1-D sequence"),
        ((q, k, v, (torch.tensor(6), 6), grid, s, None, 0), "graph sizes"),
        ((q, k, v, hw, (torch.tensor(3), 3), s, None, 0), "graph sizes"),
        ((q, k, v, (4, 8), grid, s, None, 0), r"hw=\(4, 8\) is not a grid of the N=36 tokens"),
        ((q, k, v, hw, grid, AttentionSettings(head_dim=8, solver="cg"), None, 0), "solver 'cg'"),
        (_inputs(gen, gh=10, gw=10, lh=5, lw=13), r"m=65 > 64 \(the most the fused landmark solve kernels take; one on-chip block"),
        (_inputs(gen, d=129), r"d=129 > 128 \(the most the fused landmark solve kernels take"),
        ((q[:0], k[:0], v[:0], hw, grid, s, None, 0), "empty input"),
    ]
    for inputs, reason in cases:
        for backend in ("triton", "torch"):
            with use(landmark_solve=backend), pytest.raises(ValueError, match=reason):
                landmark_solve(*inputs)
            with use(landmark_solve=backend):
                text = explain("landmark_solve", *inputs)
            assert text.startswith(f"landmark_solve: selection '{backend}' refused") and re.search(reason, text), text
    f64 = _inputs(gen, dtype=torch.float64)
    with use(landmark_solve="triton"), pytest.raises(ValueError, match=r"dtype torch.float64 \(only float32, float16, bfloat16\)"):
        landmark_solve(*f64)
    with use(landmark_solve="torch"):
        assert landmark_solve(*f64) is not None  # the specification runs any dtype
    monkeypatch.setattr(_runtime, "triton_available", lambda: (False, "the triton package is not installed"))
    with use(landmark_solve="triton"), pytest.raises(ValueError, match="the triton package is not installed"):
        landmark_solve(q, k, v, hw, grid, s, mask, prefix)
    monkeypatch.delenv("TRITON_INTERPRET")
    with use(landmark_solve="triton"), pytest.raises(ValueError, match=r"tensors on \['cpu'\], not cuda"):
        landmark_solve(q, k, v, hw, grid, s, mask, prefix)
    with use(reference=True):
        assert landmark_solve(q, k, v, hw, grid, s, mask, prefix) is None  # the op's reference: the steps


def test_gradients_compile_and_modes_are_not_served(seeded, monkeypatch):
    """A call that may need a gradient or runs under torch.compile does not ask the registry (None, whatever is
    forced); the registry itself refuses a gradient, graph tracing and a dispatch mode; it serves a CUDA graph's
    stream capture (faked here: no GPU)."""
    from torch.utils.flop_counter import FlopCounterMode

    _, gen = seeded
    q, k, v, hw, grid, s, mask, prefix = _inputs(gen)
    v = v.detach().clone().requires_grad_(True)
    for backend in ("triton", "torch"):
        with use(landmark_solve=backend):
            assert landmark_solve(q, k, v, hw, grid, s) is None  # v needs a gradient: the steps run
            with pytest.raises(ValueError, match="requires grad: the fused landmark solve kernels run forward only"):
                LANDMARK_SOLVE(q, k, v, hw, grid, s, None, 0)
    with torch.no_grad(), use(landmark_solve="torch"):
        assert landmark_solve(q, k, v, hw, grid, s) is not None  # no gradient: served
    inputs = (q, k, q, hw, grid, s, None, 0)
    with FlopCounterMode(display=False), use(landmark_solve="torch"), \
            pytest.raises(ValueError, match="dispatch or function mode"):
        landmark_solve(*inputs)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert _runtime.capturing()
    with use(landmark_solve="torch"):
        assert landmark_solve(*inputs) is not None  # stream capture: served (no host synchronisation)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    with use(landmark_solve="torch"):
        assert landmark_solve(*inputs) is None  # torch.compile traces the steps' ops
        with pytest.raises(ValueError, match="torch.compile is tracing"):
            LANDMARK_SOLVE(*inputs)


def test_training_call_runs_the_steps(seeded):
    """With a gradient the core pools and solves by its steps even with a solve backend forced, and the
    gradients are the steps'."""
    _, gen = seeded
    q, k, v = (_permuted_q(gen, 1, 2, 36, 8).detach().requires_grad_(True) for _ in range(3))
    kwargs = dict(hw=(6, 6), landmarks=(3, 3))
    with use(landmark_solve="torch"):
        text = __import__("laplacianformer").ops.explain_all(q, k, v, **kwargs)
        out = laplacian_attention(q, k, v, **kwargs)
    assert "landmark_solve" not in text and "] pooling: selection 'auto'" in text, text
    with use(landmark_solve="steps"):
        want = laplacian_attention(q, k, v, **kwargs)
    for a, b in zip(torch.autograd.grad(out.sum(), (q, k, v)), torch.autograd.grad(want.sum(), (q, k, v))):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


# --- the Triton kernel (CUDA, or the interpreter) ----------------------------------------------------------

# (b, h, token grid, landmark grid, d, kernel): grids not multiples of the landmark grid, the identity pooling,
# thin grids, m = 49 and m < 49, d in {16, 32, 64}
TRITON_CASES = [
    (1, 2, (13, 9), (7, 7), 32, "laplacian"),
    (2, 1, (7, 3), (7, 3), 16, "gaussian"),
    (1, 1, (8, 8), (4, 4), 64, "laplacian"),
    (1, 1, (10, 11), (7, 7), 64, "gaussian"),
    (2, 2, (1, 40), (1, 9), 16, "laplacian"),
    (1, 2, (30, 2), (6, 2), 16, "gaussian"),
] + [(1, 1, (8, 6), (4, 3), 20, spec.name) for spec in KERNEL_FAMILIES.values()
     if spec.id in TRITON_KERNEL_IDS and not spec.exp_of_accumulation]


@pytest.mark.triton
@needs_triton
@pytest.mark.parametrize("case", TRITON_CASES, ids=lambda c: f"{c[2][0]}x{c[2][1]}-to-{c[3][0]}x{c[3][1]}-d{c[4]}-{c[5]}")
def test_triton_equals_the_float64_reference(nan_empty, seeded, case):
    from laplacianformer.ops.streaming.landmarks_triton import landmark_solve_triton

    seed, gen = seeded
    b, h, hw, grid, d, kernel = case
    s = AttentionSettings(head_dim=d, kernel=kernel)
    q = _permuted_q(gen, b, h, hw[0] * hw[1], d)
    got = landmark_solve_triton(q.to(DEVICE), hw, grid, s.bandwidth, kernel, s.ns_eps, s.iters)
    want = landmark_solve_reference(q.double(), hw, grid, s.bandwidth, kernel, s.ns_eps, s.iters)
    m = grid[0] * grid[1]
    for t, shape in zip(got, [(b, h, m, d), (b, h, m, m), (b, h, m, m)]):
        assert t.shape == shape and t.dtype == torch.float32 and t.is_contiguous()
    cond = torch.linalg.cond(want[1] + s.ns_eps * torch.eye(m, dtype=torch.float64)).max().item()
    errors = [_rel(g.cpu(), w) for g, w in zip(got, want)]
    assert cond < 1e3 and errors[0] < 1e-6 and errors[1] < 1e-6 and errors[2] < 1e-5, (
        f"seed {seed}: relative errors of L, W, W⁺ {errors}, condition of P {cond:.3g}")


def _ill_conditioned_heads(gen, scales, gh=8, gw=8, d=16):
    """q (1, H, N, d), head i scaled by scales[i]: pooled landmarks closer together, W worse conditioned."""
    q = _permuted_q(gen, 1, len(scales), gh * gw, d)
    return q * torch.tensor(scales)[None, :, None, None]


@pytest.mark.triton
@needs_triton
@pytest.mark.parametrize("kernel,scales", [("gaussian", [0.3, 0.1, 0.05, 0.035]),
                                            ("laplacian", [0.1, 0.03, 0.01, 0.003])])
def test_keep_best_on_ill_conditioned_w(nan_empty, seeded, kernel, scales):
    """eps = 0, W of condition about 1e3 .. 1e6 (Gaussian) or 1e3 .. 4e4 (Laplacian), one head each, one launch, 7
    and 40 steps: the iteration
    stalls at a rounding floor and the kernel, like the reference in float32, keeps its best checked iterate:
    finite, residual ||I − W W⁺||_F the reference's up to that floor, iterates equal to float32 rounding
    amplified by the conditioning."""
    from laplacianformer.ops.streaming.landmarks_triton import landmark_solve_triton

    seed, gen = seeded
    q = _ill_conditioned_heads(gen, scales)
    bandwidth = AttentionSettings(head_dim=16, kernel=kernel).bandwidth
    w64 = landmark_solve_reference(q.double(), (8, 8), (4, 4), bandwidth, kernel, 0.0, 1)[1][0]
    conds = torch.linalg.cond(w64)
    assert conds.min() > 1e2 and conds.max() < 1e7, conds  # about 1e3 .. 1e6 (the seed moves them)
    for iters in (7, 40):
        _, w, w_inv = (t.cpu() for t in landmark_solve_triton(q.to(DEVICE), (8, 8), (4, 4), bandwidth, kernel, 0.0,
                                                               iters))
        _, w_ref, w_inv_ref = landmark_solve_reference(q, (8, 8), (4, 4), bandwidth, kernel, 0.0, iters)
        assert torch.isfinite(w_inv).all(), f"seed {seed}: {iters} steps: non-finite"
        eye = torch.eye(16, dtype=torch.float64)
        res = torch.linalg.matrix_norm(eye - w[0].double() @ w_inv[0].double())
        res_ref = torch.linalg.matrix_norm(eye - w_ref[0].double() @ w_inv_ref[0].double())
        assert ((res - res_ref).abs() <= 0.5 * res_ref + 1e-3).all(), (
            f"seed {seed}: {iters} steps: residual {res.tolist()} vs reference {res_ref.tolist()}")
        err = torch.tensor([_rel(a, b) for a, b in zip(w_inv[0], w_inv_ref[0])], dtype=torch.float64)
        assert (err < 1e-6 * conds + 1e-4).all(), f"seed {seed}: {iters} steps: rel err {err.tolist()}"


@pytest.mark.triton
@needs_triton
@pytest.mark.parametrize("streaming", ["steps", "triton"])
def test_triton_runs_the_whole_operator(seeded, streaming):
    """laplacian_attention with the fused solve forced against the steps (13×9 tokens, 7×7 landmarks, two heads,
    K ≠ Q, permuted q, k, v), with the step path after it and with the streaming passes: the solve replaces the
    pooling, W and the solver calls, and the outputs agree to float32 round-off."""
    seed, gen = seeded
    q, k, v = (_permuted_q(gen, 1, 2, 117, 16).to(DEVICE) for _ in range(3))
    kwargs = dict(hw=(13, 9), landmarks=(7, 7), return_stats=True)
    with use(landmark_solve="steps", streaming=streaming):
        want, want_stats = laplacian_attention(q, k, v, **kwargs)
    with use(landmark_solve="triton", streaming=streaming), _runtime.recording() as calls:
        got, stats = laplacian_attention(q, k, v, **kwargs)
    ops = [op for op, _, _ in calls]
    assert ops[0] == "landmark_solve" and not {"pooling", "newton_schulz"} & set(ops), ops
    assert "runs 'triton'" in calls[0][2].splitlines()[0]
    assert stats["landmarks"] == 49 and (stats["residual"] < 1e-3).all(), stats
    err = ((got - want).abs().max() / want.abs().max()).item()
    assert err < 1e-5, f"seed {seed}: largest difference {err:.2e} relative to the largest output"


@pytest.mark.triton
@needs_triton
def test_every_launch_is_enumerated_for_the_aot_check(seeded, record_launches):
    """Each launch of ``landmark_solve_triton`` (constexprs, warps, stages) is among ``aot_specialisations``, the
    list benchmarks/triton_aot.py compiles and checks for spills."""
    from laplacianformer.ops.streaming import landmarks_triton as lt

    enumerated = record_launches.enumerated(lt.aot_specialisations())
    launched = record_launches(lt, "landmark_solve_kernel")
    _, gen = seeded
    for hw, grid, d, kernel in [((9, 9), (7, 7), 24, "laplacian"), ((6, 6), (2, 3), 16, "gaussian")]:
        lt.landmark_solve_triton(_permuted_q(gen, 1, 1, hw[0] * hw[1], d).to(DEVICE), hw, grid, 4.0, kernel, 0.01, 3)
    assert len(launched) == 2 and set(launched) <= enumerated, set(launched) - enumerated


def test_triton_suite_under_interpreter(triton_interpreter):
    if TRITON_HERE:
        pytest.skip("the Triton tests run in this process")
    pytest.importorskip("triton")
    triton_interpreter("tests/ops/test_landmark_solve.py", timeout=300.0)

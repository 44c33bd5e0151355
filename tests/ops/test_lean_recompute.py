"""The lean recompute (``ops/recompute.py``, docs/DESIGN.md §5.5) against the plain operator: values and every
gradient (x, v, projection weights and biases) in float64 for each norm, kernel, solver, backward and
backend it serves, with and without a key padding mask; what it keeps for the backward; the saving forms of
the normalisation backends; the op ``recompute`` and its refusals.

The Triton test is marked ``triton``: it runs on CUDA, and on a CPU machine
``test_triton_under_interpreter`` reruns it under TRITON_INTERPRET=1 in a subprocess.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from laplacianformer import ops
from laplacianformer.ops import laplacian_attention, laplacian_attention_recompute
from laplacianformer.ops.normalization import normalize_nystrom, normalize_nystrom_grad, normalize_nystrom_saving
from laplacianformer.ops.recompute import lean_refusal, recompute_attention

TRITON_HERE = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
TOL = dict(rtol=1e-10, atol=1e-10)

CONFIGS = {
    "default": {},
    "tie_qk": dict(tie=True),
    "inline": dict(norm="inline"),
    "rowsum": dict(norm="rowsum"),
    "injective_nomean": dict(norm="injective_nomean"),
    "none": dict(norm="none"),
    "none_tied": dict(norm="none", tie=True),
    "gaussian": dict(kernel="gaussian"),
    "gaussian_tied_inline": dict(kernel="gaussian", tie=True, norm="inline"),
    "cg": dict(solver="cg", iters=8),
    "exact_solver": dict(solver="exact"),
    "unrolled": dict(ns_backward="unrolled", iters=6),
    "lam_scale": dict(lam=2.5, qk_scale=0.7),
    "no_bias": dict(bias=False),
}


def _inputs(gen, b=2, n=36, c=16, heads=2, tie=False, bias=True):
    x = torch.randn(b, n, c, generator=gen, dtype=torch.float64)
    v = torch.randn(b, heads, n, c // heads, generator=gen, dtype=torch.float64)
    wq = torch.randn(c, c, generator=gen, dtype=torch.float64) / c**0.5
    bq = torch.randn(c, generator=gen, dtype=torch.float64) if bias else None
    wk = None if tie else torch.randn(c, c, generator=gen, dtype=torch.float64) / c**0.5
    bk = None if tie or not bias else torch.randn(c, generator=gen, dtype=torch.float64)
    return [None if t is None else t.requires_grad_() for t in (x, v, wq, bq, wk, bk)]


def _heads(t, heads):
    b, n, c = t.shape
    return t.view(b, n, heads, c // heads).transpose(1, 2)


def _plain(x, v, wq, bq, wk, bk, heads, **kw):
    q = _heads(F.linear(x, wq, bq), heads)
    k = q if wk is None else _heads(F.linear(x, wk, bk), heads)
    return laplacian_attention(q, k, v, **kw)


def _check(inputs, heads, probe, **kw):
    """Values and gradients of every input that requires grad: lean vs plain."""
    leaves = [t for t in inputs if t is not None and t.requires_grad]
    lean = laplacian_attention_recompute(*inputs, num_heads=heads, **kw)
    plain = _plain(*inputs, heads, **kw)
    torch.testing.assert_close(lean, plain, **TOL)
    got = torch.autograd.grad(lean, leaves, probe)
    want = torch.autograd.grad(plain, leaves, probe)
    for i, (a, b) in enumerate(zip(got, want)):
        torch.testing.assert_close(a, b, **TOL, msg=lambda m: f"gradient of input {i}: {m}")


@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_lean_equals_plain_values_and_gradients(seeded, name, masked):
    cfg = dict(CONFIGS[name])
    tie, bias = cfg.pop("tie", False), cfg.pop("bias", True)
    _, gen = seeded
    inputs = _inputs(gen, tie=tie, bias=bias)
    kw = dict(cfg)
    if masked:  # masks take 1-D sequences with pooled landmarks (docs/DESIGN.md §2.5)
        mask = torch.zeros(2, 36, dtype=torch.bool)
        mask[0, 29:] = True
        mask[1, :3] = True
        kw.update(hw=None, landmarks=5, key_padding_mask=mask)
    else:
        kw.update(hw=(6, 6), landmarks=(2, 3))
    probe = torch.randn(2, 2, 36, 8, generator=gen, dtype=torch.float64)
    _check(inputs, 2, probe, **kw)


@pytest.mark.parametrize("normalization", ["cpu", "fused", "composite"])
@pytest.mark.parametrize("norm", ["injective", "inline"])
@pytest.mark.parametrize("kernel_backend", ["auto", "composite"])
def test_lean_equals_plain_on_each_backend(seeded, normalization, norm, kernel_backend):
    from laplacianformer.ops.normalization import cpu as normalization_cpu

    if normalization == "cpu" and not normalization_cpu.available():
        pytest.skip("no C compiler")
    _, gen = seeded
    inputs = _inputs(gen, b=1, n=70, c=24, heads=3)
    probe = torch.randn(1, 3, 70, 8, generator=gen, dtype=torch.float64)
    with ops.use(normalization=normalization, kernel=kernel_backend):
        _check(inputs, 3, probe, hw=(7, 10), landmarks=(3, 4), norm=norm)


def test_only_some_inputs_require_grad(seeded):
    """Frozen projections (only x, v), or only the weights: the gradients asked for, None elsewhere."""
    _, gen = seeded
    x, v, wq, bq, wk, bk = _inputs(gen)
    probe = torch.randn(2, 2, 36, 8, generator=gen, dtype=torch.float64)
    kw = dict(hw=(6, 6), landmarks=(2, 2))
    for frozen in ([wq, bq, wk, bk], [x, v]):
        inputs = [t.detach().requires_grad_(all(t is not f for f in frozen)) for t in (x, v, wq, bq, wk, bk)]
        _check(inputs, 2, probe, **kw)


def test_second_backward_and_float32(seeded):
    _, gen = seeded
    inputs = _inputs(gen)
    out = laplacian_attention_recompute(*inputs, num_heads=2, hw=(6, 6), landmarks=(2, 2))
    leaves = [t for t in inputs if t is not None]
    probe = torch.randn_like(out)
    first = torch.autograd.grad(out, leaves, probe, retain_graph=True)
    for a, b in zip(first, torch.autograd.grad(out, leaves, probe)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    single = [t.detach().float().requires_grad_() for t in leaves]
    lean = laplacian_attention_recompute(*single, num_heads=2, hw=(6, 6), landmarks=(2, 2))
    plain = _plain(*single, 2, hw=(6, 6), landmarks=(2, 2))
    assert lean.dtype == torch.float32
    torch.testing.assert_close(lean, plain)
    # float32 gradients: the lean path's error against the float64 gradients (``first``, equal to the plain
    # operator's in float64 by the tests above) stays of the order of the plain float32 path's own rounding
    # error (a fixed absolute tolerance failed once at 1.14e-5 for gradients of norm ~10)
    got = torch.autograd.grad(lean, single, probe.float())
    ref = torch.autograd.grad(plain, single, probe.float())
    for a, b, truth in zip(got, ref, first):
        lean_err = (a.double() - truth).abs().max().item()
        plain_err = (b.double() - truth).abs().max().item()
        scale = truth.abs().max().item()
        assert lean_err <= 4 * plain_err + 1e-6 * scale, (lean_err, plain_err, scale)


def _saved(fn):
    """The tensors autograd keeps for the backward of ``fn()``: {storage pointer: (largest view's numel, bytes)}."""
    kept = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        kept[ptr] = (max(t.numel(), kept.get(ptr, (0, 0))[0]), t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return kept, out


def test_lean_keeps_no_token_by_landmark_tensor():
    """Besides x, v and the weights the lean Function keeps only landmark-sized tensors and per-token
    statistics (no N×m, no q or k); the plain operator keeps several N×m tensors and q, k."""
    gen = torch.Generator().manual_seed(1)
    n, c, heads, m = 24 * 24, 32, 2, 16
    x, v, wq, bq, wk, bk = _inputs(gen, b=1, n=n, c=c, heads=heads)
    inputs = (x, v, wq, bq, wk, bk)
    inputs_ptrs = {t.untyped_storage().data_ptr() for t in inputs}
    kw = dict(hw=(24, 24), landmarks=(4, 4))
    for backend in ("auto", "fused", "composite"):
        with ops.use(normalization=backend):
            lean, _ = _saved(lambda: laplacian_attention_recompute(*inputs, num_heads=heads, **kw))
        others = {p: s for p, s in lean.items() if p not in inputs_ptrs}
        largest = max(numel for numel, _ in others.values())
        assert largest <= 2 * heads * n, (backend, largest)  # one or two values per key, never m per key
        assert sum(nbytes for _, nbytes in others.values()) < heads * n * m * 8 / 2, backend
    plain, _ = _saved(lambda: _plain(*inputs, heads, **kw))
    big = [p for p, (numel, _) in plain.items() if p not in inputs_ptrs and numel >= heads * n * m]
    assert len(big) >= 2  # C_q, C_k (and the normalisation's scratch)


def test_normalization_saving_forms_equal_autograd(seeded):
    """Each backend's (saving, grad) pair gives what its autograd gives, and keeps no (N, m) tensor."""
    from laplacianformer.ops.normalization import cpu as normalization_cpu

    _, gen = seeded
    n, m, e = 200, 6, 5
    c = torch.rand(2, 3, n, m, generator=gen, dtype=torch.float64)
    k = torch.rand(2, 3, n, m, generator=gen, dtype=torch.float64)
    v = torch.randn(2, 3, n, e, generator=gen, dtype=torch.float64)
    w = torch.randn(2, 3, m, m, generator=gen, dtype=torch.float64) / m
    probe = torch.randn(2, 3, n, e, generator=gen, dtype=torch.float64)
    backends = ["fused", "composite"] + (["cpu"] if normalization_cpu.available() else [])
    for backend in backends:
        for norm in ("injective", "inline") if backend != "composite" else ("injective", "rowsum", "none"):
            leaves = [t.clone().requires_grad_() for t in (c, k, v, w)]
            with ops.use(normalization=backend):
                ref = normalize_nystrom(leaves[0], leaves[1], leaves[2], norm, w_inv=leaves[3])
                out, name, saved = normalize_nystrom_saving(c, k, v, norm, w_inv=w)
            assert name == backend and not out.requires_grad
            # per (batch, head): statistics of size m², m·e or one value per key, all well under one N×m tensor
            assert all(t.numel() / 6 <= max(2 * n, 2 * m * m + 2 * m * e + 2 * (m + e)) for t in saved), backend
            torch.testing.assert_close(out, ref, rtol=0, atol=0)
            want = torch.autograd.grad(ref, leaves, probe, allow_unused=True)
            got = normalize_nystrom_grad(name, probe, saved, c, k, v, norm, w_inv=w)
            d_c, d_k, d_w, d_v = got
            for label, a, b in zip(("c", "k", "v", "w"), (d_c, d_k, d_v, d_w), want):
                if b is None:
                    assert a is None or a.abs().max() == 0
                else:
                    torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12,
                                               msg=lambda s: f"{backend} {norm} d{label}: {s}")


def test_recompute_op_refusals_and_forcing():
    gen = torch.Generator().manual_seed(2)
    x, v, wq, bq, wk, bk = _inputs(gen)
    settings = ops.AttentionSettings(8, landmarks=(2, 2))
    projections = (wq, bq, wk, bk)
    assert "runs 'lean'" in ops.explain("recompute", x, v, projections, settings, (6, 6), None, None)
    exact = ops.AttentionSettings(8, landmarks=None)
    assert "exact kernel" in ops.explain("recompute", x, v, projections, exact, (6, 6), None, None)
    assert lean_refusal(x, (6, 6), exact).startswith("exact kernel")
    assert lean_refusal(x, (6, 6), settings) is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert lean_refusal(x, (6, 6), settings).startswith("autocast")
    with pytest.raises(ValueError, match="^landmarks: the lean recompute needs pooled landmarks"):
        laplacian_attention_recompute(x, v, wq, bq, wk, bk, num_heads=2, hw=(6, 6), landmarks=None)
    probe = torch.randn(2, 2, 36, 8, generator=gen, dtype=torch.float64)
    leaves = [x, v, wq, bq, wk, bk]
    grads = {}
    for choice in ("lean", "checkpoint"):
        with ops.use(recompute=choice):
            out = recompute_attention(x, v, projections, settings, hw=(6, 6))
        grads[choice] = torch.autograd.grad(out, leaves, probe)
    want = torch.autograd.grad(_plain(x, v, wq, bq, wk, bk, 2, hw=(6, 6), landmarks=(2, 2)), leaves, probe)
    for a, b, c in zip(grads["lean"], grads["checkpoint"], want):
        torch.testing.assert_close(a, b, **TOL)
        torch.testing.assert_close(b, c, **TOL)
    with ops.use(recompute="lean"), pytest.raises(ValueError, match="cannot run this recompute call: exact kernel"):
        recompute_attention(x, v, projections, exact, hw=(6, 6))


def test_recompute_takes_settings_or_their_keywords_and_refuses_unknown_names():
    gen = torch.Generator().manual_seed(4)
    x, v, wq, bq, wk, bk = _inputs(gen)
    kw = dict(num_heads=2, hw=(6, 6))
    by_keywords = laplacian_attention_recompute(x, v, wq, bq, wk, bk, landmarks=(2, 2), lam=2.0, **kw)
    settings = ops.AttentionSettings(8, landmarks=(2, 2), lam=2.0)
    torch.testing.assert_close(laplacian_attention_recompute(x, v, wq, bq, wk, bk, settings=settings, **kw),
                               by_keywords, rtol=0, atol=0)
    with pytest.raises(TypeError, match="lamda"):
        laplacian_attention_recompute(x, v, wq, bq, wk, bk, lamda=2.0, **kw)
    with pytest.raises(TypeError, match="^settings: given together with the operator keywords \\['lam'\\]"):
        laplacian_attention_recompute(x, v, wq, bq, wk, bk, settings=settings, lam=2.0, **kw)


# --- Triton (marked; CUDA or TRITON_INTERPRET=1) ---


@pytest.mark.triton
@pytest.mark.skipif(not TRITON_HERE, reason="needs CUDA or TRITON_INTERPRET=1")
@pytest.mark.parametrize("norm", ["injective", "inline"])
def test_lean_with_triton_normalization(seeded, norm):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    _, gen = seeded
    inputs = [None if t is None else t.detach().to(device).requires_grad_() for t in _inputs(gen, n=30)]
    probe = torch.randn(2, 2, 30, 8, generator=gen, dtype=torch.float64).to(device)
    with ops.use(normalization="triton"):
        _check(inputs, 2, probe, hw=(5, 6), landmarks=(2, 2), norm=norm)


def test_triton_under_interpreter(triton_interpreter):
    if TRITON_HERE:
        pytest.skip("the Triton test runs in this process")
    pytest.importorskip("triton")
    triton_interpreter("tests/ops/test_lean_recompute.py", timeout=600.0)

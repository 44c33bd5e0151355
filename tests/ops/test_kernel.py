"""Kernel primitives: the fast CPU path against the naive reference (float64 values + gradcheck, with and
without the C loops), forcing a backend (``ops.use``), ``ops.explain``, fallback logging and torch.compile.
Random inputs come from the fixed, printed seeds of the ``seeded`` fixture (tests/ops/conftest.py)."""

from __future__ import annotations

import logging

import pytest
import torch

from laplacianformer.ops import kernel as K
from laplacianformer.ops.kernel import cpu as kcpu
from laplacianformer.ops import _runtime, explain, use
from laplacianformer.ops.kernel import native
from laplacianformer.ops.kernel_families import code_path_representatives, kernel_names, kernel_spec

KINDS = list(kernel_names())


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.fixture(params=["native", "torch"])
def loops(request, monkeypatch):
    """Runs a test with the C loops and with the chunked PyTorch fallback."""
    if request.param == "native":
        if native.load() is None:
            pytest.skip(f"C loops unavailable: {native.load_error()}")
    else:
        monkeypatch.setattr(kcpu, "_use_native", lambda x: False)
    return request.param


@pytest.mark.parametrize("kind", KINDS)
def test_cpu_path_gradcheck(loops, kind, seeded):
    seed, gen = seeded
    x = torch.randn(2, 13, 5, dtype=torch.float64, generator=gen).requires_grad_()
    y = torch.randn(2, 7, 5, dtype=torch.float64, generator=gen).requires_grad_()
    v = torch.randn(2, 7, 3, dtype=torch.float64, generator=gen).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: kcpu.laplace_kernel_cpu(a, b, 2.0, kind), (x, y)), seed
    assert torch.autograd.gradcheck(lambda a, b, c: kcpu.laplace_kernel_matmul_cpu(a, b, c, 2.0, kind), (x, y, v)), seed


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_cpu_path_matches_naive(nan_empty, loops, kind, dtype, seeded):
    """Ragged sizes, (B, H, N, d) inputs, values and all gradients; outputs start NaN-filled."""
    seed, gen = seeded
    x, y, v = (torch.randn(2, 3, k, c, generator=gen, dtype=torch.float64) * 0.4 for k, c in ((67, 9), (19, 9), (19, 5)))
    grads = {}
    for name in ("cpu", "naive"):
        ins = [t.to(dtype if name == "cpu" else torch.float64).requires_grad_() for t in (x, y, v)]
        with use(kernel=name):
            c = K.laplace_kernel(ins[0], ins[1], 3.0, kind)
            o = K.laplace_kernel_matmul(*ins, 3.0, kind)
        (c.sum() + (o * o).sum()).backward()
        grads[name] = [c, o] + [t.grad for t in ins]
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    for label, a, b in zip(["C", "out", "dx", "dy", "dv"], grads["cpu"], grads["naive"]):
        assert torch.isfinite(a).all(), f"seed {seed}: {label} not finite"
        assert _rel(a, b) < tol, f"seed {seed}: {label} rel err {_rel(a, b):.2e}"


def test_sign_zero_gives_zero_gradient(loops):
    """x_nd == y_md contributes no L1 gradient (sign(0) = 0), like the naive reference's autograd."""
    x = torch.tensor([[[0.5, -1.0, 2.0]]], dtype=torch.float64, requires_grad=True)
    y = torch.tensor([[[0.5, -1.0, 2.0], [1.5, -1.0, 0.0]]], dtype=torch.float64, requires_grad=True)
    kcpu.laplace_kernel_cpu(x, y, 1.0).sum().backward()
    gx, gy = x.grad.clone(), y.grad.clone()
    x.grad = y.grad = None
    K.laplace_kernel_naive(x, y, 1.0).sum().backward()
    assert torch.equal(gx, x.grad) and torch.equal(gy, y.grad)
    assert gx[0, 0, 1] == 0 and gy[0, 0].abs().sum() == 0


def test_backend_selection_and_explain():
    x = torch.randn(1, 2, 30, 8)
    assert _runtime.choice("kernel") == "auto"
    with use(kernel="composite"):
        assert _runtime.choice("kernel") == _runtime.choice("kernel_matmul") == "composite"
        with use(kernel="naive"):
            assert "runs 'naive'" in explain("kernel", x, x, 4.0, "laplacian")
        assert _runtime.choice("kernel") == "composite"
    assert _runtime.choice("kernel") == "auto"
    text = explain("kernel_matmul", x, x, x, 4.0, "laplacian")
    # why Triton is not used here: no CUDA tensor, or (CPU-only torch builds) no triton package at all
    assert text.startswith("kernel_matmul: selection 'auto'") and "triton:" in text
    assert "cuda" in text or "triton package is not installed" in text, text
    with pytest.raises(ValueError, match="^kernel: expected one of"):
        with use(kernel="fast"):
            pass
    with use(kernel="cpu"), pytest.raises(ValueError, match="^backend: 'cpu' cannot run this kernel call: dtype"):
        K.laplace_kernel(x.half(), x.half())


def test_triton_refused_on_cpu_without_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    x = torch.randn(1, 30, 8)
    with use(kernel="triton"), pytest.raises(ValueError, match="^backend: 'triton' cannot run this kernel call: tensors on \\['cpu'\\], not cuda"):
        K.laplace_kernel(x, x)


def test_fallback_logged_once(caplog, monkeypatch):
    _runtime.forget_logged()
    x = torch.randn(1, 10, 4, dtype=torch.float16)
    with caplog.at_level(logging.INFO, logger="laplacianformer.ops.kernel"):
        K.laplace_kernel(x, x)
        K.laplace_kernel(x, x)
    records = [r for r in caplog.records if "falling back" in r.getMessage()]
    assert len(records) == 1 and "float16" in records[0].getMessage()


def test_onnx_export_uses_composite(monkeypatch):
    monkeypatch.setattr(torch.onnx, "is_in_onnx_export", lambda: True)
    x = torch.randn(1, 10, 4)
    assert "runs 'composite'" in explain("kernel", x, x, 4.0, "laplacian")
    assert "onnx" in explain("kernel", x, x, 4.0, "laplacian")


def test_cpu_path_compiles_without_graph_breaks():
    x = torch.randn(2, 40, 8, requires_grad=True)
    y = torch.randn(2, 9, 8)
    v = torch.randn(2, 9, 4)

    def f(a):
        return (K.laplace_kernel(a, y).sum() + K.laplace_kernel_matmul(a, y, v).sum())

    with use(kernel="cpu"):
        out = torch.compile(f, fullgraph=True, backend="aot_eager")(x)
        out.backward()
    with use(kernel="naive"):
        xr = x.detach().requires_grad_()
        ref = f(xr)
        ref.backward()
    assert torch.allclose(out, ref, rtol=1e-5) and torch.allclose(x.grad, xr.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("kind", code_path_representatives())
def test_cpu_matmul_row_chunks(nan_empty, loops, kind, monkeypatch, seeded):
    """Several row chunks with a ragged last one give the same values and gradients as one chunk."""
    monkeypatch.setattr(kcpu, "_MATMUL_CHUNK_ELEMS", 3 * 11 * 4)
    seed, gen = seeded
    x = torch.randn(3, 37, 5, dtype=torch.float64, generator=gen).requires_grad_()
    y = torch.randn(3, 11, 5, dtype=torch.float64, generator=gen).requires_grad_()
    v = torch.randn(3, 11, 4, dtype=torch.float64, generator=gen).requires_grad_()
    assert len(kcpu._row_chunks(3, 37, 11)) == 10
    assert torch.autograd.gradcheck(lambda a, b, c: kcpu.laplace_kernel_matmul_cpu(a, b, c, 2.0, kind), (x, y, v)), seed


def _native_or_skip():
    if native.load() is None:
        pytest.skip(f"C loops unavailable: {native.load_error()}")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("n,m,d", [(1, 1, 1), (3, 15, 3), (5, 16, 64), (3, 17, 64), (5, 49, 64), (1, 130, 3),
                                   (5, 130, 64), (9, 49, 40), (4, 7, 17), (3, 1, 64), (5, 9, 64), (8, 33, 1),
                                   (6, 20, 112), (2, 49, 32)])
def test_native_loops_odd_sizes(nan_empty, kind, dtype, n, m, d, seeded):
    """The C loops' forward and backward at sizes around the vector width (m, d not multiples of 16, row
    remainders) against the float64 reference, sign(0) = 0 included (some y rows equal some x rows)."""
    _native_or_skip()
    seed, gen = seeded
    x = torch.randn(2, n, d, dtype=torch.float64, generator=gen)
    y = torch.randn(2, m, d, dtype=torch.float64, generator=gen)
    y[:, : min(n, m)] = x[:, : min(n, m)]
    y[:, -1, 0] = x[:, 0, 0]
    g = torch.randn(2, n, m, dtype=torch.float64, generator=gen)
    c = torch.rand(2, n, m, dtype=torch.float64, generator=gen)
    x, y, g, c = (t.to(dtype).double() for t in (x, y, g, c))
    l1 = kernel_spec(kind).l1
    diff = x.unsqueeze(-2) - y.unsqueeze(-3)
    ref = (diff.abs() if l1 else diff.square()).sum(-1) * -0.7
    s = (diff.sign() if l1 else 2 * diff) * (g * c * -0.7).unsqueeze(-1)
    rdx, rdy = s.sum(-2), -s.sum(-3)
    out = native.pairwise_distance_native(x.to(dtype), y.to(dtype), l1, -0.7)
    dx, dy = native.pairwise_distance_grad_native(
        x.to(dtype), y.to(dtype), g.to(dtype), c.to(dtype), -0.7, l1)
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    for label, a, b in (("D", out, ref), ("dx", dx, rdx), ("dy", dy, rdy)):
        assert a.dtype == dtype and torch.isfinite(a).all(), f"seed {seed}: {label}"
        assert torch.allclose(a.double(), b, rtol=tol, atol=tol * b.abs().max().item()), f"seed {seed}: {label}"
    dx1, _ = native.pairwise_distance_grad_native(x.to(dtype), y.to(dtype), g.to(dtype), None, -0.7, l1)
    s1 = (diff.sign() if l1 else 2 * diff) * (g * -0.7).unsqueeze(-1)
    assert torch.allclose(dx1.double(), s1.sum(-2), rtol=tol, atol=tol * s1.abs().max().item()), seed


@pytest.mark.parametrize("kind", KINDS)
def test_native_loops_strided_x(nan_empty, kind, seeded):
    """x as a column slice of a wider tensor (row stride > d) and a row slice, y a column slice too: the
    same values and gradients as contiguous copies, bit for bit, and no copy of x is needed."""
    _native_or_skip()
    seed, gen = seeded
    l1 = kernel_spec(kind).l1
    for dtype in (torch.float64, torch.float32):
        qk = torch.randn(3, 37, 2 * 20, dtype=dtype, generator=gen)
        x = qk[..., 20:]
        y = torch.randn(3, 11, 2 * 20, dtype=dtype, generator=gen)[..., :20]
        g = torch.randn(3, 37, 11, dtype=dtype, generator=gen)
        c = torch.rand(3, 37, 11, dtype=dtype, generator=gen)
        ref = native.pairwise_distance_native(x.contiguous(), y.contiguous(), l1, 0.3)
        assert torch.equal(native.pairwise_distance_native(x, y, l1, 0.3), ref), seed
        rdx, rdy = native.pairwise_distance_grad_native(x.contiguous(), y.contiguous(), g, c, 0.3, l1)
        dx, dy = native.pairwise_distance_grad_native(x, y, g, c, 0.3, l1)
        assert torch.equal(dx, rdx) and torch.equal(dy, rdy), seed
        wide = torch.full((3, 37, 25), float("nan"), dtype=dtype)
        dxv, _ = native.pairwise_distance_grad_native(x, y, g, c, 0.3, l1, dx=wide[..., 2:22])
        assert torch.equal(dxv, rdx) and wide[..., :2].isnan().all() and wide[..., 22:].isnan().all(), seed
        rows = x[:, 5:30]
        assert torch.equal(native.pairwise_distance_native(rows, y, l1, 0.3), ref[:, 5:30]), seed


@pytest.mark.parametrize("kind", code_path_representatives())
def test_cpu_path_strided_inputs(nan_empty, kind, monkeypatch, seeded):
    """q, k as column slices of one projection output (float64): the custom ops pass them without a copy
    and give the naive reference's values and gradients; gradcheck through the slices."""
    _native_or_skip()
    seed, gen = seeded
    copies = []
    real = native.last_dim_contiguous
    monkeypatch.setattr(native, "last_dim_contiguous", lambda t: copies.append(real(t) is not t) or real(t))
    qk = torch.randn(2, 41, 2 * 9, dtype=torch.float64, generator=gen).requires_grad_()
    lm = torch.randn(2, 13, 2 * 9, dtype=torch.float64, generator=gen).requires_grad_()
    v = torch.randn(2, 13, 4, dtype=torch.float64, generator=gen).requires_grad_()

    def f(a, b, c, name):
        with use(kernel=name):
            return K.laplace_kernel(a[..., :9], b[..., 9:], 2.0, kind), K.laplace_kernel_matmul(a[..., 9:], b[..., :9], c, 2.0, kind)

    outs = {}
    for name in ("cpu", "naive"):
        ins = [t.detach().clone().requires_grad_() for t in (qk, lm, v)]
        k_, o = f(*ins, name)
        (k_.sum() + (o * o).sum()).backward()
        outs[name] = [k_, o] + [t.grad for t in ins]
    assert copies and not any(copies), "a column-sliced x or y was copied"
    for a, b in zip(outs["cpu"], outs["naive"]):
        assert _rel(a, b) < 1e-12, seed
    assert torch.autograd.gradcheck(lambda a, b, c: sum(t.sum() for t in f(a, b, c, "cpu")), (qk, lm, v), fast_mode=True), seed


def test_native_grad_deterministic_across_threads():
    """dX and dY do not depend on the thread count (per-chunk dY parts added in a fixed order)."""
    _native_or_skip()
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(2, 700, 32, generator=gen), torch.randn(2, 49, 32, generator=gen)
    g, c = torch.randn(2, 700, 49, generator=gen), torch.rand(2, 700, 49, generator=gen)
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            results.append(native.pairwise_distance_grad_native(x, y, g, c, 0.5, True))
    finally:
        torch.set_num_threads(before)
    for dx, dy in results[1:]:
        assert torch.equal(dx, results[0][0]) and torch.equal(dy, results[0][1])

"""Kernel primitives: the fast CPU path against the naive reference (float64 values + gradcheck, with and
without the C loops), the backend selector, explain_dispatch, fallback logging and torch.compile."""

from __future__ import annotations

import logging
import os

import pytest
import torch

from laplacianformer.ops import kernel as K
from laplacianformer.ops.kernel import cpu as kcpu
from laplacianformer.ops.kernel.backend import _warned as warned_reasons
from laplacianformer.ops.kernel import native

KINDS = ["laplacian", "gaussian"]


def _seeded():
    seed = int.from_bytes(os.urandom(4), "little")
    return seed, torch.Generator().manual_seed(seed)


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
def test_cpu_path_gradcheck(loops, kind):
    seed, gen = _seeded()
    x = torch.randn(2, 13, 5, dtype=torch.float64, generator=gen).requires_grad_()
    y = torch.randn(2, 7, 5, dtype=torch.float64, generator=gen).requires_grad_()
    v = torch.randn(2, 7, 3, dtype=torch.float64, generator=gen).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: kcpu.laplace_kernel_cpu(a, b, 2.0, kind), (x, y)), seed
    assert torch.autograd.gradcheck(lambda a, b, c: kcpu.laplace_kernel_matmul_cpu(a, b, c, 2.0, kind), (x, y, v)), seed


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_cpu_path_matches_naive(nan_empty, loops, kind, dtype):
    """Ragged sizes, (B, H, N, d) inputs, values and all gradients; outputs start NaN-filled."""
    seed, gen = _seeded()
    x, y, v = (torch.randn(2, 3, k, c, generator=gen, dtype=torch.float64) * 0.4 for k, c in ((67, 9), (19, 9), (19, 5)))
    grads = {}
    for name in ("cpu", "naive"):
        ins = [t.to(dtype if name == "cpu" else torch.float64).requires_grad_() for t in (x, y, v)]
        with K.backend(name):
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
    assert K.get_backend() == "auto"
    with K.backend("composite"):
        assert K.get_backend() == "composite"
        with K.backend("naive"):
            assert "runs 'naive'" in K.explain_dispatch(x, x)
        assert K.get_backend() == "composite"
    assert K.get_backend() == "auto"
    text = K.explain_dispatch(x, x, x)
    assert text.startswith("selection 'auto'") and "triton:" in text and "cuda" in text
    with pytest.raises(ValueError, match="^name: expected one of"):
        K.set_backend("fast")
    with K.backend("cpu"), pytest.raises(ValueError, match="^backend: 'cpu' cannot run this call: dtype"):
        K.laplace_kernel(x.half(), x.half())


def test_triton_refused_on_cpu_without_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    x = torch.randn(1, 30, 8)
    with K.backend("triton"), pytest.raises(ValueError, match="^backend: 'triton' cannot run this call"):
        K.laplace_kernel(x, x)


def test_fallback_logged_once(caplog, monkeypatch):
    warned_reasons.clear()
    x = torch.randn(1, 10, 4, dtype=torch.float16)
    with caplog.at_level(logging.INFO, logger="laplacianformer.ops.kernel"):
        K.laplace_kernel(x, x)
        K.laplace_kernel(x, x)
    records = [r for r in caplog.records if "falling back" in r.getMessage()]
    assert len(records) == 1 and "float16" in records[0].getMessage()


def test_onnx_export_uses_composite(monkeypatch):
    monkeypatch.setattr(torch.onnx, "is_in_onnx_export", lambda: True)
    x = torch.randn(1, 10, 4)
    assert "runs 'composite'" in K.explain_dispatch(x, x)
    assert "onnx" in K.explain_dispatch(x, x)


def test_cpu_path_compiles_without_graph_breaks():
    x = torch.randn(2, 40, 8, requires_grad=True)
    y = torch.randn(2, 9, 8)
    v = torch.randn(2, 9, 4)

    def f(a):
        return (K.laplace_kernel(a, y).sum() + K.laplace_kernel_matmul(a, y, v).sum())

    with K.backend("cpu"):
        out = torch.compile(f, fullgraph=True, backend="aot_eager")(x)
        out.backward()
    with K.backend("naive"):
        xr = x.detach().requires_grad_()
        ref = f(xr)
        ref.backward()
    assert torch.allclose(out, ref, rtol=1e-5) and torch.allclose(x.grad, xr.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_cpu_matmul_row_chunks(nan_empty, loops, kind, monkeypatch):
    """Several row chunks with a ragged last one give the same values and gradients as one chunk."""
    monkeypatch.setattr(kcpu, "_MATMUL_CHUNK_ELEMS", 3 * 11 * 4)
    seed, gen = _seeded()
    x = torch.randn(3, 37, 5, dtype=torch.float64, generator=gen).requires_grad_()
    y = torch.randn(3, 11, 5, dtype=torch.float64, generator=gen).requires_grad_()
    v = torch.randn(3, 11, 4, dtype=torch.float64, generator=gen).requires_grad_()
    assert len(kcpu._row_chunks(3, 37, 11)) == 10
    assert torch.autograd.gradcheck(lambda a, b, c: kcpu.laplace_kernel_matmul_cpu(a, b, c, 2.0, kind), (x, y, v)), seed

"""The custom ops the compiler sees (docs/DESIGN.md §6.5): schemas, fake implementations and autograd
(``torch.library.opcheck``), each backend's ``grad`` against autograd of its forward, and the attention op
compiled with fullgraph under the default runtime."""

import pytest
import torch

from laplacianformer.ops import laplacian_attention
from laplacianformer.ops.kernel import KERNEL, KERNEL_MATMUL, _kernel_graph_op, _matmul_graph_op
from laplacianformer.ops.newton_schulz import _inverse_graph_op
from laplacianformer.ops.kernel_families import kernel_names


def _xyv(gen, dtype=torch.float64):
    return (torch.randn(2, 9, 4, generator=gen, dtype=dtype), torch.randn(2, 5, 4, generator=gen, dtype=dtype),
            torch.randn(2, 5, 3, generator=gen, dtype=dtype))


@pytest.mark.parametrize("kind", kernel_names())
def test_opcheck_kernel_ops(seeded, kind):
    _, gen = seeded
    x, y, v = (t.requires_grad_(True) for t in _xyv(gen))
    torch.library.opcheck(_kernel_graph_op, (x, y, 2.0, kind))
    torch.library.opcheck(_matmul_graph_op, (x, y, v, 2.0, kind))


def test_opcheck_regularised_inverse(seeded):
    _, gen = seeded
    a = torch.randn(3, 6, 6, generator=gen, dtype=torch.float64)
    w = (a @ a.transpose(-1, -2) / 6).requires_grad_(True)
    for solver in ("newton_schulz", "exact"):
        torch.library.opcheck(_inverse_graph_op, (w, 0.01, solver, 20, None))


@pytest.mark.parametrize("backend", ["cpu", "composite", "naive"])
@pytest.mark.parametrize("kind", kernel_names())
def test_backend_grad_equals_autograd_of_its_forward(seeded, backend, kind):
    _, gen = seeded
    x, y, v = (t.requires_grad_(True) for t in _xyv(gen))
    g_out = torch.randn(2, 9, 5, generator=gen, dtype=torch.float64)
    out = KERNEL.by_name[backend].run(x, y, 2.0, kind)
    ref = torch.autograd.grad(out, (x, y), g_out)
    got = KERNEL.by_name[backend].grad(x.detach(), y.detach(), out.detach(), g_out, 2.0, kind)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    g_out = torch.randn(2, 9, 3, generator=gen, dtype=torch.float64)
    out = KERNEL_MATMUL.by_name[backend].run(x, y, v, 2.0, kind)
    ref = torch.autograd.grad(out, (x, y, v), g_out)
    got = KERNEL_MATMUL.by_name[backend].grad(x.detach(), y.detach(), v.detach(), g_out, 2.0, kind)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kwargs", [dict(hw=(8, 8), landmarks=(4, 4)), dict(landmarks=None),
                                    dict(landmarks=16, norm="none", kernel="gaussian")],
                         ids=["nystrom-2d", "exact", "nystrom-1d-none-gaussian"])
def test_compiled_attention_op_equals_eager(seeded, kwargs):
    """fullgraph under the default runtime: float32 output within 1e-4, float64 gradients to round-off."""
    _, gen = seeded
    torch._dynamo.reset()
    q, k, v = (torch.randn(2, 2, 64, 8, generator=gen) for _ in range(3))
    fn = lambda q, k, v: laplacian_attention(q, k, v, **kwargs)  # noqa: E731
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q, k, v), fn(q, k, v), rtol=1e-4, atol=1e-4)
    leaves = [t.double().requires_grad_(True) for t in (q, k, v)]
    ref = torch.autograd.grad(fn(*leaves).square().sum(), leaves)
    got = torch.autograd.grad(compiled(*leaves).square().sum(), leaves)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-8)

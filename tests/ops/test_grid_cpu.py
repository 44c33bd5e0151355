"""The C grid steps of CPU inference (``ops/grid_cpu.py``) against their PyTorch references on fresh random
inputs: landmark pooling against ``F.adaptive_avg_pool2d`` / ``1d`` (``pooling._pool_reference``), DWConv(V) +
the heads merged against ``F.conv2d`` plus the merge; the backends that use them (the ``pooling`` op's ``cpu``
backend, ``add_value_conv`` in inference) and where they must not run (autograd, tracing)."""

from __future__ import annotations

import pytest
import torch

from laplacianformer.ops import explain, grid_cpu, use
from laplacianformer.ops.pooling import _pool_reference, pool_landmarks
from laplacianformer.ops.value_conv import ValueConv, add_value_conv, value_conv

pytestmark = pytest.mark.skipif(not grid_cpu.available(), reason="C loops unavailable")

CASES = [  # (B, H, hw or None with N, d, landmarks)
    (1, 1, (56, 56), 64, (7, 7)),
    (2, 3, (9, 17), 8, (3, 5)),       # bins of unequal, overlapping sizes
    (1, 2, (5, 4), 16, (7, 7)),       # more bins than rows and columns (repeated tokens)
    (2, 2, None, 8, 7),               # 1-D: N = 30 tokens to 7 landmarks
    (1, 5, (6, 7), 20, (3, 3)),       # C = 100: register blocks of channels, single vectors and a scalar tail
]


def _tokens(b, h, hw, d, gen, dtype):
    n = 30 if hw is None else hw[0] * hw[1]
    wide = torch.randn(b, n, 3 * h * d, generator=gen, dtype=dtype)  # q as the layer's strided head view
    return wide[..., h * d:2 * h * d].reshape(b, n, h, d).transpose(1, 2)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", CASES)
def test_pooling_equals_adaptive_avg_pool(case, dtype, seeded):
    seed, gen = seeded
    b, h, hw, d, marks = case
    x = _tokens(b, h, hw, d, gen, dtype)
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grid_cpu.pool_grid_cpu(x, hw, marks), _pool_reference(x, hw, marks), **tol,
                               msg=lambda m: f"seed {seed}: {m}")


def _conv_reference(heads, conv):
    b, h, n, e = heads.shape
    return (value_conv(conv) + heads.transpose(1, 2).reshape(b, n, h * e)).view(b, n, h, e).transpose(1, 2)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", CASES)
def test_dwconv_merge_equals_conv2d_plus_heads(case, dtype, bias, seeded):
    seed, gen = seeded
    b, h, hw, e, _ = case
    n = 30 if hw is None else hw[0] * hw[1]
    c = h * e
    conv = ValueConv(torch.randn(b, n, c, generator=gen, dtype=dtype), hw,
                     torch.randn(c, 1, 3, 3, generator=gen, dtype=dtype),
                     torch.randn(c, generator=gen, dtype=dtype) if bias else None)
    heads = torch.randn(b, n, c, generator=gen, dtype=dtype).view(b, n, h, e).transpose(1, 2)  # strided, as merged
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-5)
    out = grid_cpu.dwconv_merge_cpu(heads, conv)
    assert out.shape == (b, h, n, e)
    torch.testing.assert_close(out, _conv_reference(heads, conv), **tol, msg=lambda m: f"seed {seed}: {m}")


def test_results_do_not_depend_on_the_thread_count(seeded):
    _, gen = seeded
    x = _tokens(2, 4, (40, 40), 32, gen, torch.float32)
    conv = ValueConv(torch.randn(2, 1600, 128, generator=gen), (40, 40), torch.randn(128, 1, 3, 3, generator=gen),
                     torch.randn(128, generator=gen))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = grid_cpu.pool_grid_cpu(x, (40, 40), (7, 7)), grid_cpu.dwconv_merge_cpu(x, conv)
        torch.set_num_threads(2)
        two = grid_cpu.pool_grid_cpu(x, (40, 40), (7, 7)), grid_cpu.dwconv_merge_cpu(x, conv)
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(one, two))


def test_pooling_op_runs_the_c_loop_for_inference_only(seeded):
    _, gen = seeded
    x = _tokens(1, 2, (8, 8), 16, gen, torch.float32)
    assert "selection 'auto' runs 'cpu'" in explain("pooling", x, (8, 8), (4, 4))
    with use(pooling="cpu"):
        torch.testing.assert_close(pool_landmarks(x, (8, 8), (4, 4)), _pool_reference(x, (8, 8), (4, 4)))
    leaf = x.detach().requires_grad_(True)
    report = explain("pooling", leaf, (8, 8), (4, 4))
    assert "forward only" in report and "selection 'auto' runs 'matmul'" in report
    pool_landmarks(leaf, (8, 8), (4, 4)).sum().backward()  # autograd through the matmul backend
    assert leaf.grad is not None


def test_value_conv_keeps_autograd_on_the_aten_path(seeded):
    _, gen = seeded
    weight = torch.randn(8, 1, 3, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    conv = ValueConv(torch.randn(1, 64, 8, generator=gen, dtype=torch.float64), (8, 8), weight, None)
    heads = torch.randn(1, 2, 64, 4, generator=gen, dtype=torch.float64)
    out = add_value_conv(heads, conv)
    assert out.requires_grad  # the C pass has no backward: autograd took the conv
    (out * out).sum().backward()
    expected = torch.autograd.grad((_conv_reference(heads, conv) ** 2).sum(), weight)[0]
    torch.testing.assert_close(weight.grad, expected, rtol=1e-12, atol=1e-12)

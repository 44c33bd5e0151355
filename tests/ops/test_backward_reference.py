"""``ops/streaming/backward_reference.py``, the pass form of the fused core's backward (the specification of the
Triton backward kernels): in float64 its passes A–E give the gradients autograd gives through the core's step
path (``attention_core``: pooling, W, Newton–Schulz with the implicit backward, the kernel rows and the
normalisation) plus the layer's DWConv(V), for every streamed norm, both kernels, K = Q and K ≠ Q; its forward
state reproduces the core's output."""

from __future__ import annotations

import pytest
import torch

from laplacianformer.ops.nystrom import attention_core
from laplacianformer.ops.settings import AttentionSettings
from laplacianformer.ops.streaming import STREAMED_NORMS
from laplacianformer.ops.streaming.limits import whitens
from laplacianformer.ops.streaming import backward_reference as ref
from laplacianformer.ops.normalization.reference import NORM_SCALE_POWERS
from laplacianformer.ops.streaming.landmarks import landmark_solve_reference
from laplacianformer.ops.streaming.limits import output_alpha
from laplacianformer.ops.value_conv import ValueConv, value_conv_heads
from laplacianformer.ops.kernel_families import kernel_names

HW, GRID, B, H, D, E = (6, 5), (3, 2), 2, 2, 8, 6


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


@pytest.mark.parametrize("norm", STREAMED_NORMS)
@pytest.mark.parametrize("kernel", kernel_names())
@pytest.mark.parametrize("tied", [True, False], ids=["k_is_q", "k_not_q"])
@pytest.mark.parametrize("with_conv", [False, True], ids=["noconv", "conv"])
def test_passes_equal_autograd_through_the_step_path(seeded, norm, kernel, tied, with_conv):
    _check_passes(seeded, norm, kernel, tied, with_conv, "one")


@pytest.mark.parametrize("norm", [n for n in STREAMED_NORMS if whitens(n)])  # the whitened ones: α scales them
@pytest.mark.parametrize("norm_scale", ["inv_sqrt_n", "inv_n"])
@pytest.mark.parametrize("tied", [True, False], ids=["k_is_q", "k_not_q"])
def test_passes_with_the_output_scale_equal_autograd(seeded, norm, norm_scale, tied):
    """The §4.6 output scale α = N^-p enters the passes as M = α W⁺ M' and dM = α cᵀ G, and nowhere else."""
    _check_passes(seeded, norm, "laplacian", tied, True, norm_scale)


def _check_passes(seeded, norm, kernel, tied, with_conv, norm_scale):
    _, gen = seeded
    n = HW[0] * HW[1]
    f64 = dict(dtype=torch.float64, generator=gen)
    q = torch.randn(B, H, n, D, **f64).requires_grad_()
    k = q if tied else torch.randn(B, H, n, D, **f64).requires_grad_()
    v = torch.randn(B, H, n, E, **f64).requires_grad_()
    weight = torch.randn(H * E, 1, 3, 3, **f64).requires_grad_()
    bias = torch.randn(H * E, **f64).requires_grad_()
    s = AttentionSettings(head_dim=D, kernel=kernel, norm=norm, landmarks=GRID, iters=30, norm_scale=norm_scale)
    power = NORM_SCALE_POWERS[norm_scale]
    conv = ValueConv(None, HW, weight, bias) if with_conv else None
    out = attention_core(q, k, v, s, HW, GRID)
    if conv is not None:
        out = out + value_conv_heads(v, conv)
    grad = torch.randn(out.shape, **f64)
    inputs = [q, v] + ([] if tied else [k]) + ([weight, bias] if with_conv else [])
    want = torch.autograd.grad(out, inputs, grad)
    with torch.no_grad():
        marks, w, w_inv = landmark_solve_reference(q, HW, GRID, s.bandwidth, kernel, s.ns_eps, s.iters)
        st = ref.forward_state(q, k, v, marks, w, w_inv, s.bandwidth, kernel, norm, s.norm_eps)
        again = ref.output_of(q, st, s.bandwidth, kernel, norm, output_alpha(norm, power, float(n)))
        if conv is not None:
            again = again + value_conv_heads(v, conv)
        g = ref.streaming_backward_reference(grad, q, k, v, st, HW, GRID, s.bandwidth, kernel, norm, s.norm_eps, conv,
                                             power)
    assert _rel(again, out) < 1e-10
    got = [g["dq"], g["dv"]] + ([] if tied else [g["dk"]]) + ([g["dweight"], g["dbias"]] if with_conv else [])
    assert (g["dk"] is None) == tied
    for name, a, b in zip(["dq", "dv", "dk", "dweight", "dbias"] if not tied else ["dq", "dv", "dweight", "dbias"],
                          got, want):
        assert _rel(a, b) < 1e-10, name

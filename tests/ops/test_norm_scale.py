"""The output scale of the injective map (``norm_scale``, ``norm_gain``; docs/DESIGN.md §4.6) against a
materialised reference: z_ij = α_h·(h_ij − μ_j)/√(s_j² + ε) + 1/N with α_h = gain_h·N^−p, on the exact kernel
and on a Nyström ĝ built here from its definition; every normalisation backend, the lean recompute, key
padding, gradients (float64, gradcheck) and the errors. The Triton backend's cases are marked ``triton``
(CUDA, or rerun under TRITON_INTERPRET=1 by ``test_triton_cases_under_interpreter``).
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from laplacianformer import laplacian_attention
from laplacianformer.layers import LaplacianAttention
from laplacianformer.ops import use

TRITON_HERE = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
POWERS = {"one": 0.0, "inv_sqrt_n": 0.5, "inv_n": 1.0}
LAM = 4.0


def _kernel(x, y, scale):
    """exp(-||s·x - s·y||_1 / λ), materialised: (..., N, d), (..., M, d) -> (..., N, M)."""
    return torch.exp(-torch.cdist(x * scale, y * scale, p=1) / LAM)


def _injective(g, v, alpha, eps=1e-6, mean=True):
    """The scaled injective map of a materialised ĝ (B, H, N, N) applied to v; alpha broadcasts as (1, H, 1, 1)."""
    n = g.shape[-1]
    h = g - g.mean(-1, keepdim=True)
    mu = h.mean(-2, keepdim=True) if mean else 0.0
    z = alpha * (h - mu) / torch.sqrt(h.var(-2, unbiased=False, keepdim=True) + eps) + 1.0 / n
    return z @ v


def _nystrom_g(q, k, grid, hw, ns_eps=0.01):
    """ĝ = C_q (W + εI)⁻¹ C_kᵀ with landmarks the adaptive average pool of the scaled queries (exact inverse)."""
    b, h, n, d = q.shape
    s = d ** -0.5
    marks = F.adaptive_avg_pool2d(q.reshape(b * h, hw[0], hw[1], d).permute(0, 3, 1, 2), grid)
    marks = marks.flatten(2).transpose(1, 2).reshape(b, h, -1, d)
    w = _kernel(marks, marks, s) + ns_eps * torch.eye(marks.shape[-2], dtype=q.dtype)
    return _kernel(q, marks, s) @ torch.linalg.solve(w, _kernel(k, marks, s).transpose(-1, -2))


def _inputs(b=2, h=2, n=36, d=8, seed=0, grad=False):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=gen, dtype=torch.float64).requires_grad_(grad) for _ in range(3)]


@pytest.mark.parametrize("norm_scale", list(POWERS))
@pytest.mark.parametrize("norm", ["injective", "injective_nomean"])
def test_exact_kernel_equals_materialised_formula(norm_scale, norm):
    q, k, v = _inputs()
    gain = torch.tensor([0.7, 1.9], dtype=torch.float64)
    out = laplacian_attention(q, k, v, landmarks=None, norm=norm, norm_scale=norm_scale, norm_gain=gain)
    alpha = gain.view(1, -1, 1, 1) * 36 ** -POWERS[norm_scale]
    ref = _injective(_kernel(q, k, 8 ** -0.5), v, alpha, mean=norm == "injective")
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend", ["composite", "fused", "cpu"])
@pytest.mark.parametrize("norm_scale", ["inv_sqrt_n", "inv_n"])
def test_nystrom_equals_materialised_formula_on_every_cpu_backend(backend, norm_scale):
    q, k, v = _inputs(n=64, grad=True)
    with use(normalization=backend):
        out = laplacian_attention(q, k, v, hw=(8, 8), landmarks=(3, 3), solver="exact", norm_scale=norm_scale)
    ref = _injective(_nystrom_g(q, k, (3, 3), (8, 8)), v, 64 ** -POWERS[norm_scale])
    torch.testing.assert_close(out, ref, rtol=1e-8, atol=1e-10)
    seed = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), seed)
    want = torch.autograd.grad(ref, (q, k, v), seed)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-9)


def test_gradcheck_with_learned_gain():
    q, k, v = _inputs(b=1, n=16, d=4, grad=True)
    gain = torch.tensor([1.3, 0.6], dtype=torch.float64, requires_grad=True)

    def fn(q, k, v, gain):
        return laplacian_attention(q, k, v, hw=(4, 4), landmarks=(2, 2), norm_scale="inv_sqrt_n", norm_gain=gain)

    assert torch.autograd.gradcheck(fn, (q, k, v, gain))


def test_key_padding_counts_valid_keys_only():
    q, k, v = _inputs(b=2, h=2, n=40, d=8)
    mask = torch.zeros(2, 40, dtype=torch.bool)
    mask[1, 29:] = True  # sequence 1 has 29 valid tokens
    out = laplacian_attention(q, k, v, landmarks=9, norm_scale="inv_sqrt_n", key_padding_mask=mask)
    alone = laplacian_attention(q[1:, :, :29], k[1:, :, :29], v[1:, :, :29], landmarks=9, norm_scale="inv_sqrt_n")
    torch.testing.assert_close(out[1:, :, :29], alone, rtol=1e-9, atol=1e-11)
    assert out[1, :, 29:].abs().max() == 0


@pytest.mark.parametrize("norm_scale", ["inv_n", "learned"])
def test_lean_recompute_equals_plain_module(norm_scale):
    torch.manual_seed(0)
    plain = LaplacianAttention(32, 2, norm_scale=norm_scale).double()
    lean = LaplacianAttention(32, 2, norm_scale=norm_scale, recompute=True).double()
    lean.load_state_dict(plain.state_dict())
    if norm_scale == "learned":
        assert plain.norm_gain.shape == (2,) and torch.equal(plain.norm_gain, torch.ones(2, dtype=torch.float64))
        with torch.no_grad():
            plain.norm_gain.copy_(torch.tensor([0.5, 2.0]))
            lean.norm_gain.copy_(torch.tensor([0.5, 2.0]))
    x = torch.randn(2, 100, 32, dtype=torch.float64)
    y_plain, y_lean = plain(x, (10, 10)), lean(x, (10, 10))
    torch.testing.assert_close(y_lean, y_plain, rtol=1e-10, atol=1e-12)
    g_plain = torch.autograd.grad(y_plain.square().sum(), list(plain.parameters()))
    g_lean = torch.autograd.grad(y_lean.square().sum(), list(lean.parameters()))
    for a, b in zip(g_lean, g_plain):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


def test_scale_keeps_the_output_near_unit_spread():
    """The point of §4.6: for unit-variance q, k, v the unscaled map's output grows with N, the 1/√N map's not."""
    stds = {}
    for n_side in (8, 16, 32):
        q, k, v = _inputs(b=1, n=n_side * n_side, d=16, seed=n_side)
        stds[n_side] = [float(laplacian_attention(q, k, v, hw=(n_side, n_side), norm_scale=s).std())
                        for s in ("one", "inv_sqrt_n")]
    assert stds[32][0] > 3 * stds[8][0]  # unscaled: ~√N growth (16× the tokens)
    assert 0.5 < stds[32][1] / stds[8][1] < 2.0


def test_errors_name_the_argument():
    q, k, v = _inputs()
    with pytest.raises(ValueError, match="norm_scale"):
        laplacian_attention(q, k, v, landmarks=None, norm="inline", norm_scale="inv_sqrt_n")
    with pytest.raises(ValueError, match="norm_scale"):
        laplacian_attention(q, k, v, landmarks=None, norm_scale="sqrt")
    with pytest.raises(ValueError, match="norm_gain"):
        laplacian_attention(q, k, v, landmarks=None, norm_gain=torch.ones(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="norm_scale"):
        LaplacianAttention(16, 2, norm="rowsum", norm_scale="learned")


@pytest.mark.triton
@pytest.mark.skipif(not TRITON_HERE, reason="needs CUDA or TRITON_INTERPRET=1")
@pytest.mark.parametrize("norm_scale", ["inv_sqrt_n", "inv_n"])
def test_triton_backend_scaled(norm_scale):
    q, k, v = (t.to(DEVICE).requires_grad_(True) for t in _inputs(n=64))
    with use(normalization="composite"):
        ref = laplacian_attention(q, k, v, hw=(8, 8), landmarks=(3, 3), norm_scale=norm_scale)
    with use(normalization="triton"):
        out = laplacian_attention(q, k, v, hw=(8, 8), landmarks=(3, 3), norm_scale=norm_scale)
    torch.testing.assert_close(out, ref, rtol=1e-8, atol=1e-10)
    seed = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), seed), torch.autograd.grad(ref, (q, k, v), seed)):
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-9)


def test_triton_cases_under_interpreter(triton_interpreter):
    if TRITON_HERE:
        pytest.skip("the Triton cases run in this process")
    pytest.importorskip("triton")
    triton_interpreter("tests/ops/test_norm_scale.py", timeout=300.0)

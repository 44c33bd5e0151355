"""laplacian_attention: Nyström path vs materialised formulas, exact limit, gradients, dtypes."""

import pytest
import torch

from laplacianformer import laplacian_attention
from laplacianformer.ops.pooling import pool_landmarks
from laplacianformer.ops.kernel import laplace_kernel_naive
from laplacianformer.ops.newton_schulz import regularise
from laplacianformer.ops.normalization import normalize_dense, normalize_nystrom
from laplacianformer.ops.kernel_families import kernel_names, kernel_spec

NORMS = ["injective", "inline", "rowsum", "none", "injective_nomean"]


def qkv(b=2, h=2, n=30, d=8, dtype=torch.float64, dv=None, scale=1.0):
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    make = lambda dd: (torch.randn(b, h, n, dd, generator=g, dtype=dtype) * scale)
    return make(d), make(d), make(dv or d)


def materialised_nystrom(q, k, hw, grid, lam, kernel, ns_eps):
    """ĝ = C_q (W + eps I)^{-1} C_kᵀ built densely (N×N) from the naive kernel and an exact inverse."""
    marks = pool_landmarks(q, hw, grid)
    c_q = laplace_kernel_naive(q, marks, lam, kernel)
    c_k = laplace_kernel_naive(k, marks, lam, kernel)
    w_inv = torch.linalg.inv(regularise(laplace_kernel_naive(marks, marks, lam, kernel), ns_eps))
    return c_q @ w_inv @ c_k.transpose(-1, -2)


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("kernel", kernel_names())
def test_linear_cost_normalisation_equals_materialised_formula(norm, kernel):
    q, k, v = qkv(n=35, d=6, dv=5)
    hw, grid = (5, 7), (3, 4)
    out = laplacian_attention(q, k, v, hw=hw, landmarks=grid, lam=4.0, qk_scale=1.0, norm=norm, solver="exact", kernel=kernel,
                              norm_scale="one")  # the map of §4.1 as materialised
    g = materialised_nystrom(q, k, hw, grid, 4.0, kernel, 0.01)
    ref = normalize_dense(g, v, norm)
    torch.testing.assert_close(out, ref, rtol=1e-8, atol=1e-10)


def test_normalize_nystrom_factor_identity_on_random_factors():
    c_q, b, v = torch.rand(1, 3, 40, 9, dtype=torch.float64), torch.randn(1, 3, 40, 9, dtype=torch.float64), torch.randn(1, 3, 40, 4, dtype=torch.float64)
    for norm in NORMS:
        if norm == "rowsum":
            b = b.abs()
        torch.testing.assert_close(normalize_nystrom(c_q, b, v, norm), normalize_dense(c_q @ b.transpose(-1, -2), v, norm), rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("norm", NORMS)
def test_landmarks_equal_to_grid_recover_exact_kernel(norm):
    q, k, v = qkv(b=1, n=16, d=4, scale=0.5)
    exact = laplacian_attention(q, k, v, hw=(4, 4), landmarks=None, norm=norm)
    approx = laplacian_attention(q, k, v, hw=(4, 4), landmarks=(4, 4), norm=norm, ns_eps=1e-12, solver="exact")
    err = ((approx - exact).norm() / exact.norm()).item()
    print(f"relative error Nystrom(m=N) vs exact, norm={norm}: {err:.2e}")
    assert err < 1e-6


def test_landmarks_equal_to_grid_with_newton_schulz_converged():
    q, k, v = qkv(b=1, n=9, d=4, scale=3.0)
    exact = laplacian_attention(q, k, v, hw=(3, 3), landmarks=None, norm="none")
    approx = laplacian_attention(q, k, v, hw=(3, 3), landmarks=(3, 3), norm="none", ns_eps=1e-10, iters=200)
    err = ((approx - exact).norm() / exact.norm()).item()
    print(f"relative error Nystrom(m=N, Newton-Schulz 200 iters) vs exact: {err:.2e}")
    assert err < 1e-5


def test_one_dimensional_sequence_and_exact_path():
    q, k, v = qkv(n=20)
    out = laplacian_attention(q, k, v, landmarks=5, norm="none", qk_scale=1.0, solver="exact")
    marks = pool_landmarks(q, None, 5)
    assert marks.shape == (2, 2, 5, 8)
    g = materialised_nystrom(q, k, None, 5, 4.0, "laplacian", 0.01)
    torch.testing.assert_close(out, g @ v, rtol=1e-8, atol=1e-10)
    dense = laplacian_attention(q, k, v, landmarks=None, norm="none", qk_scale=1.0)
    torch.testing.assert_close(dense, laplace_kernel_naive(q, k, 4.0) @ v, rtol=1e-10, atol=1e-12)


def smooth_tokens(h, w, d):
    """Spatially smooth token maps (low-frequency fields + noise), the regime of real image features."""
    yy, xx = torch.meshgrid(
        torch.linspace(0, 1, h, dtype=torch.float64), torch.linspace(0, 1, w, dtype=torch.float64), indexing="ij"
    )
    basis = torch.stack([torch.sin(3 * xx), torch.cos(2 * yy), torch.sin(2 * (xx + yy)), xx * yy], -1).reshape(-1, 4)
    field = basis @ torch.randn(d, 4, dtype=torch.float64).T
    return (field + 0.05 * torch.randn_like(field))[None, None]


def test_approximation_error_is_bounded_and_falls_with_landmarks():
    q = smooth_tokens(28, 28, 16)
    k = q + 0.05 * torch.randn_like(q)
    v = torch.randn_like(q)
    exact = laplacian_attention(q, k, v, hw=(28, 28), landmarks=None)
    errs = []
    for grid in [(4, 4), (7, 7), (10, 10)]:
        approx = laplacian_attention(q, k, v, hw=(28, 28), landmarks=grid)
        errs.append(((approx - exact).norm() / exact.norm()).item())
    print("relative error Nystrom vs exact at N=784 (injective), m=16/49/100:", ", ".join(f"{e:.3f}" for e in errs))
    assert errs[0] > errs[1] > errs[2]
    assert errs[1] < 0.2  # measured ~0.07 on these fields


def test_gradcheck_whole_operator():
    q, k, v = qkv(b=1, h=1, n=12, d=3)
    for q_, k_, v_ in ((q, k, v),):
        q_.requires_grad_(), k_.requires_grad_(), v_.requires_grad_()
    for norm in NORMS:
        if norm == "rowsum":
            continue
        fn = lambda a, b_, c: laplacian_attention(a, b_, c, hw=(3, 4), landmarks=(2, 2), norm=norm, iters=30)
        assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-6, atol=1e-4)


def test_gradcheck_exact_and_rowsum():
    q, k, v = qkv(b=1, h=1, n=10, d=3)
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    fn = lambda a, b_, c: laplacian_attention(a, b_, c, landmarks=None, norm="rowsum")
    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-6, atol=1e-5)


def test_nystrom_memory_never_holds_n_by_n():
    q, k, v = qkv(b=1, h=1, n=4096, d=8, dtype=torch.float32)
    q.requires_grad_()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        laplacian_attention(q, k, v, hw=(64, 64)).sum().backward()
    biggest = max(e.cpu_memory_usage for e in prof.events())
    n_by_n = 4096 * 4096 * 4
    assert 0 < biggest < n_by_n / 4, f"one op allocated {biggest} bytes: an N×N float32 matrix is {n_by_n}"


def test_autocast_bfloat16_close_to_float32():
    q, k, v = qkv(b=2, h=2, n=64, d=16, dtype=torch.float32)
    ref = laplacian_attention(q, k, v, hw=(8, 8), landmarks=(4, 4))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = laplacian_attention(q, k, v, hw=(8, 8), landmarks=(4, 4))
    assert torch.isfinite(out).all()
    rel = ((out.float() - ref).norm() / ref.norm()).item()
    print(f"autocast bf16 vs fp32 relative error: {rel:.2e}")
    assert rel < 1e-5  # kernels, solver and normalisation stay in fp32 under autocast
    out_bf16 = laplacian_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), hw=(8, 8), landmarks=(4, 4))
    assert out_bf16.dtype == torch.bfloat16
    rel16 = ((out_bf16.float() - ref).norm() / ref.norm()).item()
    assert rel16 < 3e-2, rel16  # bf16 inputs: ~8 bits of mantissa in q, k, v


def test_return_stats_reports_solver_residual():
    q, k, v = qkv()
    out, stats = laplacian_attention(q, k, v, hw=(5, 6), landmarks=(2, 3), return_stats=True, iters=40)
    assert stats["residual"].shape == (2, 2) and stats["landmarks"] == 6
    assert (stats["residual"] < 1e-6).all()


def test_tied_keys_reuse_query_kernel():
    q, _, v = qkv()
    out = laplacian_attention(q, q, v, hw=(5, 6), landmarks=(2, 3))
    ref = laplacian_attention(q, q.clone(), v, hw=(5, 6), landmarks=(2, 3))
    torch.testing.assert_close(out, ref)


@pytest.mark.parametrize("kernel", kernel_names())
@pytest.mark.parametrize("qk_scale", [None, 0.3, 2.0])
def test_qk_scale_equals_scaling_the_inputs(kernel, qk_scale):
    """The operator folds qk_scale into lam (k(s·q, s·k; lam) = k(q, k; lam / s^p)): same as scaling q, k."""
    q, k, v = qkv(n=35, d=6, dv=5)
    default_scale = kernel_spec(kernel).default_qk_scale(6)  # the kernel's default (DESIGN.md §1.1, §1.4, §1.5)
    s = default_scale if qk_scale is None else qk_scale
    hw, grid = (5, 7), (3, 4)
    out = laplacian_attention(q, k, v, hw=hw, landmarks=grid, lam=4.0, qk_scale=qk_scale, solver="exact", kernel=kernel)
    ref = laplacian_attention(q * s, k * s, v, hw=hw, landmarks=grid, lam=4.0, qk_scale=1.0, solver="exact", kernel=kernel)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    dense = laplacian_attention(q, k, v, hw=hw, landmarks=None, lam=4.0, qk_scale=qk_scale, kernel=kernel,
                                norm_scale="one")  # the unscaled formula below
    torch.testing.assert_close(dense, normalize_dense(laplace_kernel_naive(q * s, k * s, 4.0, kernel), v, "injective"))


@pytest.mark.parametrize("grid_hw, marks", [((128, 128), (7, 7)), ((5, 9), (3, 7)), ((13, 6), (7, 5)), ((7, 7), (7, 7)), ((1, 3), (1, 2))])
def test_pool_landmarks_equals_adaptive_avg_pool(grid_hw, marks):
    """The pooling-matrix products give adaptive_avg_pool2d's bins, also for a strided token view."""
    import torch.nn.functional as F

    gh, gw = grid_hw
    wide = torch.randn(2, gh * gw, 3, 8, dtype=torch.float64)
    x = wide[:, :, 1].reshape(2, gh * gw, 2, 4).transpose(1, 2)  # (B, H, N, d) with row stride 24
    ref = F.adaptive_avg_pool2d(x.reshape(4, gh, gw, 4).permute(0, 3, 1, 2), marks).flatten(2).transpose(1, 2)
    torch.testing.assert_close(pool_landmarks(x, grid_hw, marks), ref.reshape(2, 2, -1, 4), rtol=1e-12, atol=1e-14)
    seq = torch.randn(2, 3, 50, 4, dtype=torch.float64)
    ref1 = F.adaptive_avg_pool1d(seq.reshape(6, 50, 4).transpose(1, 2), 7).transpose(1, 2).reshape(2, 3, 7, 4)
    torch.testing.assert_close(pool_landmarks(seq, None, 7), ref1, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("d", [8, 32])
def test_gaussian_default_is_softs_bandwidth_on_raw_qk(d):
    """kernel="gaussian" with default lam/qk_scale is exp(-||q - k||² / (2·sqrt(d))) on the raw q, k (DESIGN.md §1.4)."""
    g = torch.Generator().manual_seed(1234)
    print("seed 1234")
    q, k, v = (torch.randn(1, 2, 12, d, generator=g, dtype=torch.float64) for _ in range(3))
    out = laplacian_attention(q, k, v, landmarks=None, kernel="gaussian", norm="none")
    sq = (q.unsqueeze(-2) - k.unsqueeze(-3)).pow(2).sum(-1)
    torch.testing.assert_close(out, torch.exp(-sq / (2.0 * d**0.5)) @ v, rtol=1e-12, atol=1e-12)
    # the Laplacian default is unchanged: exp(-||q - k||_1 / 4) on q, k scaled by d**-0.5
    out = laplacian_attention(q, k, v, landmarks=None, norm="none")
    l1 = (q.unsqueeze(-2) - k.unsqueeze(-3)).abs().sum(-1) * d**-0.5
    torch.testing.assert_close(out, torch.exp(-l1 / 4.0) @ v, rtol=1e-12, atol=1e-12)


def test_default_bandwidth_resolves_each_none_and_validates():
    from laplacianformer.ops import default_bandwidth

    assert default_bandwidth("laplacian", 64) == (4.0, 0.125)
    assert default_bandwidth("gaussian", 16) == (8.0, 1.0)
    assert default_bandwidth("gaussian", 16, lam=2.0, qk_scale=0.5) == (2.0, 0.5)
    with pytest.raises(ValueError, match="^lam"):
        default_bandwidth("gaussian", 16, lam=-1.0)
    with pytest.raises(ValueError, match="^kernel"):
        default_bandwidth("cauchyy", 16)

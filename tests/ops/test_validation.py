"""Every bad argument of laplacian_attention raises ValueError/TypeError naming the argument."""

import pytest
import torch

from laplacianformer import LaplacianAttention, laplacian_attention, newton_schulz_pinv


def good(n=16, d=4):
    return [torch.randn(1, 2, n, d) for _ in range(3)]


CASES = [
    ("q", ValueError, lambda q, k, v: laplacian_attention(q[0], k, v, landmarks=4)),
    ("k", ValueError, lambda q, k, v: laplacian_attention(q, k[..., :3], v, landmarks=4)),
    ("v", ValueError, lambda q, k, v: laplacian_attention(q, k, v[:, :, :5], landmarks=4)),
    ("hw", ValueError, lambda q, k, v: laplacian_attention(q, k, v, hw=(3, 5))),
    ("hw", ValueError, lambda q, k, v: laplacian_attention(q, k, v, hw=(16,))),
    ("landmarks", ValueError, lambda q, k, v: laplacian_attention(q, k, v, hw=(4, 4), landmarks=8)),
    ("landmarks", ValueError, lambda q, k, v: laplacian_attention(q, k, v, landmarks=0)),
    ("lam", ValueError, lambda q, k, v: laplacian_attention(q, k, v, landmarks=4, lam=0.0)),
    ("lam", ValueError, lambda q, k, v: laplacian_attention(q, k, v, landmarks=4, lam=-1.0)),
    ("lam", ValueError, lambda q, k, v: laplacian_attention(q, k, v, landmarks=4, lam=float("nan"))),
    ("qk_scale", ValueError, lambda q, k, v: laplacian_attention(q, k, v, landmarks=4, qk_scale=0.0)),
    ("norm", ValueError, lambda q, k, v: laplacian_attention(q, k, v, landmarks=4, norm="softmax")),
    ("solver", ValueError, lambda q, k, v: laplacian_attention(q, k, v, landmarks=4, solver="lu")),
    ("kernel", ValueError, lambda q, k, v: laplacian_attention(q, k, v, landmarks=4, kernel="cosine")),
    ("iters", ValueError, lambda q, k, v: laplacian_attention(q, k, v, landmarks=4, iters=0)),
    ("ns_eps", ValueError, lambda q, k, v: laplacian_attention(q, k, v, landmarks=4, ns_eps=-1.0)),
    ("q", TypeError, lambda q, k, v: laplacian_attention(q.long(), k, v, landmarks=4)),
    ("q, k, v", TypeError, lambda q, k, v: laplacian_attention(q, k.double(), v, landmarks=4)),
    ("w", ValueError, lambda q, k, v: newton_schulz_pinv(q[0, 0])),
]


@pytest.mark.parametrize("name,exc,call", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_bad_argument_is_named(name, exc, call):
    with pytest.raises(exc, match=f"^{name}"):
        call(*good())


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_check_finite_inputs_flag(bad):
    q, k, v = good()
    k[0, 0, 3, 1] = bad
    with pytest.raises(ValueError, match="^k: contains NaN or Inf"):
        laplacian_attention(q, k, v, landmarks=4, check_finite_inputs=True)


def test_module_bad_arguments():
    with pytest.raises(ValueError, match="^dim"):
        LaplacianAttention(30, 4)
    with pytest.raises(ValueError, match="^kernel"):
        LaplacianAttention(32, 4, kernel="x")
    attn = LaplacianAttention(32, 4)
    with pytest.raises(ValueError, match="^x"):
        attn(torch.randn(2, 16, 31), (4, 4))
    with pytest.raises(ValueError, match="^hw"):
        attn(torch.randn(2, 16, 32), (4, 5))

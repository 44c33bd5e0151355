"""Nyströmformer attention (Xiong et al. 2021, "Nyströmformer: A Nyström-Based Algorithm for
Approximating Self-Attention").

Landmarks are segment means of the queries and keys along the sequence (N tokens into m segments);
the softmax matrix is approximated from three softmax kernels:
    Q̃ = segment_means(Q), K̃ = segment_means(K)                 (m, d)
    F = softmax(Q K̃ᵀ s) (N×m),  A = softmax(Q̃ K̃ᵀ s) (m×m),  B = softmax(Q̃ Kᵀ s) (m×N)
    out = F · A⁺ · (B V),  s = d**-0.5
A⁺ comes from the paper's third-order iteration (Razavi et al. 2014)
    Z_{k+1} = ¼ Z_k (13I - A Z_k (15I - A Z_k (7I - A Z_k)))
started, for EACH matrix separately, at Z_0 = Aᵀ / (‖A‖_1 ‖A‖_∞) (max column sum times max row sum),
which makes ‖I - A Z_0‖_2 < 1 for any non-singular A. Nyströmformer's released code took these
norms as maxima over the whole batch, which couples samples (a known complaint of its users, docs/BASELINES.md); here they are per matrix.
Segment means use adaptive average pooling (the library's pooling op), equal to the paper's means when m divides N. On a 2-D
token grid the segments run over the row-major flattened sequence, as in the paper.
The paper's optional depthwise convolution on V is not part of this op.
"""

from __future__ import annotations

import torch

from ..ops.pooling import masked_pool_matrix, pool_landmarks
from ..ops.validation import check_float_tensor, check_key_padding_mask, check_positive, check_positive_int, check_qkv
from ..layers.token_attention import TokenAttention
from .softmax import softmax_attention, softmax_attention_naive

__all__ = [
    "iterative_pinv",
    "segment_means",
    "nystrom_attention",
    "nystrom_attention_dense",
    "NystromAttention",
]


def iterative_pinv(a: torch.Tensor, iters: int = 6) -> torch.Tensor:
    """Nyströmformer's iterative Moore–Penrose inverse.  a: (..., m, m) -> (..., m, m).

    Per-matrix initialisation Z_0 = Aᵀ / (‖A‖_1 ‖A‖_∞); ``iters`` third-order steps (paper default 6;
    ill-conditioned matrices need more, see mlpen/Nystromformer#6).
    """
    check_float_tensor("a", a)
    if a.dim() < 2 or a.shape[-1] != a.shape[-2]:
        raise ValueError(f"a: expected square matrices (..., m, m), got shape {tuple(a.shape)}")
    check_positive_int("iters", iters)
    col = a.abs().sum(dim=-2).amax(dim=-1)
    row = a.abs().sum(dim=-1).amax(dim=-1)
    z = a.transpose(-1, -2) / (col * row)[..., None, None]
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    for _ in range(iters):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


def segment_means(x: torch.Tensor, num_landmarks: int, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Means of ``num_landmarks`` contiguous segments along N.  x: (B, H, N, d) -> (B, H, m, d).

    key_padding_mask: (B, N) bool, True = padding: segments of each sequence's valid tokens only."""
    if key_padding_mask is not None:
        return masked_pool_matrix(key_padding_mask, num_landmarks, x.dtype)[:, None] @ x
    # the library's pooling op (same bins as F.adaptive_avg_pool1d, whose CUDA kernel fails at N = 8281, m = 49
    # on torch 2.11: "Couldn't reduce launch bounds to accommodate sharedMemPerBlock limit")
    return pool_landmarks(x, None, num_landmarks)


def nystrom_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    num_landmarks: int = 49,
    iters: int = 6,
    scale: float | None = None,
    key_padding_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Nyström approximation of softmax(Q Kᵀ · scale) V in O(N·m·d + m³).

    Args:
        q, k: (B, H, N, d); v: (B, H, N, d_v).
        num_landmarks: m segments, 1 <= m <= N (m = N: every token is a landmark).
        iters: steps of ``iterative_pinv``; scale: logit scale, None means d**-0.5.
        key_padding_mask: (B, N) bool, True = padding: segments over valid tokens, padded keys masked out
            of B, padded tokens read as 0 (no gradient), their output rows 0 (docs/DESIGN.md §2.5).
    Returns:
        (B, H, N, d_v) in v's dtype; half-precision inputs are computed in float32.
    """
    check_qkv(q, k, v)
    n = q.shape[2]
    check_positive_int("num_landmarks", num_landmarks)
    if num_landmarks > n:
        raise ValueError(f"num_landmarks: expected at most N = {n}, got {num_landmarks}")
    check_positive_int("iters", iters)
    s = q.shape[-1] ** -0.5 if scale is None else check_positive("scale", scale)
    dtype = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    mask = check_key_padding_mask(key_padding_mask, q.shape[0], n)
    qq, kk, vv = q.to(dtype) * s, k.to(dtype), v.to(dtype)
    if mask is not None:
        pad = mask[:, None, :, None]
        qq, kk, vv = (t.masked_fill(pad, 0.0) for t in (qq, kk, vv))
    q_marks, k_marks = segment_means(qq, num_landmarks, mask), segment_means(kk, num_landmarks, mask)
    f = torch.softmax(qq @ k_marks.transpose(-1, -2), dim=-1)
    a = torch.softmax(q_marks @ k_marks.transpose(-1, -2), dim=-1)
    logits = q_marks @ kk.transpose(-1, -2)
    if mask is not None:
        logits = logits.masked_fill(mask[:, None, None, :], float("-inf"))
    b = torch.softmax(logits, dim=-1)
    out = f @ (iterative_pinv(a, iters) @ (b @ vv))
    return (out if mask is None else out.masked_fill(pad, 0.0)).to(v.dtype)


# the matrix Nyströmformer approximates: softmax attention, materialised densely
nystrom_attention_dense = softmax_attention_naive


class NystromAttention(TokenAttention):
    """Multi-head Nyströmformer attention with the ``LaplacianAttention`` interface: forward(x, hw).

    Args: dim, num_heads, qkv_bias, attn_drop, proj_drop as in ``TokenAttention``;
    num_landmarks: m (default 49, the 7×7 count of LaplacianAttention); when m >= N every token is
        a landmark and exact softmax attention is used, as in the paper's code;
    iters: pseudo-inverse steps (default 6, the paper's); qk_scale: logit scale (None: d**-0.5).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        num_landmarks: int = 49,
        iters: int = 6,
        qk_scale: float | None = None,
        **kwargs,
    ) -> None:
        super().__init__(dim, num_heads, **kwargs)
        self.num_landmarks = check_positive_int("num_landmarks", num_landmarks)
        self.iters = check_positive_int("iters", iters)
        self.qk_scale = None if qk_scale is None else check_positive("qk_scale", qk_scale)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, heads={self.num_heads}, num_landmarks={self.num_landmarks}, iters={self.iters}"

    def attend(self, q, k, v, hw, key_padding_mask=None):
        if self.num_landmarks >= q.shape[2]:
            return softmax_attention(q, k, v, scale=self.qk_scale, key_padding_mask=key_padding_mask)
        return nystrom_attention(q, k, v, num_landmarks=self.num_landmarks, iters=self.iters, scale=self.qk_scale,
                                 key_padding_mask=key_padding_mask)

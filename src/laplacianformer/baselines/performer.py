"""Performer FAVOR+ attention (Choromanski et al. 2021, "Rethinking Attention with Performers").

Softmax attention estimated with positive orthogonal random features, linear in N:
    x' = x · s**0.5 (s = d**-0.5, so q'·k' = s·q·k)
    φ(x') = exp(W x' - |x'|²/2) / sqrt(M),   W (M, d): rows ω_i ~ N(0, I_d), orthogonal within blocks of d
    E[φ(q')·φ(k')] = exp(q'·k'),  so  out_i = φ(q_i)ᵀ (Σ_j φ(k_j) v_jᵀ) / φ(q_i)ᵀ Σ_j φ(k_j)
Max stabiliser (a constant that cancels): exp(ω·x' - |x'|²/2) overflows or underflows for large x', so
the exponent is shifted before the exp. Each query row subtracts its own max over features (a factor of
that query alone, identical in the numerator and the denominator of its output, so it cancels); the
keys subtract one max over all keys and features of each (batch, head) (a factor shared by every term of
every sum, so it cancels as well). The largest feature of every query, and of every (batch, head)'s
keys, is then exactly exp(0)/sqrt(M): nothing overflows. The estimate is unchanged; the shifts are
detached since their gradient is zero. The key max is per (batch, head), not over the whole batch, so
samples never influence each other. With extreme logits (a nearly one-hot softmax) the random-feature
products themselves can underflow to 0/0; that is a limit of the estimator, not of the shift.
The features are drawn once from a seeded generator and kept; ``redraw_features()`` redraws them on
request (no QR decomposition inside the forward pass).
"""

from __future__ import annotations

import math

import torch

from ..ops.validation import check_float_tensor, check_key_padding_mask, check_positive, check_positive_int, check_qkv
from ..layers.token_attention import TokenAttention
from .softmax import softmax_attention_naive

__all__ = [
    "orthogonal_random_features",
    "favor_features",
    "performer_attention",
    "performer_attention_dense",
    "PerformerAttention",
]


def orthogonal_random_features(
    num_features: int, dim: int, *, generator: torch.Generator | None = None, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """(num_features, dim) projection: stacked blocks of d orthogonal directions, each row rescaled to the
    length of an independent N(0, I_d) sample (so every row is marginally Gaussian). Drawn on the CPU."""
    check_positive_int("num_features", num_features)
    check_positive_int("dim", dim)
    g = torch.randn(math.ceil(num_features / dim), dim, dim, generator=generator, dtype=torch.float64)
    qm, r = torch.linalg.qr(g)
    qm = qm * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)
    directions = qm.transpose(-1, -2).reshape(-1, dim)[:num_features]
    lengths = torch.randn(num_features, dim, generator=generator, dtype=torch.float64).norm(dim=1, keepdim=True)
    return (directions * lengths).to(dtype)


def favor_features(
    x: torch.Tensor, projection: torch.Tensor, *, is_query: bool, key_padding_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Positive random features φ(x) with the max stabiliser.  x: (B, H, N, d), projection: (M, d) -> (B, H, N, M).

    Queries: each row is divided by its largest feature; keys: all rows of a (batch, head) by one shared
    maximum (see the module docstring: the factors cancel in the attention output).
    key_padding_mask (keys only): (B, N) bool, True = padding; padded keys get φ = 0 and no part in the
    shared maximum (docs/DESIGN.md §2.5).
    """
    log_phi = x @ projection.transpose(0, 1) - 0.5 * x.pow(2).sum(-1, keepdim=True)
    dims = -1 if is_query else (-2, -1)
    if key_padding_mask is None or is_query:
        shift = log_phi.detach().amax(dim=dims, keepdim=True)
        return torch.exp(log_phi - shift) * projection.shape[0] ** -0.5
    pad = key_padding_mask[:, None, :, None]
    shift = log_phi.detach().masked_fill(pad, float("-inf")).amax(dim=dims, keepdim=True)
    return torch.exp((log_phi - shift).masked_fill(pad, float("-inf"))) * projection.shape[0] ** -0.5


def _check_projection(projection: torch.Tensor, d: int) -> None:
    check_float_tensor("projection", projection, ndim=2)
    if projection.shape[1] != d:
        raise ValueError(f"projection: expected shape (M, d) with d = {d}, got {tuple(projection.shape)}")


def performer_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    projection: torch.Tensor,
    *,
    scale: float | None = None,
    key_padding_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """FAVOR+ estimate of softmax(Q Kᵀ · scale) V in O(N·M·d).

    Args:
        q, k: (B, H, N, d); v: (B, H, N, d_v).
        projection: (M, d) random features (``orthogonal_random_features``), shared by all heads.
        scale: softmax logit scale, None means d**-0.5.
        key_padding_mask: (B, N) bool, True = padding: padded keys weigh 0, padded tokens read as 0
            (no gradient), their output rows are 0 (docs/DESIGN.md §2.5).
    Returns:
        (B, H, N, d_v) in v's dtype; half-precision inputs are computed in float32.
    """
    check_qkv(q, k, v)
    mask = check_key_padding_mask(key_padding_mask, q.shape[0], q.shape[2])
    if mask is not None:
        pad = mask[:, None, :, None]
        q, k, v = (t.masked_fill(pad, 0.0) for t in (q, k, v))
    _check_projection(projection, q.shape[-1])
    scale = q.shape[-1] ** -0.5 if scale is None else check_positive("scale", scale)
    dtype = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    root = scale**0.5
    w = projection.to(device=q.device, dtype=dtype)
    phi_q = favor_features(q.to(dtype) * root, w, is_query=True)
    phi_k = favor_features(k.to(dtype) * root, w, is_query=False, key_padding_mask=mask)
    kv = phi_k.transpose(-1, -2) @ v.to(dtype)
    denom = phi_q @ phi_k.sum(dim=-2).unsqueeze(-1)
    out = phi_q @ kv / denom
    return (out if mask is None else out.masked_fill(pad, 0.0)).to(v.dtype)


# what FAVOR+ estimates (M -> infinity): softmax attention, materialised densely
performer_attention_dense = softmax_attention_naive


class PerformerAttention(TokenAttention):
    """Multi-head FAVOR+ attention with the ``LaplacianAttention`` interface: forward(x, hw).

    Args: dim, num_heads, qkv_bias, attn_drop, proj_drop as in ``TokenAttention``;
    num_features: M random features per head (default 256, the Performer paper's usual setting);
    qk_scale: logit scale (None: d**-0.5); seed: seed of the feature draw at construction.
    The features live in the persistent buffer ``projection`` (saved with the state dict).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        num_features: int = 256,
        qk_scale: float | None = None,
        seed: int = 0,
        **kwargs,
    ) -> None:
        super().__init__(dim, num_heads, **kwargs)
        self.num_features = check_positive_int("num_features", num_features)
        self.qk_scale = None if qk_scale is None else check_positive("qk_scale", qk_scale)
        gen = torch.Generator().manual_seed(seed)
        self.register_buffer("projection", orthogonal_random_features(num_features, self.head_dim, generator=gen))

    @torch.no_grad()
    def redraw_features(self, seed: int | None = None) -> None:
        """Draws a new projection (seeded when ``seed`` is given) into the existing buffer, in place."""
        gen = torch.Generator()
        if seed is None:
            gen.seed()
        else:
            gen.manual_seed(seed)
        fresh = orthogonal_random_features(self.num_features, self.head_dim, generator=gen)
        self.projection.copy_(fresh)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, heads={self.num_heads}, num_features={self.num_features}"

    def attend(self, q, k, v, hw, key_padding_mask=None):
        return performer_attention(q, k, v, self.projection, scale=self.qk_scale, key_padding_mask=key_padding_mask)

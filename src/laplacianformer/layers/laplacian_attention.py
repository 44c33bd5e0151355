"""``LaplacianAttention``: the attention block of LaplacianFormer as an nn.Module (DESIGN.md §2, §4).

Input (B, N, C) tokens and the grid size (height, width); output (B, N, C):
    q, k, v = projections of x (k = q when ``tie_qk``, the SOFT variant)
    out = proj( laplacian_attention(q, k, v) + DWConv3x3(V) )
The landmarks follow ``resolve_landmarks(..., clamp=True)``: the grid is clamped to the token grid, and
when it covers every token (m >= N) the exact kernel is used (DESIGN.md §2), so the module works at any
input resolution; an int on a 2-D grid must be a perfect square (ValueError naming ``landmarks``), and on a
1-D sequence a (lh, lw) grid counts lh·lw landmarks, as in the operator (the default is m = 49 either way).
``forward(x, hw=None, key_padding_mask=None)``: a (B, N) padding mask (True = padding) follows
docs/DESIGN.md §2.5; with Nyström landmarks only on 1-D sequences.
"""

from __future__ import annotations

import torch

from ..ops.attention import laplacian_attention
from ..ops.validation import KERNELS, NORMS, SOLVERS, check_choice, check_landmarks, check_positive, resolve_landmarks
from .token_attention import TokenAttention


class LaplacianAttention(TokenAttention):
    """Multi-head Laplacian–Nyström attention with a depthwise-conv value path.

    Args:
        dim: channels C (divisible by num_heads).
        num_heads: heads H; head dim d = C / H.
        landmarks: landmark grid per head (default 7×7, m = 49; on a 1-D sequence lh·lw landmarks), an int
            (a perfect square on a 2-D grid), or None (exact); checked here (docs/DESIGN.md §2.2).
        lam, qk_scale, norm, solver, iters, ns_eps, kernel: passed to ``laplacian_attention``.
        qkv_bias: bias in the q/k/v projection.
        tie_qk: use K = Q (SOFT's symmetric variant); removes the key projection.
        dwconv: add a 3×3 depthwise conv of V on the token grid (1-D: kernel 3) to the output.
        attn_drop: dropout on the attention output before the projection; proj_drop: after it.
        recompute: recompute the q/k product and the kernel matrices in the backward instead of keeping
            them (see ``TokenAttention``).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        landmarks=(7, 7),
        lam: float = 4.0,
        qkv_bias: bool = True,
        qk_scale: float | None = None,
        tie_qk: bool = False,
        dwconv: bool = True,
        norm: str = "injective",
        solver: str = "newton_schulz",
        iters: int = 20,
        ns_eps: float = 0.01,
        kernel: str = "laplacian",
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        recompute: bool = False,
    ) -> None:
        super().__init__(
            dim, num_heads, qkv_bias=qkv_bias, tie_qk=tie_qk, dwconv=dwconv, attn_drop=attn_drop,
            proj_drop=proj_drop, recompute=recompute,
        )
        check_positive("lam", lam)
        check_choice("norm", norm, NORMS)
        check_choice("solver", solver, SOLVERS)
        check_choice("kernel", kernel, KERNELS)
        self.landmarks = check_landmarks(landmarks)
        self.attn_kwargs = dict(
            lam=lam, qk_scale=qk_scale, norm=norm, solver=solver, iters=iters, ns_eps=ns_eps, kernel=kernel
        )

    def extra_repr(self) -> str:
        opts = ", ".join(f"{k}={v}" for k, v in self.attn_kwargs.items())
        return (
            f"dim={self.dim}, heads={self.num_heads}, landmarks={self.landmarks}, tie_qk={self.tie_qk}, "
            f"recompute={self.recompute}, {opts}"
        )

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hw, key_padding_mask=None) -> torch.Tensor:
        """q, k, v: (B, H, N, d), key_padding_mask: (B, N) or None -> laplacian_attention(q, k, v), (B, H, N, d).

        The landmarks are resolved from the padded length N, so every sequence of a batch takes one path."""
        grid = resolve_landmarks(self.landmarks, hw, q.shape[2], clamp=True)
        return laplacian_attention(q, k, v, hw=hw, landmarks=grid, key_padding_mask=key_padding_mask, **self.attn_kwargs)

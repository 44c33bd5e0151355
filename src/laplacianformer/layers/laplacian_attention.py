"""``LaplacianAttention``: the attention block of LaplacianFormer as an nn.Module (SPEC.md §2, §4).

Input (B, N, C) tokens and the grid size (height, width); output (B, N, C):
    q, k, v = projections of x (k = q when ``tie_qk``, the SOFT variant)
    out = proj( laplacian_attention(q, k, v) + DWConv3x3(V) )
The landmark grid is clamped to the token grid, and when it covers every token (m >= N) the exact
kernel is used (SPEC.md §2), so the module works at any input resolution.
"""

from __future__ import annotations

import torch
from torch import nn

from ..ops.attention import laplacian_attention
from ..ops.validation import KERNELS, NORMS, SOLVERS, check_choice, check_head_split, check_positive


def effective_landmarks(landmarks, hw: tuple[int, int] | None, n: int):
    """The landmark layout actually used for an (h, w) grid or an n-token sequence; None means exact."""
    if landmarks is None:
        return None
    if hw is None:
        m = landmarks if isinstance(landmarks, int) else int(torch.tensor(landmarks).prod())
        return None if m >= n else m
    if isinstance(landmarks, int):
        side = round(landmarks**0.5)
        landmarks = (side, side)
    lh, lw = min(landmarks[0], hw[0]), min(landmarks[1], hw[1])
    return None if lh * lw >= n else (lh, lw)


class LaplacianAttention(nn.Module):
    """Multi-head Laplacian–Nyström attention with a depthwise-conv value path.

    Args:
        dim: channels C (divisible by num_heads).
        num_heads: heads H; head dim d = C / H.
        landmarks: landmark grid per head (default 7×7, m = 49), an int for 1-D sequences, or None (exact).
        lam, qk_scale, norm, solver, iters, ns_eps, kernel: passed to ``laplacian_attention``.
        qkv_bias: bias in the q/k/v projection.
        tie_qk: use K = Q (SOFT's symmetric variant); removes the key projection.
        dwconv: add a 3×3 depthwise conv of V on the token grid (1-D: kernel 3) to the output.
        attn_drop: dropout on the attention output before the projection; proj_drop: after it.
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
    ) -> None:
        super().__init__()
        check_head_split(dim, num_heads)
        check_positive("lam", lam)
        check_choice("norm", norm, NORMS)
        check_choice("solver", solver, SOLVERS)
        check_choice("kernel", kernel, KERNELS)
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.landmarks = landmarks
        self.tie_qk = tie_qk
        self.attn_kwargs = dict(
            lam=lam, qk_scale=qk_scale, norm=norm, solver=solver, iters=iters, ns_eps=ns_eps, kernel=kernel
        )
        self.qkv = nn.Linear(dim, dim * (2 if tie_qk else 3), bias=qkv_bias)
        self.dwconv = nn.Conv2d(dim, dim, 3, padding=1, groups=dim) if dwconv else None
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def extra_repr(self) -> str:
        opts = ", ".join(f"{k}={v}" for k, v in self.attn_kwargs.items())
        return f"dim={self.dim}, heads={self.num_heads}, landmarks={self.landmarks}, tie_qk={self.tie_qk}, {opts}"

    def _value_conv(self, v: torch.Tensor, hw: tuple[int, int] | None) -> torch.Tensor:
        """DWConv(V): v (B, H, N, d) -> (B, H, N, d), 3×3 depthwise on the grid (1-D: kernel 3 along N)."""
        b, h, n, d = v.shape
        x = v.transpose(1, 2).reshape(b, n, h * d).transpose(1, 2)
        if hw is None:
            weight = self.dwconv.weight[:, :, 1:2, :]
            y = nn.functional.conv2d(x.unsqueeze(2), weight, self.dwconv.bias, padding=(0, 1), groups=h * d).squeeze(2)
        else:
            y = self.dwconv(x.reshape(b, h * d, hw[0], hw[1])).flatten(2)
        return y.transpose(1, 2).reshape(b, n, h, d).transpose(1, 2)

    def forward(self, x: torch.Tensor, hw: tuple[int, int] | None = None) -> torch.Tensor:
        """x: (B, N, C), hw: (height, width) with height·width = N, or None (1-D) -> (B, N, C)."""
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x: expected (B, N, {self.dim}) tokens, got shape {tuple(x.shape)}")
        b, n, c = x.shape
        parts = self.qkv(x).reshape(b, n, -1, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if self.tie_qk:
            q, v = parts.unbind(0)
            k = q
        else:
            q, k, v = parts.unbind(0)
        if hw is not None:
            hw = (int(hw[0]), int(hw[1]))
            if hw[0] * hw[1] != n:
                raise ValueError(f"hw: expected height * width == N = {n}, got {hw}")
        grid = effective_landmarks(self.landmarks, hw, n)
        out = laplacian_attention(q, k, v, hw=hw, landmarks=grid, **self.attn_kwargs)
        if self.dwconv is not None:
            out = out + self._value_conv(v, hw)
        out = self.attn_drop(out).transpose(1, 2).reshape(b, n, c)
        return self.proj_drop(self.proj(out))

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

Scripting and tracing (``layers/tracing.py``): the landmark rule and the operator are one leaf,
``laplacian_attention_leaf``: a Python call in TorchScript (``torch.jit.ignore``: a scripted model runs,
it cannot be saved with ``torch.jit.save``) and one node in a torch.fx graph (``torch.fx.wrap``).
"""

# no ``from __future__ import annotations``: TorchScript reads the leaf's annotations as real types
from typing import Any, Dict, Optional, Tuple

import torch
from torch import nn

from ..ops.attention import default_bandwidth, laplacian_attention
from ..ops.validation import NORM_SCALES, NORMS, SOLVERS, WHITENED_NORMS, check_choice, check_landmarks, resolve_landmarks
from .token_attention import TokenAttention
from .tracing import notrace


@notrace
@torch.jit.ignore
def laplacian_attention_leaf(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    hw: Optional[Tuple[int, int]],
    landmarks: Any,
    lam: float,
    qk_scale: Optional[float],
    norm: str,
    solver: str,
    iters: int,
    ns_eps: float,
    kernel: str,
    key_padding_mask: Optional[torch.Tensor] = None,
    norm_scale: str = "one",
    norm_gain: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``laplacian_attention`` with the modules' landmark rule ``resolve_landmarks(..., clamp=True)``.

    q, k, v: (B, H, N, d); hw: the token grid or None (1-D) -> (B, H, N, d). A leaf for TorchScript and
    torch.fx: the rule branches on the grid size and the operator dispatches to native kernels."""
    grid = resolve_landmarks(landmarks, hw, q.shape[2], clamp=True)
    return laplacian_attention(
        q, k, v, hw=hw, landmarks=grid, lam=lam, qk_scale=qk_scale, norm=norm, solver=solver, iters=iters,
        ns_eps=ns_eps, kernel=kernel, key_padding_mask=key_padding_mask, norm_scale=norm_scale, norm_gain=norm_gain,
    )


torch.fx.wrap("laplacian_attention_leaf")


class LaplacianAttention(TokenAttention):
    """Multi-head Laplacian–Nyström attention with a depthwise-conv value path.

    Args:
        dim: channels C (divisible by num_heads).
        num_heads: heads H; head dim d = C / H.
        landmarks: landmark grid per head (default 7×7, m = 49; on a 1-D sequence lh·lw landmarks), an int
            (a perfect square on a 2-D grid), or None (exact); checked here (docs/DESIGN.md §2.2).
        lam, qk_scale, norm, solver, iters, ns_eps, kernel: passed to ``laplacian_attention``; lam and
            qk_scale None are the kernel's defaults (Laplacian: 4 and d**-0.5; Gaussian: SOFT's 2·sqrt(d)
            on the raw q and k; docs/DESIGN.md §1.4).
        qkv_bias: bias in the q/k/v projection.
        tie_qk: use K = Q (SOFT's symmetric variant); removes the key projection.
        dwconv: add a 3×3 depthwise conv of V on the token grid (1-D: kernel 3) to the output.
        attn_drop: dropout on the attention output before the projection; proj_drop: after it.
        norm_scale: "one" (default) | "inv_sqrt_n" | "inv_n" | "learned": the output scale of the injective
            map's whitened part (docs/DESIGN.md §4.6); "learned" is "inv_sqrt_n" times a per-head gain
            ``norm_gain`` (a parameter, initialised at 1, no weight decay as a 1-D tensor).
        recompute: in training, keep x, V, the landmarks, W⁺ and the normalisation's small statistics, and
            recompute the q/k products and the two N×m kernel matrices in the backward (the lean recompute,
            docs/DESIGN.md §5.5; the exact kernel, autocast and graph capture checkpoint the core instead).

    ``attn_kwargs`` (read-only) is the dict of the operator settings (lam, qk_scale, norm, solver, iters,
    ns_eps, kernel), each also an attribute.
    """

    __jit_unused_properties__ = ["attn_kwargs"]

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        landmarks=(7, 7),
        lam: float | None = None,
        qkv_bias: bool = True,
        qk_scale: float | None = None,
        tie_qk: bool = False,
        dwconv: bool = True,
        norm: str = "injective",
        solver: str = "newton_schulz",
        iters: int = 20,
        ns_eps: float = 0.01,
        kernel: str = "laplacian",
        norm_scale: str = "one",
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        recompute: bool = False,
    ) -> None:
        super().__init__(
            dim, num_heads, qkv_bias=qkv_bias, tie_qk=tie_qk, dwconv=dwconv, attn_drop=attn_drop,
            proj_drop=proj_drop, recompute=recompute,
        )
        # the kernel's defaults resolved once (and lam, qk_scale, kernel validated): the stored settings are
        # the function computed, whatever was left to the defaults
        lam, qk_scale = default_bandwidth(kernel, self.head_dim, lam, qk_scale)
        check_choice("norm", norm, NORMS)
        check_choice("solver", solver, SOLVERS)
        check_choice("norm_scale", norm_scale, (*NORM_SCALES, "learned"))
        if norm_scale != "one" and norm not in WHITENED_NORMS:
            raise ValueError(f"norm_scale: scales the whitened part of norm in {list(WHITENED_NORMS)} "
                             f"(docs/DESIGN.md §4.6), got norm={norm!r} with norm_scale={norm_scale!r}")
        self.landmarks = check_landmarks(landmarks)
        # plain typed attributes (not a dict of mixed types), so the module scripts
        self.lam = float(lam)
        self.qk_scale = None if qk_scale is None else float(qk_scale)
        self.norm = norm
        self.solver = solver
        self.iters = iters
        self.ns_eps = float(ns_eps)
        self.kernel = kernel
        self.norm_scale = "inv_sqrt_n" if norm_scale == "learned" else norm_scale
        self.register_parameter("norm_gain", nn.Parameter(torch.ones(num_heads)) if norm_scale == "learned" else None)

    @property
    def attn_kwargs(self) -> dict:
        """The operator settings passed to ``laplacian_attention``."""
        return dict(lam=self.lam, qk_scale=self.qk_scale, norm=self.norm, solver=self.solver, iters=self.iters,
                    ns_eps=self.ns_eps, kernel=self.kernel, norm_scale=self.norm_scale)

    def extra_repr(self) -> str:
        opts = ", ".join(f"{k}={v}" for k, v in self.attn_kwargs.items())
        return (
            f"dim={self.dim}, heads={self.num_heads}, landmarks={self.landmarks}, tie_qk={self.tie_qk}, "
            f"recompute={self.recompute}, {opts}"
        )

    def lean_settings(self, x: torch.Tensor, hw: Optional[Tuple[int, int]]) -> Optional[Dict[str, Any]]:
        """``laplacian_attention_recompute``'s arguments for this layer: the q and k row blocks of ``qkv``
        (k None when ``tie_qk``), the heads, the landmark grid resolved for x (None: the exact kernel, which
        the op ``recompute`` checkpoints) and the operator settings."""
        q_weight, q_bias = self._row_block(0)
        k_weight, k_bias = (None, None) if self.tie_qk else self._row_block(1)
        return dict(q_weight=q_weight, q_bias=q_bias, k_weight=k_weight, k_bias=k_bias, num_heads=self.num_heads,
                    landmarks=resolve_landmarks(self.landmarks, hw, x.shape[1], clamp=True), norm_gain=self.norm_gain,
                    **self.attn_kwargs)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hw: Optional[Tuple[int, int]],
               key_padding_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """q, k, v: (B, H, N, d), key_padding_mask: (B, N) or None -> laplacian_attention(q, k, v), (B, H, N, d).

        The landmarks are resolved from the padded length N, so every sequence of a batch takes one path."""
        return laplacian_attention_leaf(
            q, k, v, hw, self.landmarks, self.lam, self.qk_scale, self.norm, self.solver, self.iters, self.ns_eps,
            self.kernel, key_padding_mask, self.norm_scale, self.norm_gain,
        )

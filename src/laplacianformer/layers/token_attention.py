"""Shared nn.Module shell of every attention layer: the (x: (B, N, C), hw) interface.

    q, k, v = split_heads(Linear(x))        (k = q when ``tie_qk``)
    out = proj( attend(q, k, v, hw) [+ DWConv3x3(V) when ``dwconv``] )
q, k and v are computed as three products with row blocks of one weight, so each stays contiguous in
token layout, and the heads are merged by adding them into DWConv(V), without extra copies. A layer whose op
can do the merge itself (``merges_value_conv``: ``LaplacianAttention``, whose streaming output pass fuses
the conv on CUDA) gets eager inference calls without a mask or prefix tokens in ``_attend_value_conv``; where
the Triton passes read q and k through their strides, q and k there come from one product of the stacked row
blocks (``_project_qk_stacked``); on the CPU, whose C loops read row strides, q, k and v are strided views of one
product with the whole weight (``_project_qkv``). Such a layer's training calls there (``trains_from_qkv``: autograd, no mask,
no prefix tokens, no ``qk_norm`` or ``recompute``) take ``_attend_from_qkv``: one product with the whole qkv
weight, whose (B, N, 3C) output the op reads in place and whose gradient it returns in one tensor.
Subclasses (``LaplacianAttention`` and the baselines) implement ``attend`` on (B, H, N, d) tensors with
their functional op, so a model or a benchmark can swap any of them for another.

torch.fx (``layers/tracing.py``): the argument checks, the fused paths and ``recompute`` run in eager mode only;
an FX graph merges the heads out of place instead of in place (the same values). ``_forward_plain``, the path
every graph takes, is also what ``torch.jit.script`` compiles of the layer (with its helpers ``_attend_tokens``,
the projections and ``_value_conv``), through the layer's script form (``layers/scripting.py``): those methods
stay TorchScript-compatible; the layer files hold no scripting code.
``recompute`` (docs/DESIGN.md §5.5) runs ``_attend_recompute``: here activation checkpointing of the core;
``LaplacianAttention`` overrides it with the op ``recompute`` (``ops/recompute.py``: its lean form where it
serves, else checkpointing); ``explain_recompute`` says which runs and why.
A ``key_padding_mask`` (B, N), True = padding (docs/DESIGN.md §2.5), reaches ``attend``; the shell reads
padded tokens as 0 (also in DWConv(V)) and returns 0 at padded positions.
Prefix tokens (docs/DESIGN.md §2.7): with ``num_prefix_tokens`` P > 0 (a layer that takes them:
``takes_prefix_tokens``) the first P tokens precede the grid; ``hw`` is the grid of the N - P tokens after
them, a square grid inferred from N - P when not given (``square_grid``), and DWConv(V) runs on the grid
tokens only (the prefix tokens get no conv term).
"""

from __future__ import annotations

import math
import warnings
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..ops.validation import (check_finite, check_head_split, check_key_padding_mask, check_num_prefix_tokens,
                              check_prefix_layout, reject_attn_mask)
from ..ops._runtime import choices_token, is_recording
from .grid_conv import GridConv2d, grid_to_tokens, tokens_to_grid
from .plan import CallKind, LayerTraits, layer_path
from .tracing import is_fx_tracing, notrace


# the shell's keyword arguments besides dwconv: a subclass passes these through unchanged
SHELL_KWARGS = ("qkv_bias", "tie_qk", "attn_drop", "proj_drop", "recompute", "qk_norm", "scale_norm", "proj_bias",
                "norm_layer", "device", "dtype", "num_prefix_tokens", "check_finite_inputs")

MAX_UNSTATED_PREFIX = 16
"""The most prefix tokens ``unstated_prefix_tokens`` looks for (timm: a class token, up to 16 register tokens)."""


def unstated_prefix_tokens(n: int, max_prefix: int = MAX_UNSTATED_PREFIX) -> int:
    """The smallest P in 1..max_prefix such that N - P tokens are a square grid of at least 2×2 while the n tokens
    are not a square: how many class / register tokens precede a grid in a call that gave neither ``hw`` nor
    ``num_prefix_tokens`` (timm's ``VisionTransformer`` with a class token); 0 when n is a square or no such P."""
    if n < 1 or math.isqrt(n) ** 2 == n:
        return 0
    for p in range(1, min(max_prefix, n - 4) + 1):
        if math.isqrt(n - p) ** 2 == n - p:
            return p
    return 0


@notrace
def square_grid(n: int, num_prefix_tokens: int) -> Tuple[int, int]:
    """(s, s) with s·s = n - num_prefix_tokens: the grid of the tokens after the prefix when ``hw`` is not given
    (docs/DESIGN.md §2.7); ValueError naming ``hw`` when n - num_prefix_tokens is not a square. An FX leaf
    (its sizes are those of the traced input)."""
    tokens = n - num_prefix_tokens
    side = int(math.floor(math.sqrt(float(max(tokens, 0))) + 0.5))
    if tokens < 1 or side * side != tokens:
        raise ValueError("hw: not given, and the N - num_prefix_tokens = " + str(n) + " - " + str(num_prefix_tokens)
                         + " = " + str(tokens) + " tokens after the prefix tokens are not a square grid; pass "
                         "hw=(height, width)")
    return side, side


torch.fx.wrap("square_grid")


class TokenAttention(nn.Module):
    """Multi-head attention shell: projections, head split, dropout, output projection.

    Args:
        dim: channels C (divisible by num_heads); num_heads: heads H, head dim d = C / H.
        qkv_bias: bias of the q/k/v projection; tie_qk: K = Q (no key projection).
        dwconv: add a 3×3 depthwise conv of V on the token grid (1-D: kernel 3) to the attention output.
        attn_drop: dropout on the attention output before the projection; proj_drop: after it.
        recompute: in training, keep only x and V (and landmark-sized tensors) for the backward and recompute
            the q/k products and the rest of the core there (docs/DESIGN.md §5.5): the lean recompute of
            the N×m kernel matrices where the layer has one (``LaplacianAttention``), else activation
            checkpointing of ``attend``. Less memory, more time. Eager mode only (a scripted or FX-traced graph
            does not recompute).
        num_prefix_tokens: P >= 0 tokens before the grid (a class token, register tokens; docs/DESIGN.md §2.7),
            for layers that take them (``takes_prefix_tokens``; ValueError otherwise): ``hw`` is then the grid
            of the N - P tokens after them, inferred as a square grid when not given (ValueError naming ``hw``
            when N - P is not a square), and DWConv(V) convolves the grid tokens only: the prefix tokens get
            no conv term.
        qk_norm, scale_norm, proj_bias, norm_layer: timm's ``Attention`` arguments, so the layer drops into
            timm's blocks (``VisionTransformer(attn_layer=LaplacianAttention)``): ``norm_layer`` (default
            ``nn.LayerNorm``) of the head dim on q and k (``qk_norm``), of the channels before the output
            projection (``scale_norm``); ``proj_bias``: bias of the output projection; ``device``, ``dtype``:
            where and in which dtype the parameters are made. A layer that takes prefix tokens, built with a
            ``norm_layer`` (timm's blocks pass one) and without ``num_prefix_tokens``, warns once when called
            without ``hw`` on N tokens that are a class / register token or a few before a square grid
            (``unstated_prefix_tokens``): they would be pooled and convolved as tokens of a 1-D sequence.
        check_finite_inputs: raise ValueError naming ``x`` and the first batch index when x holds NaN or Inf
            (padded tokens are not checked); off by default (no cost). Eager mode only.
    """

    takes_prefix_tokens = False
    """Whether ``attend`` handles prefix tokens (``num_prefix_tokens``, docs/DESIGN.md §2.7)."""
    merges_value_conv = False
    """Whether ``_attend_value_conv`` computes the heads merged + DWConv(V) in one op call (its inference path)."""
    trains_from_qkv = False
    """Whether ``_attend_from_qkv`` computes a training call's heads merged + DWConv(V) from the one qkv product."""

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        qkv_bias: bool = True,
        tie_qk: bool = False,
        dwconv: bool = False,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        recompute: bool = False,
        qk_norm: bool = False,
        scale_norm: bool = False,
        proj_bias: bool = True,
        norm_layer: Optional[type] = None,
        device=None,
        dtype=None,
        num_prefix_tokens: int = 0,
        check_finite_inputs: bool = False,
    ) -> None:
        super().__init__()
        check_head_split(dim, num_heads)
        check_num_prefix_tokens(num_prefix_tokens)
        if num_prefix_tokens and not self.takes_prefix_tokens:
            raise ValueError(f"num_prefix_tokens: {type(self).__name__} takes no prefix tokens, "
                             f"got {num_prefix_tokens} (LaplacianAttention does)")
        self.num_prefix_tokens = num_prefix_tokens
        self.check_finite_inputs = bool(check_finite_inputs)
        # built by timm's blocks (they pass norm_layer) without prefix tokens: a class token would go unnoticed
        self._unstated_prefix = norm_layer is not None and self.takes_prefix_tokens and not num_prefix_tokens
        self.recompute = recompute
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.tie_qk = tie_qk
        self.qkv = nn.Linear(dim, dim * (2 if tie_qk else 3), bias=qkv_bias)
        self.dwconv = GridConv2d(dim, dim, 3, padding=1, groups=dim) if dwconv else None
        norm = nn.LayerNorm if norm_layer is None else norm_layer
        self.q_norm = norm(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = norm(self.head_dim) if qk_norm and not tie_qk else nn.Identity()
        self.qk_norm = qk_norm
        self.attn_drop = nn.Dropout(attn_drop)
        self.norm = norm(dim) if scale_norm else nn.Identity()
        self.proj = nn.Linear(dim, dim, bias=proj_bias)
        self.proj_drop = nn.Dropout(proj_drop)
        self._lean_calls: Optional[dict] = None  # a layer with a lean inference path: {signature: plan}
        if device is not None or dtype is not None:
            self.to(device=device, dtype=dtype)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hw: Optional[Tuple[int, int]],
               key_padding_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """q, k, v: (B, H, N, d), key_padding_mask: (B, N) bool or None -> (B, H, N, d)."""
        raise NotImplementedError

    def _row_block(self, part: int) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """(weight, bias) of row block ``part`` of the ``qkv`` projection (q, k, v order; q, v when ``tie_qk``)."""
        rows = slice(part * self.dim, (part + 1) * self.dim)
        bias = self.qkv.bias
        return self.qkv.weight[rows], None if bias is None else bias[rows]

    def _rows(self, x: torch.Tensor, part: int) -> torch.Tensor:
        """x (B, N, C) -> (B, N, C): the product with row block ``part`` of the ``qkv`` weight."""
        weight, bias = self._row_block(part)
        return F.linear(x, weight, bias)

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        """(B, N, C) -> (B, H, N, d) view."""
        b, n, _ = t.shape
        return t.view(b, n, self.num_heads, self.head_dim).transpose(1, 2)

    def _project_qk(self, x: torch.Tensor):
        """x (B, N, C) -> q, k (B, H, N, d) (k = q when ``tie_qk``).

        q, k and v are three products with row blocks of the one ``qkv`` weight (the same parameters
        and work as a single 3C product). Each result is contiguous in token layout, so v needs no copy
        for the depthwise conv, the CPU kernels read q and k in place, and the backward gets each
        gradient without scattering it into a (B, N, 3C) buffer."""
        q = self._heads(self._rows(x, 0))
        return self._normed_qk(q, q if self.tie_qk else self._heads(self._rows(x, 1)))

    def _normed_qk(self, q: torch.Tensor, k: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """q, k after ``q_norm`` / ``k_norm`` with ``qk_norm`` (k = q when ``tie_qk``); without it they are
        identities, not called."""
        if not self.qk_norm:
            return q, k
        q = self.q_norm(q)
        return q, q if self.tie_qk else self.k_norm(k)

    def _project_qk_stacked(self, x: torch.Tensor):
        """x (B, N, C) -> q, k (B, H, N, d) from one product with the stacked q and k row blocks of ``qkv`` (not
        ``tie_qk``): strided views of its (B, N, 2C) output (row stride 2C). One launch instead of two where
        the kernels read row strides (the Triton passes); the CPU path keeps ``_project_qk``'s contiguous q, k."""
        rows = slice(0, 2 * self.dim)
        bias = self.qkv.bias
        qk = F.linear(x, self.qkv.weight[rows], None if bias is None else bias[rows])
        return self._normed_qk(self._heads(qk[..., :self.dim]), self._heads(qk[..., self.dim:]))

    def _project_qkv(self, x: torch.Tensor):
        """x (B, N, C) -> q, k (B, H, N, d) (k = q when ``tie_qk``) and v_tok (B, N, C): strided views of one
        product with the whole ``qkv`` weight (row stride 3C, 2C when ``tie_qk``). One GEMM instead of three,
        for inference calls whose kernels read row strides (the CPU's C loops)."""
        c = self.dim
        qkv = self.qkv(x)
        q = self._heads(qkv[..., :c])
        q, k = self._normed_qk(q, q if self.tie_qk else self._heads(qkv[..., c:2 * c]))
        return q, k, qkv[..., qkv.shape[-1] - c:]

    def _project_v(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, N, C) -> v_tok (B, N, C), contiguous."""
        return self._rows(x, 1 if self.tie_qk else 2)

    def _attend_tokens(self, x: torch.Tensor, v: torch.Tensor, hw: Optional[Tuple[int, int]],
                       key_padding_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        q, k = self._project_qk(x)
        return self.attend(q, k, v, hw, key_padding_mask)

    def _attend_recompute(self, x: torch.Tensor, v: torch.Tensor, hw: Optional[Tuple[int, int]],
                          key_padding_mask: Optional[torch.Tensor]) -> torch.Tensor:
        """The core with recomputation in the backward (docs/DESIGN.md §5.5): activation checkpointing of
        ``_attend_tokens``; a layer with a lean form overrides this."""
        return checkpoint(self._attend_tokens, x, v, hw, key_padding_mask, use_reentrant=False)

    def explain_recompute(self, x: torch.Tensor, hw: Optional[Tuple[int, int]] = None,
                          key_padding_mask: Optional[torch.Tensor] = None) -> str:
        """Which recomputation ``recompute=True`` runs for this input and why. x: (B, N, C) tokens."""
        return (f"{type(self).__name__}: runs 'checkpoint' (torch.utils.checkpoint of the core): the layer gives "
                "no lean settings (only LaplacianAttention's operator has a lean form)")

    def _value_conv(self, v_tok: torch.Tensor, hw: tuple[int, int] | None) -> torch.Tensor:
        """DWConv(V): v_tok (B, N, C) -> (B, N, C), 3×3 depthwise on the grid (1-D: kernel 3 along N).

        The grid is a channels-last view of the tokens, so the convolution reads and writes token layout.
        With ``num_prefix_tokens`` P > 0 it convolves the N - P grid tokens and the P prefix rows are 0
        (docs/DESIGN.md §2.7)."""
        if self.num_prefix_tokens > 0:
            prefix = self.num_prefix_tokens
            return F.pad(self._grid_conv(v_tok[:, prefix:], hw), (0, 0, prefix, 0))
        return self._grid_conv(v_tok, hw)

    def _grid_conv(self, v_tok: torch.Tensor, hw: tuple[int, int] | None) -> torch.Tensor:
        """The depthwise conv of ``_value_conv`` on tokens that are all grid tokens: (B, N, C) -> (B, N, C)."""
        b, n, c = v_tok.shape
        if hw is None:
            weight = self.dwconv.weight[:, :, 1:2, :]
            y = F.conv2d(v_tok.transpose(1, 2).unsqueeze(2), weight, self.dwconv.bias, padding=(0, 1), groups=c)
            return y.squeeze(2).transpose(1, 2)
        return grid_to_tokens(self.dwconv(tokens_to_grid(v_tok, hw)))

    def _attend_value_conv(self, x: torch.Tensor, hw: Optional[Tuple[int, int]], key=None) -> torch.Tensor:
        """x (B, N, C) -> (B, N, C): the projections, then the heads merged + DWConv(V), for layers with
        ``merges_value_conv``; with ``key`` (``_lean_key``'s signature of this call), the call also plans the
        signature's later calls into ``_lean_calls``."""
        raise NotImplementedError

    def _lean_key(self, x: torch.Tensor, hw) -> Optional[tuple]:
        """The signature of this call for the plans of ``_lean_calls`` (docs/DESIGN.md §6.6), or None where no
        plan may serve it: a layer without lean calls, autograd, a tensor subclass or an FX proxy, a torch.jit
        trace, torch.compile / torch.export, ``explain``'s recording, or an ``hw`` that is not None or a tuple.
        The signature holds all a call's plan depends on besides the values: x's shape, dtype and device,
        ``hw``, autocast and the backend choices in force (``ops.use`` / ``ops.configure``)."""
        if (self._lean_calls is None or torch.is_grad_enabled() or type(x) is not torch.Tensor
                or not (hw is None or type(hw) is tuple) or torch.jit.is_tracing()
                or torch.compiler.is_compiling() or is_recording()):
            return None
        return x.shape, hw, x.dtype, x.device, torch.is_autocast_enabled(x.device.type), choices_token()

    def _lean_value_conv(self, x: torch.Tensor, plan) -> torch.Tensor:
        """The heads merged + DWConv(V) (B, N, C) of x (B, N, C) by a plan of ``_lean_calls``."""
        raise NotImplementedError

    def _path(self, x: torch.Tensor, mask: Optional[torch.Tensor], device_fused: bool) -> str:
        """The path of this call (``layers.plan.layer_path``, docs/DESIGN.md §5.7). Eager mode only."""
        grad_mode = torch.is_grad_enabled()
        traits = LayerTraits(self.merges_value_conv, self.trains_from_qkv, self.dwconv is not None,
                             self.num_prefix_tokens > 0, self.qk_norm, self.recompute)
        call = CallKind(mask is not None, grad_mode, grad_mode and (x.requires_grad or self.qkv.weight.requires_grad),
                        torch.jit.is_tracing() or torch.compiler.is_compiling(), device_fused)
        return layer_path(traits, call)

    def _fused_device(self, x: torch.Tensor) -> bool:
        """Whether ``_attend_from_qkv`` runs on x's device (for layers with ``trains_from_qkv``)."""
        return False

    def _attend_from_qkv(self, x: torch.Tensor, hw: Optional[Tuple[int, int]]) -> torch.Tensor:
        """x (B, N, C) -> the heads merged + DWConv(V) (B, N, C) from the one qkv product, for layers with
        ``trains_from_qkv`` on a device of ``_fused_device``."""
        raise NotImplementedError

    def _check_tokens(self, x: torch.Tensor, hw: Optional[Tuple[int, int]], mask: Optional[torch.Tensor]) -> None:
        """The checks of one eager call's tokens x (B, N, C): ``check_finite_inputs``, and the warning (once per
        layer) about prefix tokens the layer was not told of (``unstated_prefix_tokens``; timm's
        ``VisionTransformer`` with a class token calls without ``hw`` or a mask)."""
        if self.check_finite_inputs:
            check_finite("x", x, mask)
        p = unstated_prefix_tokens(x.shape[1]) if self._unstated_prefix and hw is None and mask is None else 0
        if p:
            self._unstated_prefix = False
            side = math.isqrt(x.shape[1] - p)
            name = type(self).__name__
            warnings.warn(
                f"{name}: called without hw on N = {x.shape[1]} tokens, and N - {p} = {side}x{side}: if the first "
                f"{p} token(s) are class or register tokens (timm's VisionTransformer with class_token or "
                "reg_tokens), the layer now reads them as ordinary tokens of a 1-D sequence, pooled into the "
                f"landmarks and convolved with the grid tokens; build it with num_prefix_tokens={p} "
                f"(attn_layer={name}.with_options(num_prefix_tokens={p})) to pool and convolve the {side}x{side} "
                "grid after them (docs/DESIGN.md §2.7). Said once per layer.", UserWarning, stacklevel=3)

    def _layout(self, n: int, hw: Optional[Tuple[int, int]]) -> Optional[Tuple[int, int]]:
        """The checked grid of the tokens after the prefix (the square one when ``hw`` is None and there are
        prefix tokens; docs/DESIGN.md §2.7) for n tokens. Eager mode only."""
        if hw is None and self.num_prefix_tokens > 0:
            check_num_prefix_tokens(self.num_prefix_tokens, n)
            hw = square_grid(n, self.num_prefix_tokens)
        return check_prefix_layout(hw, n, self.num_prefix_tokens)[1]

    def forward(
        self,
        x: torch.Tensor,
        hw: Optional[Tuple[int, int]] = None,
        key_padding_mask: Optional[torch.Tensor] = None,
        attn_mask: Optional[torch.Tensor] = None,
        is_causal: bool = False,
    ) -> torch.Tensor:
        """x: (B, N, C), hw: (height, width) with height·width = N - num_prefix_tokens, or None (1-D; with
        prefix tokens: the square grid of the N - num_prefix_tokens tokens) -> (B, N, C).

        key_padding_mask: (B, N) bool, True = padding (docs/DESIGN.md §2.5); padded rows of the output are 0
        and padded inputs get no gradient. attn_mask / is_causal: rejected (ValueError saying why).
        The checks run in eager mode only (not while FX traces; a scripted layer: ``layers/scripting.py``)."""
        key = self._lean_key(x, hw) if key_padding_mask is None and attn_mask is None and not is_causal else None
        if key is not None:
            plan = self._lean_calls.get(key)
            if plan:  # a signature whose first call passed the checks below and planned the lean path
                merged = self._lean_value_conv(x, plan)
                if self.training:  # dropout is active (in eval mode the identity, not called)
                    return self.proj_drop(self.proj(self.norm(self.attn_drop(merged))))
                return self.proj(merged if type(self.norm) is nn.Identity else self.norm(merged))
        if is_fx_tracing():  # a graph: no checks, no fused paths; the prefix grid from a leaf
            if hw is None and self.num_prefix_tokens > 0:
                hw = square_grid(x.shape[1], self.num_prefix_tokens)
            return self._forward_plain(x, hw, key_padding_mask, False, False)
        reject_attn_mask(attn_mask, is_causal)
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x: expected (B, N, {self.dim}) tokens, got shape {tuple(x.shape)}")
        hw = self._layout(x.shape[1], hw)
        mask = check_key_padding_mask(key_padding_mask, x.shape[0], x.shape[1])
        self._check_tokens(x, hw, mask)
        path = self._path(x, mask, self._fused_device(x))
        if path == "fused_training":  # the core and DWConv(V) fused, forward and backward
            return self.proj_drop(self.proj(self.norm(self.attn_drop(self._attend_from_qkv(x, hw)))))
        if path == "value_conv":  # eager inference: heads merged + DWConv(V) in one op call
            merged = self._attend_value_conv(x, hw, key)
            return self.proj_drop(self.proj(self.norm(self.attn_drop(merged))))
        # a torch.jit trace (hence the TorchScript ONNX exporter) records no in-place op on a view
        return self._forward_plain(x, hw, mask, path == "recompute", not torch.jit.is_tracing())

    def _forward_plain(self, x: torch.Tensor, hw: Optional[Tuple[int, int]], mask: Optional[torch.Tensor],
                       recompute: bool, merge_in_place: bool) -> torch.Tensor:
        """The plain path (``layers/plan.py``): the operator on the heads (``recompute``: recomputed in the
        backward), then DWConv(V) added; x (B, N, C), hw the checked grid, mask (B, N) or None -> (B, N, C).
        ``merge_in_place``: add the heads into DWConv(V) in place where autograd records no graph of them (an
        FX graph or a torch.jit trace must not: graph passes drop or misrecord an in-place op on a view)."""
        b, n, c = x.shape
        if mask is not None:
            x = x.masked_fill(mask.unsqueeze(-1), 0.0)
        v_tok = self._project_v(x)
        if mask is not None:
            v_tok = v_tok.masked_fill(mask.unsqueeze(-1), 0.0)  # DWConv(V) reads padding as 0
        v = self._heads(v_tok)
        if recompute:
            heads = self._attend_recompute(x, v, hw, mask)
        else:
            heads = self._attend_tokens(x, v, hw, mask)
        if self.dwconv is None:
            out = heads.transpose(1, 2).reshape(b, n, c)
        elif not merge_in_place or (torch.is_grad_enabled() and (heads.requires_grad or v_tok.requires_grad)):
            # out of place: autograd of an in-place add into a view clones and copies the gradient
            out = self._value_conv(v_tok, hw) + heads.transpose(1, 2).reshape(b, n, c)
        else:
            # DWConv(V) in token layout, then the heads added into it: one pass merges the heads.
            out = self._value_conv(v_tok, hw)
            out.view(b, n, self.num_heads, self.head_dim).transpose(1, 2).add_(heads)
        out = self.proj_drop(self.proj(self.norm(self.attn_drop(out))))
        return out if mask is None else out.masked_fill(mask.unsqueeze(-1), 0.0)

"""Laplacian-kernel Nyström attention, the operator of the paper (docs/DESIGN.md §1–§4).

    q' = s·q, k' = s·k                        (s = qk_scale, default d**-0.5; DESIGN.md §1, ours;
                                               computed as k(q, k; lam / s) for the Laplacian kernel)
    L  = AdaptiveAvgPool(q') to the landmark grid (DESIGN.md §2; the grid tokens after any prefix tokens, §2.7)
    C_q = k(q', L) (N×m),  C_k = k(k', L) (N×m),  W = k(L, L) (m×m)
    W⁺ ≈ (W + eps·I)^{-1} by Newton–Schulz (DESIGN.md §3)
    ĝ  = C_q W⁺ C_kᵀ, never materialised; output = Z(ĝ) V (DESIGN.md §4)

The kernel matrices, the solver and the normalisation run in float32 for half-precision inputs and
under autocast (docs/DESIGN.md §1: exp(-D/lam) underflows in float16); the output has the inputs' dtype.
``laplacian_attention`` turns its keywords into one ``AttentionSettings`` (``ops/settings.py``, validated
there, once) and runs ``attention_with_settings``: the checks of one call's inputs against the settings,
then the core of ``ops/nystrom.py``. ``attention_with_value_conv`` is the layer's inference call: the heads
merged plus the layer's DWConv(V) (§4.5) as one (B, N, C) tensor, the conv fused into the streaming output
pass where it serves; ``attention_from_qkv`` the layer's training call from its one qkv projection, the core
and the conv in the fused passes of ``ops/streaming/training.py`` forward and backward where they serve.
``explain_all`` reports the backend decision of every dispatched call
the operator makes (docs/DESIGN.md §6).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from . import _runtime
from .dispatch import BackendRefused, selections
from .graph_rule import attention_both_sides, rule_in_graph
from .lean import lean_call, lean_trace_fits
from .nystrom import attention_core
from .pooling import pool_landmarks  # re-exported: experiments/analysis.py and bench/ import it from here
from .sequence_rule import attention_padded
from .settings import DEFAULTS, AttentionSettings, default_bandwidth
from .streaming.training import fused_training
from .validation import (
    WHITENED_NORMS,
    check_finite,
    check_float_tensor,
    check_key_padding_mask,
    check_prefix_layout,
    check_qkv,
    reject_attn_mask,
    resolve_landmarks,
)
from .value_conv import add_value_conv, check_value_conv

_MAX_PLANS = 64
"""Call signatures a ``plans`` cache keeps before it starts afresh (input sizes seen by one layer)."""

__all__ = ["AttentionSettings", "attention_from_qkv", "attention_with_settings", "attention_with_value_conv", "check_call",
           "default_bandwidth", "explain_all", "laplacian_attention", "plan_value_conv", "pool_landmarks", "remember_plan",
           "PlanCache"]


def laplacian_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    hw: tuple[int, int] | None = None,
    num_prefix_tokens: int = 0,
    landmarks=(7, 7),
    lam: float | None = None,
    qk_scale: float | None = None,
    norm: str = "injective",
    solver: str = "newton_schulz",
    iters: int = 20,
    ns_eps: float = 0.01,
    norm_eps: float = 1e-6,
    kernel: str = "laplacian",
    ns_backward: str = "implicit",
    norm_scale: str | None = None,
    norm_gain: torch.Tensor | None = None,
    check_finite_inputs: bool = False,
    return_stats: bool = False,
    key_padding_mask: torch.Tensor | None = None,
    attn_mask=None,
    is_causal: bool = False,
    settings: AttentionSettings | None = None,
):
    """Laplacian (or Gaussian) kernel attention with Nyström approximation and normalisation.

    Args:
        q, k: (B, H, N, d); v: (B, H, N, d_v).
        hw: (height, width) of a 2-D token grid with height·width = N - num_prefix_tokens; None for a 1-D
            sequence.
        num_prefix_tokens: P >= 0 (default 0), the tokens before the grid (a class token, register tokens;
            docs/DESIGN.md §2.7): they attend and are attended as every token (rows of C_q, C_k, V, of the
            output and of the statistics of §4), but the landmarks pool the N - P tokens after them only (the
            ``hw`` grid, or on a 1-D sequence the N - P tokens), and the landmark clamp of §2.2 counts those.
            The exact kernel (landmarks None) does not use P.
        landmarks: grid (lh, lw) or a perfect-square int (2-D), an int (1-D), or None for the exact
            O(N²) kernel.  Landmarks are the adaptive average pool of the scaled queries.
        lam: kernel bandwidth lambda > 0; None is the kernel's default (``default_bandwidth``: 4 for the
            Laplacian, SOFT's 2·sqrt(d) for the Gaussian; docs/DESIGN.md §1, §1.4).
        qk_scale: factor applied to q and k before the distance; None is the kernel's default
            (d**-0.5 for the Laplacian, 1 for the Gaussian, which SOFT applies to the raw q and k).
        norm: "injective" | "inline" | "rowsum" | "none" | "injective_nomean" (the injective map without
            subtracting the key mean μ_j, an ablation variant) (docs/DESIGN.md §4).
        solver: "newton_schulz" | "cg" | "exact" for (W + ns_eps·I)^{-1} (docs/DESIGN.md §3).
        iters: solver iterations; ns_eps: diagonal regulariser; norm_eps: whitening epsilon, > 0 for
            "injective" and "injective_nomean" (with 0 a key whose similarity column is constant, e.g. all-equal tokens, gives 0/0).
        kernel: a family of the registry ``kernel_families.KERNEL_FAMILIES`` (docs/DESIGN.md §1.5): "laplacian"
            exp(-||x-y||_1/lam) (the paper's), "gaussian" exp(-||x-y||²/lam), "exponential", "matern32", "cauchy".
        ns_backward: "implicit" (default) or "unrolled" gradient of the Newton–Schulz solver.
        norm_scale: "one" (the unscaled map of §4.1) | "inv_sqrt_n" | "inv_n": the whitened part of the
            injective map times N^-½ or N^-1 (N the valid keys), the 1/N row kept (docs/DESIGN.md §4.6);
            norm="injective" / "injective_nomean" only. None (default): "inv_n" for those norms, chosen on
            evidence (§7.6; "one" up to version 0.1), "one" for the others.
        norm_gain: (H,) per-head factor on the whitened part on top of ``norm_scale`` (the module's learned
            gain), or None.
        check_finite_inputs: raise ValueError naming q, k or v and the first batch index where it holds NaN/Inf
            (padded tokens are not checked: they may hold anything).
        return_stats: also return a dict with the solver residual ||I - P W⁺||_F per (B, H).
        key_padding_mask: (B, N) bool, True = padding (``nn.MultiheadAttention``'s convention;
            docs/DESIGN.md §2.5). Padded tokens weigh 0 as keys, are left out of the landmark pooling and
            of every statistic of §4 (row means, column variances, 1/N, v̄), and their output rows are 0;
            what they hold does not matter and they receive zero gradient. Each real token then gets what
            its sequence gives alone (with the same ``landmarks``), whatever its valid count: the landmark
            rule of §2.2 is applied per sequence (exact kernel where the landmarks cover its valid tokens).
            With Nyström landmarks only 1-D sequences (hw=None) take a mask; every sequence needs a valid
            token (with pooled landmarks and prefix tokens: a valid token after its prefix).
        attn_mask, is_causal: not supported (ValueError saying why): each pooled landmark averages queries
            from all positions.
        settings: an ``AttentionSettings`` standing for the operator keywords above (landmarks ... ns_backward),
            which then stay at their defaults (TypeError otherwise); made for q's head dim.

    Returns:
        (B, H, N, d_v) in the dtype of v (and the stats dict when ``return_stats``).
    """
    reject_attn_mask(attn_mask, is_causal)
    check_qkv(q, k, v)
    given = dict(kernel=kernel, lam=lam, qk_scale=qk_scale, landmarks=landmarks, norm=norm, norm_scale=norm_scale,
                 norm_eps=norm_eps, solver=solver, iters=iters, ns_eps=ns_eps, ns_backward=ns_backward)
    if settings is None:
        settings = AttentionSettings(q.shape[-1], **given)
    else:
        changed = sorted(name for name, value in given.items() if value != DEFAULTS[name])
        if changed:
            raise TypeError(f"settings: given together with the operator keywords {changed}; pass one or the other")
    return attention_with_settings(q, k, v, settings, hw=hw, num_prefix_tokens=num_prefix_tokens,
                                   key_padding_mask=key_padding_mask, norm_gain=norm_gain,
                                   check_finite_inputs=check_finite_inputs, return_stats=return_stats)


def check_call(settings: AttentionSettings, heads: int, head_dim: int, hw, grid, mask, norm_gain,
               prefix: int = 0) -> None:
    """The checks of one call against its settings (the settings themselves were checked when made):
    the inputs' head dim, a padding mask with pooled landmarks on a 2-D grid (docs/DESIGN.md §2.5) or leaving no
    valid token after the ``prefix`` prefix tokens to pool (§2.7), the per-head ``norm_gain`` (H,) of §4.6.
    Shared by the operator and the lean recompute."""
    if not isinstance(settings, AttentionSettings):
        raise TypeError(f"settings: expected an AttentionSettings, got {type(settings).__name__}")
    if settings.head_dim != head_dim:
        raise ValueError(f"settings: made for head_dim={settings.head_dim}, got inputs of head dim {head_dim}")
    if mask is not None and hw is not None and grid is not None:
        raise ValueError(
            "key_padding_mask: not supported on a 2-D token grid with pooled landmarks (the landmark bins are "
            "cells of the grid, and a padded grid has no bins matching the unpadded one); pass a 1-D sequence "
            "(hw=None) or landmarks=None (docs/DESIGN.md §2.5)"
        )
    if mask is not None and grid is not None and prefix > 0 and not _runtime.capturing() \
            and bool(mask[:, prefix:].all(-1).any()):
        raise ValueError(f"key_padding_mask: a sequence has no valid token after its num_prefix_tokens = {prefix} "
                         "prefix tokens (the landmarks pool those; docs/DESIGN.md §2.7)")
    if norm_gain is None:
        return
    if settings.norm not in WHITENED_NORMS:
        raise ValueError(f"norm_scale: scales the whitened part of norm in {list(WHITENED_NORMS)} "
                         f"(docs/DESIGN.md §4.6), got norm={settings.norm!r} with norm_scale="
                         f"{settings.norm_scale!r} and a norm_gain")
    if not isinstance(norm_gain, torch.Tensor) or not norm_gain.is_floating_point() or norm_gain.dim() != 1 \
            or norm_gain.shape[0] != heads:
        got = tuple(norm_gain.shape) if isinstance(norm_gain, torch.Tensor) else type(norm_gain).__name__
        raise ValueError(f"norm_gain: expected a floating tensor of shape ({heads},), one gain per head, got {got}")


def attention_with_settings(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, settings: AttentionSettings, *,
                            hw: tuple[int, int] | None = None, num_prefix_tokens: int = 0,
                            key_padding_mask: torch.Tensor | None = None, norm_gain: torch.Tensor | None = None,
                            check_finite_inputs: bool = False, return_stats: bool = False):
    """``laplacian_attention`` with its settings made: q, k (B, H, N, d), v (B, H, N, e) -> (B, H, N, e) in v's
    dtype (and the stats dict when ``return_stats``). The landmarks are resolved for this call by
    ``resolve_landmarks(settings.landmarks, hw, N - num_prefix_tokens)`` (docs/DESIGN.md §2.2, §2.7), the rule
    the modules follow too; while a graph for every size is exported, both of its sides
    (``graph_rule.attention_both_sides``); with a padding mask, per sequence from its valid tokens
    (``sequence_rule.attention_padded``, §2.5). ``check_finite_inputs``: ValueError naming q, k or v and the
    first batch index holding NaN/Inf (padded tokens are not checked)."""
    check_qkv(q, k, v)
    prefix, hw = check_prefix_layout(hw, q.shape[2], num_prefix_tokens)
    if not return_stats and rule_in_graph(settings.landmarks, hw, q.shape[2], prefix, key_padding_mask):
        return attention_both_sides(q, k, v, settings, hw, norm_gain)  # an export for every size (§2.2)
    grid = resolve_landmarks(settings.landmarks, hw, q.shape[2] - prefix if prefix else q.shape[2])
    mask = check_key_padding_mask(key_padding_mask, q.shape[0], q.shape[2])
    check_call(settings, q.shape[1], q.shape[-1], hw, grid, mask, norm_gain, prefix)
    if check_finite_inputs:
        for name, t in (("q", q), ("k", k), ("v", v)):
            check_finite(name, t, mask)
    if mask is not None and grid is not None:  # 1-D (check_call): the landmark rule per sequence (§2.5)
        return attention_padded(q, k, v, settings, grid, mask, norm_gain, return_stats, prefix)
    return attention_core(q, k, v, settings, hw, grid, mask, norm_gain, return_stats, prefix)


def attention_with_value_conv(q: torch.Tensor, k: torch.Tensor, v_tok: torch.Tensor, settings: AttentionSettings, *,
                              hw: tuple[int, int] | None, weight: torch.Tensor, bias: torch.Tensor | None = None,
                              norm_gain: torch.Tensor | None = None, plans: dict | None = None) -> torch.Tensor:
    """The attention heads merged + DWConv(V) (docs/DESIGN.md §4.5): (B, N, C), C = H·e, the layer's
    "attend, then add the heads into the conv's output" as one call (no padding mask, no prefix tokens).

    q, k (B, H, N, d) (``k is q`` when K = Q); v_tok (B, N, C): V in token layout, whose head view
    (B, H, N, e) is the operator's v; hw (gh, gw) or None (1-D: the conv is kernel 3 along N, the middle row of
    the weight); weight (C, 1, 3, 3), bias (C,) or None: the depthwise conv, zero padding.

    Why one call: the core then hands the conv to the streaming output pass (ops/streaming), which adds it to
    each tile it writes into the (B, N, C) buffer, so CUDA inference makes no launch for the weight's
    channels-last copy, the conv or the add (half-precision tokens included: the passes read them as they
    are). Wherever the passes do not serve (the CPU, autograd, float64, a learned gain of §4.6, the exact
    kernel, a forced ``steps``), the result is the layer's
    unfused computation by the same aten calls in the same order (``value_conv.add_value_conv``): the
    operator, the conv of the tokens, the heads added into it.

    ``plans``: the caller's cache of call signatures (a dict it keeps, e.g. one per layer) for the lean host
    path of CPU inference (``ops/lean.py``, docs/DESIGN.md §6.6): a signature's first call runs the path
    below and records its backends; when they are the lean ones, its later calls run ``lean_value_conv``
    (same bits, no per-call checks or dispatch)."""
    if plans is not None and norm_gain is None and not torch.is_grad_enabled() and not _runtime.is_recording():
        key = (q.shape, v_tok.shape, hw, q.dtype, q.device, k is q, _runtime.choices_token(),
               torch.is_autocast_enabled(q.device.type), weight.dtype, bias is None)
        plan = plans.get(key)
        if plan:
            return plan(q, k, v_tok, weight, bias)
        if plan is None:
            out, plan = plan_value_conv(q, k, v_tok, settings, hw=hw, weight=weight, bias=bias)
            remember_plan(plans, key, plan)
            return out
    check_float_tensor("v_tok", v_tok, ndim=3)
    check_float_tensor("q", q, ndim=4)
    b, n, c = v_tok.shape
    if c % q.shape[1]:
        raise ValueError(f"v_tok: expected C a multiple of the H = {q.shape[1]} heads of q, got shape "
                         f"{tuple(v_tok.shape)}")
    v = v_tok.reshape(b, n, q.shape[1], c // q.shape[1]).transpose(1, 2)  # the head view (a copy if strided)
    check_qkv(q, k, v)
    _, hw = check_prefix_layout(hw, n, 0)
    conv = check_value_conv(v_tok, hw, weight, bias)
    if rule_in_graph(settings.landmarks, hw, n, 0, None):
        heads = add_value_conv(attention_both_sides(q, k, v, settings, hw, norm_gain), conv)
    else:
        grid = resolve_landmarks(settings.landmarks, hw, n)
        check_call(settings, q.shape[1], q.shape[-1], hw, grid, None, norm_gain)
        heads = attention_core(q, k, v, settings, hw, grid, None, norm_gain, conv=conv)
    return heads.transpose(1, 2).reshape(b, n, c)


def plan_value_conv(q: torch.Tensor, k: torch.Tensor, v_tok: torch.Tensor, settings: AttentionSettings, *,
                    hw: tuple[int, int] | None, weight: torch.Tensor,
                    bias: torch.Tensor | None) -> tuple[torch.Tensor, Callable | bool]:
    """The general call of ``attention_with_value_conv`` (no learned gain, no gradient), recording the backend
    each dispatched op selects: (its output, its plan). The plan is ``lean.lean_call``'s line for the resolved
    landmarks (None: the exact kernel) when the trace is what ``lean_value_conv`` computes (``lean_trace_fits``),
    so that later calls of the same signature may run ``plan(q, k, v_tok, weight, bias)``; else False. The
    caller keys the plan on everything the trace depends on besides the values (shapes, hw, dtypes, device,
    K = Q, ``_runtime.choices_token()``, autocast) and never plans while ``_runtime.is_recording()``."""
    with selections() as trace:
        out = attention_with_value_conv(q, k, v_tok, settings, hw=hw, weight=weight, bias=bias)
    grid = resolve_landmarks(settings.landmarks, hw, v_tok.shape[1])
    fits = (q.device.type == "cpu" and q.dtype in (torch.float32, torch.float64)
            and q.dtype == k.dtype == v_tok.dtype and lean_trace_fits(trace, settings, grid))
    return out, (lean_call(q, k, v_tok, settings, hw, grid) if fits else False)


def remember_plan(plans: dict, key, plan) -> None:
    """Stores ``plan`` under ``key`` in a plan cache, which starts afresh past ``_MAX_PLANS`` signatures."""
    if len(plans) >= _MAX_PLANS:
        plans.clear()
    plans[key] = plan


class PlanCache(dict):
    """A cache of plans per call signature (``remember_plan``) that copies, deep-copies and pickles empty: its
    plans hold this process's C entry points, and a copy plans its own calls."""

    def __reduce__(self):
        return type(self), ()

    def __copy__(self):
        return type(self)()

    def __deepcopy__(self, memo):
        return type(self)()


def attention_from_qkv(qkv: torch.Tensor, settings: AttentionSettings, *, heads: int, tied: bool,
                       hw: tuple[int, int] | None, weight: torch.Tensor | None = None,
                       bias: torch.Tensor | None = None, norm_gain: torch.Tensor | None = None) -> torch.Tensor:
    """The attention heads merged (+ DWConv(V) with ``weight``) from the layer's one projection: (B, N, C), the
    layer's training call (no padding mask, no prefix tokens).

    qkv (B, N, P·C): q, k, v side by side (P = 3), or q, v (P = 2, ``tied``: K = Q); heads H, C = H·d; hw (gh, gw)
    or None (1-D); weight (C, 1, 3, 3), bias (C,) or None: the depthwise conv, or weight None (no DWConv(V)).

    Why one call: the op ``fused_training`` (ops/streaming/training.py) then runs the core and the conv in
    fused passes, forward and backward, and returns the gradient of the projection as one (B, N, P·C) tensor
    (docs/KERNELS.md, "The fused backward"; half precision and autocast included, and §4.6's ``norm_scale``).
    Wherever it does not serve (the CPU, float64, a learned gain, the exact kernel, a 1-D sequence, a forced
    ``steps``), the heads come from the operator on
    q, k, v views of qkv and the conv is added out of place, as the layer does."""
    check_float_tensor("qkv", qkv, ndim=3)
    b, n, width = qkv.shape
    parts = 2 if tied else 3
    if width % (parts * heads):
        raise ValueError(f"qkv: expected (B, N, {parts}·C) with C a multiple of the {heads} heads, got shape "
                         f"{tuple(qkv.shape)}")
    c = width // parts
    _, hw = check_prefix_layout(hw, n, 0)
    grid = None if rule_in_graph(settings.landmarks, hw, n, 0, None) else resolve_landmarks(settings.landmarks, hw, n)
    check_call(settings, heads, c // heads, hw, grid, None, norm_gain)
    if grid is not None and norm_gain is None:
        out = fused_training(qkv, settings, hw, grid, heads, tied, weight, bias)
        if out is not None:
            return out
    split = lambda t: t.view(b, n, heads, c // heads).transpose(1, 2)  # noqa: E731
    q = split(qkv[..., :c])
    k = q if tied else split(qkv[..., c:2 * c])
    tokens = qkv[..., width - c:]
    if weight is not None:
        return attention_with_value_conv(q, k, tokens, settings, hw=hw, weight=weight, bias=bias, norm_gain=norm_gain)
    heads_out = attention_with_settings(q, k, split(tokens), settings, hw=hw, norm_gain=norm_gain)
    return heads_out.transpose(1, 2).reshape(b, n, c)


def explain_all(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, backward: bool | None = None, **kwargs) -> str:
    """The backend decision of every dispatched call ``laplacian_attention(q, k, v, **kwargs)`` makes, in
    order, under the current choices (``_runtime.use``): op, input shapes, the backend that runs and why
    each other one does not (docs/DESIGN.md §6).

    q, k: (B, H, N, d); v: (B, H, N, d_v); ``kwargs`` as for ``laplacian_attention`` (hw, landmarks, ...).
    Runs the operator once on detached copies of the inputs, and its backward too when ``backward``
    (default: when q, k or v requires grad), so the report is what those calls do, not a prediction.
    A forced backend that cannot serve ends the report with its reason.
    """
    if backward is None:
        backward = any(t.requires_grad for t in (q, k, v))
    leaves = {}

    def leaf(t):
        if id(t) not in leaves:
            leaves[id(t)] = t.detach().requires_grad_(backward)
        return leaves[id(t)]

    args = (leaf(q), leaf(k), leaf(v))
    head = (f"laplacian_attention at q {tuple(q.shape)}, v {tuple(v.shape)} {str(q.dtype).removeprefix('torch.')} "
            f"{q.device.type}, " + ", ".join(f"{key}={val!r}" for key, val in kwargs.items()))
    error = None
    with _runtime.recording() as calls, torch.enable_grad() if backward else torch.no_grad():
        try:
            out = laplacian_attention(*args, **kwargs)
            if isinstance(out, tuple):
                out = out[0]
            if backward:
                torch.autograd.grad(out, list(leaves.values()), torch.ones_like(out))
        except BackendRefused as exc:
            error = str(exc)
    lines = [f"{head}{' (forward and backward)' if backward else ''}: {len(calls)} dispatched calls"]
    for i, (op, shapes, text) in enumerate(calls, 1):
        first, *rest = text.splitlines()
        lines.append(f"{i:2d}. [{shapes}] {first}")
        lines.extend("      " + line.strip() for line in rest)
    if error is not None:
        lines.append(f"stopped: {error}")
    return "\n".join(lines)

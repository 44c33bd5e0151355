"""Recomputation of the attention core for the backward (docs/DESIGN.md §5.5): the lean recompute and the op
``recompute`` that chooses between it and activation checkpointing.

``laplacian_attention_recompute(x, v, q_weight, q_bias, k_weight, k_bias, num_heads=H, ...)`` is
``laplacian_attention(q, k, v, ...)`` with q, k = the heads of ``F.linear(x, q_weight, q_bias)`` and
``F.linear(x, k_weight, k_bias)`` (K = Q when ``k_weight`` is None), as one autograd Function that runs the
core of ``ops/nystrom.py`` without autograd (``_Keeping`` steps: the same backends) and keeps for the
backward only

- x and v (the attention layer keeps both anyway: the value projection and DWConv(V) save them),
- the landmarks L (m×d per head), W⁺ (m×m) and the small autograd graph L → W = k(L, L) → W⁺ of the solver,
- the normalisation's statistics from ``normalize_nystrom_saving`` (m×m, m×e and one or two values per key),

and recomputes in the backward only the q/k projections and the two N×m kernel matrices C_q = k(Q, L),
C_k = k(K, L) (without autograd), then runs the backward formulas the plain path runs: the normalisation's
``grad`` (``normalize_nystrom_grad``; the composite recomputes its forward, having no statistics), the kernel
backends' ``grad``, the solver's backward on the kept graph, the pooling's and the projections' backward.
Without it autograd keeps q, k, C_q, C_k and the normalisation's (N, m) scratch t of every layer; activation
checkpointing (``torch.utils.checkpoint``) keeps x and V too but reruns the whole core forward, solver and
normalisation included, in the backward.

The op ``recompute`` (``ops/dispatch.py``): ``recompute_attention(x, v, projections, settings, hw=...,
key_padding_mask=..., norm_gain=..., num_prefix_tokens=...)`` is ``attend_projections`` (the modules' attention on
the projections of x, landmarks clamped to the token grid) differentiated with recomputation. Backends, in order:
``lean`` (the Function above, where the call has pooled landmarks, runs eagerly and not under autocast) and
``checkpoint`` (``torch.utils.checkpoint`` of ``attend_projections``, serves every call, the reference).
``ops.use(recompute="checkpoint")`` forces the checkpoint; ``ops.explain("recompute", ...)`` and the log name
``laplacianformer.ops.recompute`` give the reason a call is checkpointed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable
from torch.utils.checkpoint import checkpoint

from . import _runtime
from .attention import attention_with_settings, check_call
from .dispatch import Backend, Op
from .kernel import KERNEL, KERNEL_MATMUL
from .normalization import normalize_nystrom_grad, normalize_nystrom_saving, scale_whitened
from .nystrom import Steps, compute_dtype, grid_landmarks, nystrom, pad_rows, padded_inputs
from .sequence_rule import batch_rows, by_valid_count
from .settings import AttentionSettings, settings_from
from .validation import (WHITENED_NORMS, check_float_tensor, check_key_padding_mask, check_prefix_layout,
                         resolve_landmarks)

__all__ = ["RECOMPUTE", "attend_projections", "laplacian_attention_recompute", "lean_refusal", "project_heads",
           "recompute_attention"]


@dataclass(frozen=True)
class _Call:
    """What one lean call adds to its settings: the heads, the token grid, the resolved landmarks, the
    compute dtype, the prefix tokens before the grid (docs/DESIGN.md §2.7)."""

    settings: AttentionSettings
    heads: int
    hw: tuple[int, int] | None
    grid: object
    dtype: torch.dtype
    prefix: int = 0


def project_heads(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, heads: int) -> torch.Tensor:
    """x (B, N, C) -> the heads (B, H, N, d) of ``F.linear(x, weight, bias)``, a view of its output."""
    b, n, _ = x.shape
    return F.linear(x, weight, bias).view(b, n, heads, -1).transpose(1, 2)


def _factors(x, v, projections, mask, call: _Call):
    """(qs, ks, vv): the padded compute-dtype q, k (B, H, N, d) and v of the operator (ks is qs when K = Q),
    with autograd where the inputs require grad."""
    q_weight, q_bias, k_weight, k_bias = projections
    q = project_heads(x, q_weight, q_bias, call.heads)
    k = q if k_weight is None else project_heads(x, k_weight, k_bias, call.heads)
    return padded_inputs(q, k, v, call.dtype, mask)


class _Keeping(Steps):
    """The core's steps on the backends the plain path picks, without autograd, keeping what the lean backward
    needs: the solver's small graph, each kernel matrix's backend, the normalisation's backend and statistics."""

    def __init__(self) -> None:
        self.backends: dict[str, str] = {}
        self.solver_graph = None
        self.norm_backend, self.saved = None, ()

    def inverse(self, marks, s):
        # the solver's graph is m×m sized: kept, so its backward (implicit or unrolled, any solver) needs no rerun
        with torch.enable_grad():
            leaf = marks.detach().requires_grad_(True)
            w, w_inv = super().inverse(leaf, s)
        self.solver_graph = (leaf, w_inv)
        return w.detach(), w_inv.detach()

    def kernel(self, x, marks, s, side):
        backend = KERNEL.select(x, marks, s.bandwidth, s.kernel)
        self.backends[side] = backend.name
        return backend.run(x, marks, s.bandwidth, s.kernel)

    def kernel_matmul(self, x, marks, a, s):
        with torch.enable_grad():  # the backend the plain path picks, whose backward runs (grad-dependent refusals)
            backend = KERNEL_MATMUL.select(x.detach().requires_grad_(True), marks, a, s.bandwidth, s.kernel)
        self.backends["q"] = backend.name
        return backend.run(x, marks, a, s.bandwidth, s.kernel)

    def normalize(self, c_q, c_k, v, w_inv, s, mask):
        out, self.norm_backend, self.saved = normalize_nystrom_saving(c_q, c_k, v, s.norm, s.norm_eps, w_inv=w_inv,
                                                                      key_padding_mask=mask)
        return out


class _LeanAttention(torch.autograd.Function):
    """out (B, H, N, e) of ``laplacian_attention_recompute``; see the module docstring."""

    @staticmethod
    def forward(ctx, x, v, q_weight, q_bias, k_weight, k_bias, mask, call: _Call):
        qs, ks, vv = _factors(x, v, (q_weight, q_bias, k_weight, k_bias), mask, call)
        marks = grid_landmarks(qs, call.hw, call.grid, mask, call.prefix)
        steps = _Keeping()
        out, _, w_inv = nystrom(qs, ks, vv, marks, call.settings, mask, steps, scaled=False)  # scaled in _lean
        ctx.save_for_backward(x, v, q_weight, q_bias, k_weight, k_bias, mask, marks, w_inv, *steps.saved)
        ctx.call = call
        ctx.backends = (steps.backends.get("q", steps.backends["k"]), steps.backends["k"], steps.norm_backend)
        ctx.solver_graph = steps.solver_graph
        return out.to(v.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        x, v, q_weight, q_bias, k_weight, k_bias, mask, marks, w_inv, *saved = ctx.saved_tensors
        call = ctx.call
        s = call.settings
        q_name, k_name, norm_backend = ctx.backends
        tied = k_weight is None
        # 1. the projections again, with autograd from detached leaves: their backward, the padding's and the
        #    pooling's come from this small graph at the end (no N×m tensor in it)
        inputs = (x, v, q_weight, q_bias, k_weight, k_bias)
        leaves = [None if t is None else t.detach().requires_grad_(need)
                  for t, need in zip(inputs, ctx.needs_input_grad)]
        with torch.enable_grad():
            qs, ks, vv = _factors(leaves[0], leaves[1], tuple(leaves[2:]), mask, call)
            pooled = grid_landmarks(qs, call.hw, call.grid, mask, call.prefix) if qs.requires_grad else None
        qd, kd, vd = qs.detach(), ks.detach(), vv.detach()
        grad = pad_rows(grad_out.to(call.dtype), mask)
        # 2. the two N×m kernel matrices again (no autograd), then the backward formulas of the plain path
        kern_k = KERNEL.by_name[k_name]
        c_k = pad_rows(kern_k.run(kd, marks, s.bandwidth, s.kernel), mask)
        if s.norm == "none":
            with torch.enable_grad():
                ck_leaf, w_leaf, v_leaf = (t.detach().requires_grad_(True) for t in (c_k, w_inv, vd))
                a = w_leaf @ (ck_leaf.transpose(-1, -2) @ v_leaf)
            d_q, d_marks, d_a = KERNEL_MATMUL.by_name[q_name].grad(qd, marks, a.detach(), grad, s.bandwidth, s.kernel)
            d_ck, d_w_inv, d_v = torch.autograd.grad(a, (ck_leaf, w_leaf, v_leaf), d_a)
            d_cq = None
        else:
            c_q = c_k if tied else KERNEL.by_name[q_name].run(qd, marks, s.bandwidth, s.kernel)
            d_cq, d_ck, d_w_inv, d_v = normalize_nystrom_grad(norm_backend, grad, tuple(saved), c_q, c_k, vd, s.norm,
                                                              s.norm_eps, w_inv=w_inv, key_padding_mask=mask)
            d_q = d_marks = None
            if tied:  # C_q is C_k
                d_ck = _add(d_ck, d_cq)
                d_cq = None
            elif d_cq is not None:
                d_q, d_marks = KERNEL.by_name[q_name].grad(qd, marks, c_q, d_cq, s.bandwidth, s.kernel)
        d_k = None
        if d_ck is not None:
            d_k, d_marks_k = kern_k.grad(kd, marks, c_k, pad_rows(d_ck, mask), s.bandwidth, s.kernel)
            d_marks = _add(d_marks, d_marks_k)
        if tied:
            d_q, d_k = _add(d_q, d_k), None
        # 3. the solver's backward on its kept graph (retained: a second backward can run it again)
        if d_w_inv is not None:
            leaf, w_inv_graph = ctx.solver_graph
            d_marks = _add(d_marks, torch.autograd.grad(w_inv_graph, leaf, d_w_inv, retain_graph=True)[0])
        # 4. pooling, padding and projections
        pairs = [(qs, d_q), (None if tied else ks, d_k), (pooled, d_marks), (vv, d_v)]
        pairs = [(t, d) for t, d in pairs if t is not None and d is not None and t.requires_grad]
        wanted = [t for t in leaves if t is not None and t.requires_grad]
        got = iter(torch.autograd.grad([t for t, _ in pairs], wanted, [d for _, d in pairs], allow_unused=True)
                   if pairs and wanted else [None] * len(wanted))
        grads = [next(got) if t is not None and t.requires_grad else None for t in leaves]
        return (*grads, None, None)



def _add(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    if a is None:
        return b
    return a if b is None else a + b


def _check_projections(x, v, q_weight, k_weight, k_bias, num_heads: int) -> None:
    check_float_tensor("x", x)
    check_float_tensor("v", v)
    if x.dim() != 3 or v.dim() != 4 or v.shape[0] != x.shape[0] or v.shape[2] != x.shape[1] or v.shape[1] != num_heads:
        raise ValueError(f"x, v: expected (B, N, C) and (B, {num_heads}, N, e), "
                         f"got {tuple(x.shape)} and {tuple(v.shape)}")
    if q_weight.dim() != 2 or q_weight.shape[1] != x.shape[2] or q_weight.shape[0] % num_heads:
        raise ValueError(f"q_weight: expected (H·d, {x.shape[2]}) with H = {num_heads}, got {tuple(q_weight.shape)}")
    if k_weight is not None and k_weight.shape != q_weight.shape:
        raise ValueError(f"k_weight: expected shape {tuple(q_weight.shape)}, got {tuple(k_weight.shape)}")
    if k_weight is None and k_bias is not None:
        raise ValueError("k_bias: given without k_weight (K = Q takes the query projection)")


def _lean(x, v, projections, settings: AttentionSettings, hw, grid, mask, norm_gain, prefix: int = 0) -> torch.Tensor:
    """The lean Function on checked inputs (grid: pooled landmarks of the tokens after the ``prefix`` first),
    then the scale of §4.6 outside it (autograd keeps nothing N-sized for a constant scale). A padded batch
    (1-D) takes the landmark rule per sequence (``sequence_rule``, docs/DESIGN.md §2.5): the sequences whose
    valid tokens the landmarks cover run the plain operator (its exact kernel), the others the lean Function."""
    if mask is not None:
        def lean(rows):
            xs, vs, masks = (batch_rows(t, rows) for t in (x, v, mask))
            return (_lean_rows(xs, vs, projections, settings, hw, grid, masks, norm_gain, prefix),)

        def exact(rows):
            xs, vs, masks = (batch_rows(t, rows) for t in (x, v, mask))
            return (attend_projections(xs, vs, *projections, settings, hw, masks, norm_gain, prefix),)

        return by_valid_count(mask, grid, prefix, lean, exact)[0]
    return _lean_rows(x, v, projections, settings, hw, grid, mask, norm_gain, prefix)


def _lean_rows(x, v, projections, settings: AttentionSettings, hw, grid, mask, norm_gain, prefix: int = 0):
    """``_lean`` on a batch that takes the Nyström path."""
    call = _Call(settings, v.shape[1], hw, grid, compute_dtype(x.dtype), prefix)
    with torch.autocast(device_type=x.device.type, enabled=False):
        out = _LeanAttention.apply(x, v, *projections, mask, call)
        if settings.norm in WHITENED_NORMS:
            vv = pad_rows(v.to(call.dtype), mask)
            out = scale_whitened(out.to(call.dtype), vv, settings.norm_scale, norm_gain, mask).to(v.dtype)
        return out


def laplacian_attention_recompute(
    x: torch.Tensor,
    v: torch.Tensor,
    q_weight: torch.Tensor,
    q_bias: torch.Tensor | None = None,
    k_weight: torch.Tensor | None = None,
    k_bias: torch.Tensor | None = None,
    *,
    num_heads: int,
    hw: tuple[int, int] | None = None,
    num_prefix_tokens: int = 0,
    key_padding_mask: torch.Tensor | None = None,
    norm_gain: torch.Tensor | None = None,
    settings: AttentionSettings | None = None,
    **options,
) -> torch.Tensor:
    """``laplacian_attention`` of the heads of the projections of x, with the lean recompute (module docstring).

    Args:
        x: (B, N, C) tokens; v: (B, H, N, e) values (any strides).
        q_weight, q_bias: the query projection (H·d, C) and (H·d,) or None; k_weight, k_bias: the key
            projection, or k_weight None for K = Q (``tie_qk``).
        num_heads: H; the head dim is d = q_weight.shape[0] / H.
        hw, num_prefix_tokens, key_padding_mask, norm_gain: as for ``laplacian_attention`` (the landmarks pool
            the tokens after the first num_prefix_tokens, docs/DESIGN.md §2.7).
        settings, options: the operator settings, an ``AttentionSettings`` or its keywords
            (``ops.settings.OPERATOR_SETTINGS``, TypeError naming another); the landmarks must resolve to
            pooled ones (the exact kernel has no N×m factors to recompute: ValueError).

    Returns (B, H, N, e) in v's dtype: the values of ``laplacian_attention(q, k, v, ...)`` and, to round-off,
    its gradients for x, v and the projection parameters; first order only (a double backward raises).
    """
    if settings is None:
        settings = settings_from(q_weight.shape[0] // num_heads, options, "laplacian_attention_recompute")
    elif options:
        raise TypeError(f"settings: given together with the operator keywords {sorted(options)}; pass one or the other")
    _check_projections(x, v, q_weight, k_weight, k_bias, num_heads)
    n = x.shape[1]
    prefix, hw = check_prefix_layout(hw, n, num_prefix_tokens)
    grid = resolve_landmarks(settings.landmarks, hw, n - prefix)
    if grid is None:
        raise ValueError("landmarks: the lean recompute needs pooled landmarks (the exact kernel keeps N×N "
                         "matrices; use laplacian_attention, checkpointed)")
    mask = check_key_padding_mask(key_padding_mask, x.shape[0], n)
    check_call(settings, num_heads, q_weight.shape[0] // num_heads, hw, grid, mask, norm_gain, prefix)
    return _lean(x, v, (q_weight, q_bias, k_weight, k_bias), settings, hw, grid, mask, norm_gain, prefix)


def attend_projections(x, v, q_weight, q_bias, k_weight, k_bias, settings: AttentionSettings, hw, key_padding_mask,
                       norm_gain, num_prefix_tokens: int = 0) -> torch.Tensor:
    """The modules' attention on the projections of x (B, N, C): q, k = ``project_heads`` (k = q when
    ``k_weight`` is None), then ``attention_with_settings`` with the landmarks clamped to the token grid
    (docs/DESIGN.md §2.2) after the prefix tokens (§2.7). v: (B, H, N, e) -> (B, H, N, e). What ``checkpoint``
    reruns."""
    q = project_heads(x, q_weight, q_bias, v.shape[1])
    k = q if k_weight is None else project_heads(x, k_weight, k_bias, v.shape[1])
    return attention_with_settings(q, k, v, settings, hw=hw, num_prefix_tokens=num_prefix_tokens,
                                   key_padding_mask=key_padding_mask, norm_gain=norm_gain)


def lean_refusal(x: torch.Tensor, hw: tuple[int, int] | None, settings: AttentionSettings,
                 key_padding_mask: torch.Tensor | None = None, num_prefix_tokens: int = 0) -> str | None:
    """Why the lean recompute cannot stand in for the plain operator in this call (None: it can): graph
    capture, autocast, or no pooled landmarks for this token count (the modules' clamped rule)."""
    why = _runtime.capture_reason(modes=False)
    if why is not None:
        return f"{why} (the lean recompute is an eager autograd Function)"
    if torch.is_autocast_enabled(x.device.type):
        return "autocast is enabled (the lean recompute would redo the projections outside it)"
    if resolve_landmarks(settings.landmarks, hw, x.shape[1] - num_prefix_tokens) is None:
        return ("exact kernel (landmarks=None, or the grid covers every token): no N×m factors to recompute, "
                "the core keeps N×N matrices")
    return None


def _lean_refusal(x, v, projections, settings, hw, key_padding_mask, norm_gain, prefix=0) -> str | None:
    return lean_refusal(x, hw, settings, key_padding_mask, prefix)


def _lean_backend(x, v, projections, settings, hw, key_padding_mask, norm_gain, prefix=0):
    grid = resolve_landmarks(settings.landmarks, hw, x.shape[1] - prefix)
    heads = v.shape[1]
    check_call(settings, heads, projections[0].shape[0] // heads, hw, grid, key_padding_mask, norm_gain, prefix)
    return _lean(x, v, projections, settings, hw, grid, key_padding_mask, norm_gain, prefix)


def _checkpointed(x, v, projections, settings, hw, key_padding_mask, norm_gain, prefix=0):
    return checkpoint(attend_projections, x, v, *projections, settings, hw, key_padding_mask, norm_gain, prefix,
                      use_reentrant=False)


RECOMPUTE = Op("recompute", [
    Backend("lean", _lean_backend, _lean_refusal),
    Backend("checkpoint", _checkpointed),
], log="laplacianformer.ops.recompute",
    signature="recompute_attention(x, v, projections, settings, hw, key_padding_mask, norm_gain, num_prefix_tokens): "
              "x (B, N, C), v (B, H, N, e)")


def recompute_attention(x: torch.Tensor, v: torch.Tensor, projections: tuple, settings: AttentionSettings, *,
                        hw: tuple[int, int] | None = None, key_padding_mask: torch.Tensor | None = None,
                        norm_gain: torch.Tensor | None = None, num_prefix_tokens: int = 0) -> torch.Tensor:
    """``attend_projections(x, v, *projections, settings, hw, key_padding_mask, norm_gain, num_prefix_tokens)``
    -> (B, H, N, e), differentiated with recomputation (docs/DESIGN.md §5.5): backend ``lean`` where it serves,
    else ``checkpoint``. projections: (q_weight, q_bias, k_weight, k_bias), k_weight None for K = Q; x (B, N, C),
    v (B, H, N, e), hw (the grid of the N - num_prefix_tokens tokens after the prefix, §2.7), num_prefix_tokens
    and key_padding_mask checked by the caller (the layer)."""
    return RECOMPUTE(x, v, projections, settings, hw, key_padding_mask, norm_gain, num_prefix_tokens)

"""Recomputation of the attention core for the backward (docs/DESIGN.md §5.5): the lean recompute and the op
``recompute`` that chooses between it and activation checkpointing.

``laplacian_attention_recompute(x, v, q_weight, q_bias, k_weight, k_bias, num_heads=H, ...)`` is
``laplacian_attention(q, k, v, ...)`` with q, k = the heads of ``F.linear(x, q_weight, q_bias)`` and
``F.linear(x, k_weight, k_bias)`` (K = Q when ``k_weight`` is None), as one autograd Function that keeps for
the backward only

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

The op ``recompute`` (``ops/dispatch.py``): ``recompute_attention(core, x, v, hw, key_padding_mask, lean)``
returns ``core(x, v, hw, key_padding_mask)`` differentiated with recomputation. Backends, in order:
``lean`` (the Function above, where the layer gives its ``lean`` settings and the call has pooled
landmarks, runs eagerly and not under autocast) and ``checkpoint`` (``torch.utils.checkpoint`` of ``core``,
serves every call, the reference). ``ops.use(recompute="checkpoint")`` forces the checkpoint;
``ops.explain("recompute", ...)`` and the log name ``laplacianformer.ops.recompute`` give the reason a call
is checkpointed.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable
from torch.utils.checkpoint import checkpoint

from . import _runtime
from .attention import _compute_dtype, check_settings, laplacian_attention, padded_inputs
from .pooling import landmarks_of
from .dispatch import Backend, Op
from .kernel import KERNEL, KERNEL_MATMUL, laplace_kernel
from .newton_schulz import regularised_inverse
from .normalization import normalize_nystrom_grad, normalize_nystrom_saving, scale_whitened
from .validation import WHITENED_NORMS, check_float_tensor, check_hw, check_key_padding_mask, resolve_landmarks

__all__ = ["laplacian_attention_recompute", "lean_refusal", "recompute_attention", "RECOMPUTE"]


@dataclass(frozen=True)
class _Settings:
    """Everything of one lean call that is not a tensor (resolved and checked)."""

    heads: int
    hw: tuple[int, int] | None
    grid: object
    lam: float
    kernel: str
    norm: str
    norm_eps: float
    solver: str
    iters: int
    ns_eps: float
    ns_backward: str
    dtype: torch.dtype


def _factors(x, v, q_weight, q_bias, k_weight, k_bias, mask, cfg: _Settings):
    """(qs, ks, vv): the padded compute-dtype q, k (B, H, N, d) and v of ``laplacian_attention`` (ks is qs
    when K = Q), with autograd where the inputs require grad."""
    b, n, _ = x.shape
    q = F.linear(x, q_weight, q_bias).view(b, n, cfg.heads, -1).transpose(1, 2)
    k = q if k_weight is None else F.linear(x, k_weight, k_bias).view(b, n, cfg.heads, -1).transpose(1, 2)
    return padded_inputs(q, k, v, cfg.dtype, mask)


def _pad_rows(t: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    return t if mask is None else t.masked_fill(mask[:, None, :, None], 0.0)


class _LeanAttention(torch.autograd.Function):
    """out (B, H, N, e) of ``laplacian_attention_recompute``; see the module docstring."""

    @staticmethod
    def forward(ctx, x, v, q_weight, q_bias, k_weight, k_bias, mask, cfg: _Settings):
        qs, ks, vv = _factors(x, v, q_weight, q_bias, k_weight, k_bias, mask, cfg)
        marks = landmarks_of(qs, cfg.hw, cfg.grid, mask)
        # the solver's graph is m×m sized: kept, so its backward (implicit or unrolled, any solver) needs no rerun
        with torch.enable_grad():
            leaf = marks.detach().requires_grad_(True)
            w_inv_graph = regularised_inverse(laplace_kernel(leaf, leaf, cfg.lam, cfg.kernel), solver=cfg.solver,
                                              iters=cfg.iters, eps=cfg.ns_eps, backward=cfg.ns_backward)
        w_inv = w_inv_graph.detach()
        kern_k = KERNEL.select(ks, marks, cfg.lam, cfg.kernel)
        c_k = _pad_rows(kern_k.run(ks, marks, cfg.lam, cfg.kernel), mask)  # padded keys weigh 0
        if cfg.norm == "none":
            a = w_inv @ (c_k.transpose(-1, -2) @ vv)
            with torch.enable_grad():  # the backend the plain path picks, whose backward runs (grad-dependent refusals)
                kern_q = KERNEL_MATMUL.select(qs.detach().requires_grad_(True), marks, a, cfg.lam, cfg.kernel)
            out = _pad_rows(kern_q.run(qs, marks, a, cfg.lam, cfg.kernel), mask)
            norm_backend, saved = None, ()
        else:
            kern_q = kern_k if ks is qs else KERNEL.select(qs, marks, cfg.lam, cfg.kernel)
            c_q = c_k if ks is qs else kern_q.run(qs, marks, cfg.lam, cfg.kernel)
            out, norm_backend, saved = normalize_nystrom_saving(c_q, c_k, vv, cfg.norm, cfg.norm_eps, w_inv=w_inv,
                                                                key_padding_mask=mask)
        ctx.save_for_backward(x, v, q_weight, q_bias, k_weight, k_bias, mask, marks, w_inv, *saved)
        ctx.cfg = cfg
        ctx.backends = (kern_q.name, kern_k.name, norm_backend)
        ctx.solver_graph = (leaf, w_inv_graph)
        return out.to(v.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        x, v, q_weight, q_bias, k_weight, k_bias, mask, marks, w_inv, *saved = ctx.saved_tensors
        cfg = ctx.cfg
        q_name, k_name, norm_backend = ctx.backends
        tied = k_weight is None
        # 1. the projections again, with autograd from detached leaves: their backward, the padding's and the
        #    pooling's come from this small graph at the end (no N×m tensor in it)
        inputs = (x, v, q_weight, q_bias, k_weight, k_bias)
        leaves = [None if t is None else t.detach().requires_grad_(need)
                  for t, need in zip(inputs, ctx.needs_input_grad)]
        with torch.enable_grad():
            qs, ks, vv = _factors(*leaves, mask, cfg)
            pooled = landmarks_of(qs, cfg.hw, cfg.grid, mask) if qs.requires_grad else None
        qd, kd, vd = qs.detach(), ks.detach(), vv.detach()
        grad = _pad_rows(grad_out.to(cfg.dtype), mask)
        # 2. the two N×m kernel matrices again (no autograd), then the backward formulas of the plain path
        kern_k = KERNEL.by_name[k_name]
        c_k = _pad_rows(kern_k.run(kd, marks, cfg.lam, cfg.kernel), mask)
        if cfg.norm == "none":
            with torch.enable_grad():
                ck_leaf, w_leaf, v_leaf = (t.detach().requires_grad_(True) for t in (c_k, w_inv, vd))
                a = w_leaf @ (ck_leaf.transpose(-1, -2) @ v_leaf)
            d_q, d_marks, d_a = KERNEL_MATMUL.by_name[q_name].grad(qd, marks, a.detach(), grad, cfg.lam, cfg.kernel)
            d_ck, d_w_inv, d_v = torch.autograd.grad(a, (ck_leaf, w_leaf, v_leaf), d_a)
            d_cq = None
        else:
            c_q = c_k if tied else KERNEL.by_name[q_name].run(qd, marks, cfg.lam, cfg.kernel)
            d_cq, d_ck, d_w_inv, d_v = normalize_nystrom_grad(norm_backend, grad, tuple(saved), c_q, c_k, vd, cfg.norm,
                                                              cfg.norm_eps, w_inv=w_inv, key_padding_mask=mask)
            d_q = d_marks = None
            if tied:  # C_q is C_k
                d_ck = _add(d_ck, d_cq)
                d_cq = None
            elif d_cq is not None:
                d_q, d_marks = KERNEL.by_name[q_name].grad(qd, marks, c_q, d_cq, cfg.lam, cfg.kernel)
        d_k = None
        if d_ck is not None:
            d_k, d_marks_k = kern_k.grad(kd, marks, c_k, _pad_rows(d_ck, mask), cfg.lam, cfg.kernel)
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
    key_padding_mask: torch.Tensor | None = None,
    **options,
) -> torch.Tensor:
    """``laplacian_attention`` of the heads of the projections of x, with the lean recompute (module docstring).

    Args:
        x: (B, N, C) tokens; v: (B, H, N, e) values (any strides).
        q_weight, q_bias: the query projection (H·d, C) and (H·d,) or None; k_weight, k_bias: the key
            projection, or k_weight None for K = Q (``tie_qk``).
        num_heads: H; the head dim is d = q_weight.shape[0] / H.
        hw, key_padding_mask: as for ``laplacian_attention``.
        options: the operator settings ``landmarks, lam, qk_scale, norm, solver, iters, ns_eps, norm_eps, kernel,
            ns_backward``, with ``laplacian_attention``'s defaults (read from its signature: one place); the
            landmarks must resolve to pooled ones (the exact kernel has no N×m factors to recompute: ValueError).

    Returns (B, H, N, e) in v's dtype: the values of ``laplacian_attention(q, k, v, ...)`` and, to round-off,
    its gradients for x, v and the projection parameters; first order only (a double backward raises).
    """
    o = operator_options(options)
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
    n = x.shape[1]
    hw = check_hw(hw, n)
    grid = resolve_landmarks(o["landmarks"], hw, n)
    if grid is None:
        raise ValueError("landmarks: the lean recompute needs pooled landmarks (the exact kernel keeps N×N "
                         "matrices; use laplacian_attention, checkpointed)")
    mask = check_key_padding_mask(key_padding_mask, x.shape[0], n)
    head_dim = q_weight.shape[0] // num_heads
    lam = check_settings(head_dim, hw, grid, mask, o["lam"], o["qk_scale"], o["norm"], o["solver"], o["iters"],
                         o["ns_eps"], o["norm_eps"], o["kernel"], o["ns_backward"], o["norm_scale"], o["norm_gain"],
                         num_heads)
    cfg = _Settings(num_heads, hw, grid, float(lam), o["kernel"], o["norm"], float(o["norm_eps"]), o["solver"],
                    int(o["iters"]), float(o["ns_eps"]), o["ns_backward"], _compute_dtype(x.dtype))
    with torch.autocast(device_type=x.device.type, enabled=False):
        out = _LeanAttention.apply(x, v, q_weight, q_bias, k_weight, k_bias, mask, cfg)
        if cfg.norm in WHITENED_NORMS:  # the scale of §4.6, outside the Function (autograd keeps nothing N-sized
            vv = _pad_rows(v.to(cfg.dtype), mask)  # for a constant scale)
            out = scale_whitened(out.to(cfg.dtype), vv, o["norm_scale"], o["norm_gain"], mask).to(v.dtype)
        return out


OPERATOR_OPTIONS = ("landmarks", "lam", "qk_scale", "norm", "solver", "iters", "ns_eps", "norm_eps", "kernel",
                    "ns_backward", "norm_scale", "norm_gain")


def operator_options(options: dict) -> dict:
    """``options`` completed with ``laplacian_attention``'s own defaults (its signature is the one place they
    are written); a name that is not an operator setting raises TypeError naming it."""
    unknown = sorted(set(options) - set(OPERATOR_OPTIONS))
    if unknown:
        raise TypeError(f"laplacian_attention_recompute: unexpected keyword argument(s) {unknown}; "
                        f"operator settings are {list(OPERATOR_OPTIONS)}")
    params = inspect.signature(laplacian_attention).parameters
    return {name: options.get(name, params[name].default) for name in OPERATOR_OPTIONS}


def lean_refusal(x: torch.Tensor, hw: tuple[int, int] | None, landmarks,
                 key_padding_mask: torch.Tensor | None = None) -> str | None:
    """Why ``laplacian_attention_recompute`` cannot stand in for the plain operator in this call (None: it
    can): graph capture, autocast, or no pooled landmarks for this token count."""
    why = _runtime.capture_reason(modes=False)
    if why is not None:
        return f"{why} (the lean recompute is an eager autograd Function)"
    if torch.is_autocast_enabled(x.device.type):
        return "autocast is enabled (the lean recompute would redo the projections outside it)"
    if resolve_landmarks(landmarks, hw, x.shape[1]) is None:
        return ("exact kernel (landmarks=None, or the grid covers every token): no N×m factors to recompute, "
                "the core keeps N×N matrices")
    return None


def _lean_refusal(core, x, v, hw, key_padding_mask, lean) -> str | None:
    if lean is None:
        return "the layer gives no lean settings (only LaplacianAttention's operator has a lean form)"
    return lean_refusal(x, hw, lean.get("landmarks", (7, 7)), key_padding_mask)


def _lean(core, x, v, hw, key_padding_mask, lean):
    return laplacian_attention_recompute(x, v, hw=hw, key_padding_mask=key_padding_mask, **lean)


def _checkpointed(core, x, v, hw, key_padding_mask, lean):
    return checkpoint(core, x, v, hw, key_padding_mask, use_reentrant=False)


RECOMPUTE = Op("recompute", [
    Backend("lean", _lean, _lean_refusal),
    Backend("checkpoint", _checkpointed),
], log="laplacianformer.ops.recompute",
    signature="recompute_attention(core, x, v, hw, key_padding_mask, lean): x (B, N, C), v (B, H, N, e)")


def recompute_attention(core, x: torch.Tensor, v: torch.Tensor, hw: tuple[int, int] | None,
                        key_padding_mask: torch.Tensor | None, lean: dict | None) -> torch.Tensor:
    """``core(x, v, hw, key_padding_mask)`` -> (B, H, N, e), differentiated with recomputation (docs/DESIGN.md
    §5.5): backend ``lean`` runs ``laplacian_attention_recompute(x, v, hw=hw, key_padding_mask=...,
    **lean)`` (``lean``: its projection tensors and operator settings, which must compute what ``core``
    computes; None where the layer has none), else ``checkpoint`` runs ``torch.utils.checkpoint(core, ...)``.
    """
    return RECOMPUTE(core, x, v, hw, key_padding_mask, lean)

"""The attention core of docs/DESIGN.md §1–§4, one for the plain operator and the lean recompute.

    attention_core(q, k, v, settings, hw, grid, mask, norm_gain, prefix, conv) -> (B, H, N, e)
        q, k, v in the compute dtype, padded tokens 0 (§1.3, §2.5); the exact kernel when grid is None,
        else L = landmarks of the grid tokens after the ``prefix`` first ones (§2.1, §2.7) and ``nystrom``
        over all N tokens; the output scale of §4.6. The op ``landmark_solve`` (ops/streaming/landmarks.py:
        L, W and W⁺ in one launch, CUDA inference on a 2-D grid) runs instead of the pooling and the
        inverse steps when it serves. Half-precision inputs without a mask or prefix tokens go to the two
        fused ops as they are (they read them in their dtype, §1.3's float32 inside); any refusal casts them
        and runs the usual path. With ``conv`` (the layer's DWConv(V), §4.5, ``ops/value_conv.py``) the
        output is heads + DWConv(V), a (B, H, N, e) view of the (B, N, C) sum.
    nystrom(qs, ks, vv, marks, settings, mask, steps, inverse, conv, norm_gain, scaled) -> (out, W, W⁺)
        W = k(L, L), W⁺ = (W + eps·I)^{-1} (§3), or ``inverse`` = (W, W⁺) given; C_k = k(K, L), padded keys 0;
        norm "none": out = k(Q, L) (W⁺ C_kᵀ V); else out = Z(C_q W⁺ C_kᵀ) V (§4), C_q = C_k when K is Q;
        ``scaled``: then the output scale of §4.6 (a caller that scales outside, the lean recompute, says
        False); with the plain steps and no learned gain, the op ``streaming`` (ops/streaming: the same
        scaled output in fused passes over the rows, CUDA inference) runs instead of the C_k, C_q,
        normalisation and scale steps when it serves, and fuses ``conv`` into its output pass; after the
        steps the conv is added (after the scale) as the layer adds it.

``Steps`` runs each step with autograd (the plain operator). The lean recompute (``ops/recompute.py``,
§5.5) passes steps that run the same backends without autograd and keep what its backward needs: it decides
what to keep, this module how to compute.
"""

from __future__ import annotations

import torch

from .kernel import laplace_kernel, laplace_kernel_matmul
from .newton_schulz import pinv_residual, regularise, regularised_inverse
from .normalization import normalize_dense, normalize_nystrom, normalize_nystrom_scaled, scale_whitened
from .normalization.reference import plain_scale
from .pooling import landmarks_of
from .settings import AttentionSettings
from .streaming import streaming_nystrom
from .streaming.landmarks import landmark_solve
from .validation import WHITENED_NORMS
from .value_conv import ValueConv, add_value_conv

__all__ = ["PLAIN", "Steps", "attention_core", "compute_dtype", "grid_landmarks", "nystrom", "pad_rows",
           "padded_inputs", "scale_output"]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half-precision inputs (docs/DESIGN.md §1.3), else the inputs' dtype."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def pad_rows(t: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """t (B, H, N, ·) with the rows of padded tokens set to 0 (mask (B, N), True = padding, or None)."""
    return t if mask is None else t.masked_fill(mask[:, None, :, None], 0.0)


def padded_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype, mask: torch.Tensor | None):
    """q, k, v (B, H, N, ·) in the compute dtype, padded tokens read as 0 (finite whatever they held;
    masked_fill passes them no gradient). K = Q stays one tensor."""
    qs, ks, vv = q.to(dtype), k.to(dtype), v.to(dtype)
    if mask is not None:
        qs, vv = pad_rows(qs, mask), pad_rows(vv, mask)
        ks = qs if k is q else pad_rows(ks, mask)
    elif k is q:
        ks = qs
    return qs, ks, vv


def grid_landmarks(qs: torch.Tensor, hw, grid, mask: torch.Tensor | None, prefix: int = 0) -> torch.Tensor:
    """The landmarks (B, H, m, d) of the padded queries qs (B, H, N, d): the pooling of §2.1 (masked: §2.5) over
    the grid tokens only, the N - ``prefix`` tokens after the prefix tokens (docs/DESIGN.md §2.7)."""
    if prefix == 0:
        return landmarks_of(qs, hw, grid, mask)
    return landmarks_of(qs[:, :, prefix:], hw, grid, None if mask is None else mask[:, prefix:])


class Steps:
    """The steps of ``nystrom`` with autograd, through the dispatched ops (the plain operator).
    ``side`` names the kernel matrix ("q": C_q, "k": C_k) for steps that record their backend."""

    def inverse(self, marks: torch.Tensor, s: AttentionSettings) -> tuple[torch.Tensor, torch.Tensor]:
        """(W, W⁺), (B, H, m, m) each."""
        w = laplace_kernel(marks, marks, s.bandwidth, s.kernel)
        return w, regularised_inverse(w, solver=s.solver, iters=s.iters, eps=s.ns_eps, backward=s.ns_backward)

    def kernel(self, x: torch.Tensor, marks: torch.Tensor, s: AttentionSettings, side: str) -> torch.Tensor:
        """k(X, L): (B, H, N, m)."""
        return laplace_kernel(x, marks, s.bandwidth, s.kernel)

    def kernel_matmul(self, x: torch.Tensor, marks: torch.Tensor, a: torch.Tensor, s: AttentionSettings):
        """k(X, L) @ A: (B, H, N, e)."""
        return laplace_kernel_matmul(x, marks, a, s.bandwidth, s.kernel)

    def normalize(self, c_q, c_k, v, w_inv, s: AttentionSettings, mask) -> torch.Tensor:
        """Z(C_q W⁺ C_kᵀ) V: (B, H, N, e)."""
        return normalize_nystrom(c_q, c_k, v, s.norm, s.norm_eps, w_inv=w_inv, key_padding_mask=mask)


PLAIN = Steps()


def nystrom(qs, ks, vv, marks, s: AttentionSettings, mask=None, steps: Steps = PLAIN, inverse=None,
            conv: ValueConv | None = None, norm_gain=None, scaled: bool = True):
    """The Nyström path (module docstring) on padded compute-dtype factors qs, ks (B, H, N, d), vv (B, H, N, e)
    and landmarks (B, H, m, d); ks is qs when K = Q. ``inverse``: (W, W⁺) (B, H, m, m) each, already computed
    with the landmarks (the fused landmark solve), else ``steps.inverse``. ``scaled``: the output scale of
    §4.6 (``norm_gain`` (H,) or None) applied. ``conv`` (plain steps only): the output includes DWConv(V)
    (fused into the streaming output pass, else added after the steps; vv is then the head view of its
    tokens). Returns (out (B, H, N, e), W, W⁺)."""
    w, w_inv = steps.inverse(marks, s) if inverse is None else inverse
    if steps is PLAIN and scaled and norm_gain is None:  # the fused passes (CUDA inference), or None: the steps
        out = streaming_nystrom(qs, ks, vv, marks, w_inv, s, mask, conv)
        if out is not None:
            return out, w, w_inv
    c_k = pad_rows(steps.kernel(ks, marks, s, "k"), mask)  # padded keys weigh 0
    if s.norm == "none":
        out = pad_rows(steps.kernel_matmul(qs, marks, w_inv @ (c_k.transpose(-1, -2) @ vv), s), mask)
    else:
        c_q = c_k if ks is qs else steps.kernel(qs, marks, s, "q")
        in_pass_ok = steps is PLAIN and scaled and _scale_in_pass(norm_gain, mask, c_q, c_k, vv, w_inv)
        alpha = plain_scale(s.norm, s.norm_scale, vv.shape[-2]) if in_pass_ok else None  # (N a number: eager)
        if alpha is not None:
            # the plain scale of §4.6 applied by the backend in its pass where it can (the C loops)
            out, in_pass = normalize_nystrom_scaled(c_q, c_k, vv, s.norm, s.norm_eps, w_inv=w_inv, alpha=alpha)
            scaled = not in_pass  # the scale still to apply below
        else:
            out = steps.normalize(c_q, c_k, vv, w_inv, s, mask)
    if scaled:
        out = scale_output(out, vv, s, norm_gain, mask)
    return (out if conv is None else add_value_conv(out, conv)), w, w_inv


def _scale_in_pass(norm_gain, mask, *factors: torch.Tensor) -> bool:
    """Whether a call's plain output scale of §4.6 may go to the normalisation's backend
    (``normalize_nystrom_scaled``): no learned gain, no mask, no gradient needed, eager mode."""
    return (norm_gain is None and mask is None and not torch.jit.is_tracing() and not torch.compiler.is_compiling()
            and not (torch.is_grad_enabled() and any(t.requires_grad for t in factors)))


def scale_output(out, vv, s: AttentionSettings, norm_gain=None, mask=None) -> torch.Tensor:
    """The output scale of the whitened part (docs/DESIGN.md §4.6) for the whitened norms; out, vv (B, H, N, e)
    in the compute dtype, vv with padded rows 0."""
    if s.norm not in WHITENED_NORMS:
        return out
    return scale_whitened(out, vv, s.norm_scale, norm_gain, mask)


def _half_passes(q, k, v, s: AttentionSettings, hw, grid, mask, norm_gain, prefix: int, conv):
    """Half-precision q, k, v as they are to the fused ops (their Triton backends read float16/bfloat16 and sum
    in float32, docs/DESIGN.md §1.3): (out, (L, W, W⁺)) when both serve, (None, (L, W, W⁺)) when only the
    landmark solve does (its float32 results stand for the cast inputs'), (None, None) otherwise. Asked only
    without a mask or prefix tokens (the core's padding and pooling steps are its own) and without a learned
    gain; a call that needs a gradient is none of theirs (they return None)."""
    if q.dtype not in (torch.float16, torch.bfloat16) or mask is not None or prefix or norm_gain is not None:
        return None, None
    solved = landmark_solve(q, k, v, hw, grid, s, None, 0)
    if solved is None:
        return None, None
    return streaming_nystrom(q, k, v, solved[0], solved[2], s, None, conv), solved


def attention_core(q, k, v, s: AttentionSettings, hw, grid, mask=None, norm_gain=None, return_stats: bool = False,
                   prefix: int = 0, conv: ValueConv | None = None):
    """The operator on checked inputs: q, k (B, H, N, d), v (B, H, N, e), ``grid`` the resolved landmarks
    (None: exact kernel), pooled from the tokens after the first ``prefix`` (hw: their grid). Returns
    (B, H, N, e) in v's dtype, and with ``return_stats`` a dict with the solver residual ||I - P W⁺||_F per
    (B, H) and the landmark count. ``conv``: the layer's DWConv(V) (v the head view of its tokens), included
    in the output (a (B, H, N, e) view of the (B, N, C) sum): given to the Nyström path (the streaming output
    pass fuses it; the steps add it after the scale) without padding or prefix tokens, else added after the
    core as the layer adds it."""
    out_dtype = v.dtype
    inner = conv if conv is not None and grid is not None and mask is None and prefix == 0 else None
    included = False  # whether ``out`` already holds the conv
    autocast = torch.is_autocast_enabled(q.device.type)
    with torch.autocast(device_type=q.device.type, enabled=False):
        stats = {}
        if grid is None:
            qs, ks, vv = padded_inputs(q, k, v, compute_dtype(q.dtype), mask)
            g = laplace_kernel(qs, ks, s.bandwidth, s.kernel)
            out = scale_output(normalize_dense(g, vv, s.norm, s.norm_eps, key_padding_mask=mask), vv, s, norm_gain,
                               mask)
        else:
            out, solved = _half_passes(q, k, v, s, hw, grid, mask, norm_gain, prefix, inner)
            included = out is not None and inner is not None
            if out is None:
                qs, ks, vv = padded_inputs(q, k, v, compute_dtype(q.dtype), mask)
                if solved is None:
                    solved = landmark_solve(qs, ks, vv, hw, grid, s, mask, prefix)  # L, W, W⁺ in one launch, or None
                if solved is None:
                    marks, inverse = grid_landmarks(qs, hw, grid, mask, prefix), None
                else:
                    marks, inverse = solved[0], solved[1:]
                # the conv joins the Nyström output only where no cast follows it (else the layer's order: the
                # heads cast to v's dtype, then added into the conv)
                here = inner if vv.dtype == out_dtype and not autocast else None
                out, w, w_inv = nystrom(qs, ks, vv, marks, s, mask, inverse=inverse, conv=here, norm_gain=norm_gain)
                included = here is not None
            else:
                marks, w, w_inv = solved
            if return_stats:
                with torch.no_grad():
                    stats["residual"] = pinv_residual(regularise(w, s.ns_eps), w_inv)
                    stats["landmarks"] = marks.shape[-2]
        out = out.to(out_dtype)
    if conv is not None and not included:
        out = add_value_conv(out, conv)
    return (out, stats) if return_stats else out

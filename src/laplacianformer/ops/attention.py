"""Laplacian-kernel Nyström attention, the operator of the paper (docs/DESIGN.md §1–§4).

    q' = s·q, k' = s·k                        (s = qk_scale, default d**-0.5; DESIGN.md §1, ours;
                                               computed as k(q, k; lam / s) for the Laplacian kernel)
    L  = AdaptiveAvgPool(q') to the landmark grid (DESIGN.md §2)
    C_q = k(q', L) (N×m),  C_k = k(k', L) (N×m),  W = k(L, L) (m×m)
    W⁺ ≈ (W + eps·I)^{-1} by Newton–Schulz (DESIGN.md §3)
    ĝ  = C_q W⁺ C_kᵀ, never materialised; output = Z(ĝ) V (DESIGN.md §4)

The kernel matrices, the solver and the normalisation run in float32 for half-precision inputs and
under autocast (docs/DESIGN.md §1: exp(-D/lam) underflows in float16); the output has the inputs' dtype.
The landmark pooling is the dispatched op ``pooling`` (docs/DESIGN.md §6); ``explain_all`` reports the
backend decision of every dispatched call the operator makes.
"""

from __future__ import annotations

import math

import torch

from . import _runtime
from .dispatch import BackendRefused
from .kernel import laplace_kernel, laplace_kernel_matmul
from .newton_schulz import pinv_residual, regularise, regularised_inverse
from .normalization import normalize_dense, normalize_nystrom, scale_whitened
from .pooling import landmarks_of, pool_landmarks
from .validation import (
    KERNELS,
    NORM_SCALES,
    NORMS,
    WHITENED_NORMS,
    SOLVERS,
    check_choice,
    check_finite,
    check_hw,
    check_positive,
    check_key_padding_mask,
    check_positive_int,
    check_qkv,
    reject_attn_mask,
    resolve_landmarks,
)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def default_bandwidth(kernel: str, head_dim: int, lam: float | None = None, qk_scale: float | None = None):
    """(lam, qk_scale) with each None replaced by the kernel's default (docs/DESIGN.md §1.1, §1.4).

    Laplacian exp(-||s·q - s·k||_1 / lam): lam = 4, s = d**-0.5 (ours). Gaussian exp(-||s·q - s·k||² / lam):
    lam = 2·sqrt(d), s = 1, i.e. SOFT's exp(-||q - k||² / (2·sqrt(d))) on the raw q and k. Given values
    are checked (finite, > 0) and kept.
    """
    check_choice("kernel", kernel, KERNELS)
    if lam is None:
        lam = 4.0 if kernel == "laplacian" else 2.0 * math.sqrt(head_dim)
    if qk_scale is None:
        qk_scale = head_dim ** -0.5 if kernel == "laplacian" else 1.0
    return check_positive("lam", lam), check_positive("qk_scale", qk_scale)


def check_settings(head_dim: int, hw, grid, mask, lam, qk_scale, norm, solver, iters, ns_eps, norm_eps, kernel,
                   ns_backward, norm_scale="one", norm_gain=None, heads=None) -> float:
    """Checks the operator's settings (after the inputs and the landmark grid) and returns the bandwidth to
    use on unscaled q and k (docs/DESIGN.md §1.2); shared by ``laplacian_attention`` and the lean recompute."""
    if mask is not None and hw is not None and grid is not None:
        raise ValueError(
            "key_padding_mask: not supported on a 2-D token grid with pooled landmarks (the landmark bins are "
            "cells of the grid, and a padded grid has no bins matching the unpadded one); pass a 1-D sequence "
            "(hw=None) or landmarks=None (docs/DESIGN.md §2.5)"
        )
    lam, scale = default_bandwidth(kernel, head_dim, lam, qk_scale)
    check_choice("norm", norm, NORMS)
    check_choice("solver", solver, SOLVERS)
    check_choice("ns_backward", ns_backward, ("implicit", "unrolled"))
    check_positive_int("iters", iters)
    check_positive("ns_eps", ns_eps, allow_zero=True)
    check_positive("norm_eps", norm_eps, allow_zero=norm not in WHITENED_NORMS)
    check_choice("norm_scale", norm_scale, NORM_SCALES)
    if (norm_scale != "one" or norm_gain is not None) and norm not in WHITENED_NORMS:
        raise ValueError(f"norm_scale: scales the whitened part of norm in {list(WHITENED_NORMS)} "
                         f"(docs/DESIGN.md §4.6), got norm={norm!r} with norm_scale={norm_scale!r}"
                         f"{' and a norm_gain' if norm_gain is not None else ''}")
    if norm_gain is not None:
        if not isinstance(norm_gain, torch.Tensor) or not norm_gain.is_floating_point() or norm_gain.dim() != 1 \
                or (heads is not None and norm_gain.shape[0] != heads):
            got = tuple(norm_gain.shape) if isinstance(norm_gain, torch.Tensor) else type(norm_gain).__name__
            raise ValueError(f"norm_gain: expected a floating tensor of shape ({heads if heads else 'H'},), one "
                             f"gain per head, got {got}")
    # k(s·x, s·y; lam) = k(x, y; lam / s^p): the L1 distance is homogeneous of degree p = 1, the squared
    # L2 distance of degree 2, and the pooled landmarks of s·q are s times those of q. So q and k are used
    # unscaled with the bandwidth rescaled: the same function, without two passes over (N, d) tensors.
    return lam / (scale if kernel == "laplacian" else scale * scale)


def padded_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype, mask: torch.Tensor | None):
    """q, k, v in the compute dtype, padded tokens read as 0 (finite whatever they held; masked_fill passes
    them no gradient). K = Q stays one tensor."""
    qs, ks, vv = q.to(dtype), k.to(dtype), v.to(dtype)
    if mask is not None:
        pad = mask[:, None, :, None]
        qs, vv = qs.masked_fill(pad, 0.0), vv.masked_fill(pad, 0.0)
        ks = qs if k is q else ks.masked_fill(pad, 0.0)
    elif k is q:
        ks = qs
    return qs, ks, vv


def laplacian_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    hw: tuple[int, int] | None = None,
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
    norm_scale: str = "one",
    norm_gain: torch.Tensor | None = None,
    check_finite_inputs: bool = False,
    return_stats: bool = False,
    key_padding_mask: torch.Tensor | None = None,
    attn_mask=None,
    is_causal: bool = False,
):
    """Laplacian (or Gaussian) kernel attention with Nyström approximation and normalisation.

    Args:
        q, k: (B, H, N, d); v: (B, H, N, d_v).
        hw: (height, width) of a 2-D token grid with height·width = N; None for a 1-D sequence.
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
        kernel: "laplacian" exp(-||x-y||_1/lam) or "gaussian" exp(-||x-y||²/lam).
        ns_backward: "implicit" (default) or "unrolled" gradient of the Newton–Schulz solver.
        norm_scale: "one" (default, the map of §4.1) | "inv_sqrt_n" | "inv_n": the whitened part of the
            injective map times N^-½ or N^-1 (N the valid keys), the 1/N row kept (docs/DESIGN.md §4.6);
            norm="injective" / "injective_nomean" only.
        norm_gain: (H,) per-head factor on the whitened part on top of ``norm_scale`` (the module's learned
            gain), or None.
        check_finite_inputs: raise ValueError when q, k or v holds NaN/Inf.
        return_stats: also return a dict with the solver residual ||I - P W⁺||_F per (B, H).
        key_padding_mask: (B, N) bool, True = padding (``nn.MultiheadAttention``'s convention;
            docs/DESIGN.md §2.5). Padded tokens weigh 0 as keys, are left out of the landmark pooling and
            of every statistic of §4 (row means, column variances, 1/N, v̄), and their output rows are 0;
            what they hold does not matter and they receive zero gradient. Each real token then gets what
            its sequence gives alone (with the same ``landmarks``). With Nyström landmarks only 1-D
            sequences (hw=None) take a mask; every sequence needs a valid token.
        attn_mask, is_causal: not supported (ValueError saying why): each pooled landmark averages queries
            from all positions.

    Returns:
        (B, H, N, d_v) in the dtype of v (and the stats dict when ``return_stats``).
    """
    reject_attn_mask(attn_mask, is_causal)
    check_qkv(q, k, v)
    n = q.shape[2]
    hw = check_hw(hw, n)
    grid = resolve_landmarks(landmarks, hw, n)
    mask = check_key_padding_mask(key_padding_mask, q.shape[0], n)
    lam = check_settings(q.shape[-1], hw, grid, mask, lam, qk_scale, norm, solver, iters, ns_eps, norm_eps, kernel,
                         ns_backward, norm_scale, norm_gain, q.shape[1])
    if check_finite_inputs:
        for name, t in (("q", q), ("k", k), ("v", v)):
            check_finite(name, t)

    out_dtype = v.dtype
    dtype = _compute_dtype(q.dtype)
    with torch.autocast(device_type=q.device.type, enabled=False):
        qs, ks, vv = padded_inputs(q, k, v, dtype, mask)
        pad = None if mask is None else mask[:, None, :, None]
        stats = {}
        if grid is None:
            g = laplace_kernel(qs, ks, lam, kernel)
            out = normalize_dense(g, vv, norm, norm_eps, key_padding_mask=mask)
        else:
            marks = landmarks_of(qs, hw, grid, mask)
            w = laplace_kernel(marks, marks, lam, kernel)
            w_inv = regularised_inverse(w, solver=solver, iters=iters, eps=ns_eps, backward=ns_backward)
            c_k = laplace_kernel(ks, marks, lam, kernel)
            if mask is not None:
                c_k = c_k.masked_fill(pad, 0.0)  # padded keys weigh 0
            if norm == "none":
                out = laplace_kernel_matmul(qs, marks, w_inv @ (c_k.transpose(-1, -2) @ vv), lam, kernel)
                if mask is not None:
                    out = out.masked_fill(pad, 0.0)
            else:
                c_q = c_k if k is q else laplace_kernel(qs, marks, lam, kernel)
                out = normalize_nystrom(c_q, c_k, vv, norm, norm_eps, w_inv=w_inv, key_padding_mask=mask)
            if return_stats:
                with torch.no_grad():
                    stats["residual"] = pinv_residual(regularise(w, ns_eps), w_inv)
                    stats["landmarks"] = marks.shape[-2]
        if norm in WHITENED_NORMS:
            out = scale_whitened(out, vv, norm_scale, norm_gain, mask)
    out = out.to(out_dtype)
    return (out, stats) if return_stats else out


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

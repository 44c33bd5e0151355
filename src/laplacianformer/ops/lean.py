"""The lean host path of CPU inference (docs/DESIGN.md §6.6): one attention layer's Nyström output plus its
DWConv(V), as a straight line of the backends the registries chose, without asking them again.

A layer's eager inference call (no padding mask, no prefix tokens, no gradient) runs the general path once per
call signature (shapes, dtype, device, the backend choices of ``_runtime``, autocast) while recording which
backend each dispatched op selected (``dispatch.selections``). When that trace is the one this module
reproduces — pooling by the C loop (``grid_cpu``), no fused landmark solve or streaming passes (``steps``), the C kernel rows,
the C Newton–Schulz and the C normalisation — the signature's later calls run ``lean_value_conv``: the same
backend functions in the same order on the same tensors (same bits: tests/ops/test_lean.py), without the
per-call checks, the landmark rule, the registries' refusals and the custom-op dispatch in between. Anything
else (a forced backend, another device or dtype, a norm without a C form, autocast, ``explain``'s recording,
graph capture or tracing) keeps the general path. On the GPU the streaming passes play this part.

The exact kernel (``grid`` None: the landmarks would cover every token, §2.2) has a straight line too: the C
kernel rows of Q against K, the dense normalisation, the §4.6 scale, DWConv(V) with the heads added into it.

    fits = lean_trace_fits(trace, settings, grid)                           # the general call's trace
    out = lean_value_conv(q, k, v_tok, settings, hw, grid, weight, bias)   # (B, N, C)
"""

from __future__ import annotations

import torch

from .kernel.cpu import _batch_rows, kernel_rows_cpu
from .newton_schulz import native as ns_native
from .newton_schulz.naive import CHECK_EVERY, _cached_scaled_eye
from .normalization.cpu import normalize_cpu
from .normalization.reference import normalize_dense, scale_whitened
from .grid_cpu import pool_grid_cpu
from .settings import AttentionSettings
from .validation import SHIPPED_NORMS, WHITENED_NORMS
from .value_conv import ValueConv, add_value_conv

__all__ = ["LEAN_BACKENDS", "kernel_rows", "lean_trace_fits", "lean_value_conv"]

LEAN_BACKENDS = {"pooling": "cpu", "landmark_solve": "steps", "kernel": "cpu", "newton_schulz": "cpu",
                 "streaming": "steps", "normalization": "cpu"}
"""The backend of each op the lean path reproduces; a signature whose general call selected any other (or
dispatched another op) keeps the general path."""
LEAN_EXACT_TRACE = [("kernel", "cpu")]
"""The exact kernel's general call, in full: its one dispatched op (the dense normalisation is aten)."""
LEAN_NORMS = SHIPPED_NORMS
"""The norms with a C form (the ``cpu`` backend of ``normalization``: the shipped ones)."""


def lean_trace_fits(trace: list[tuple[str, str]], settings: AttentionSettings,
                    grid: tuple[int, int] | int | None) -> bool:
    """Whether the general call that recorded ``trace`` ((op, backend) in order) is what ``lean_value_conv``
    computes for the resolved landmarks ``grid`` (None: the exact kernel): every op's backend is
    ``LEAN_BACKENDS``'s, with the Newton–Schulz solver and a C norm; for the exact kernel, ``LEAN_EXACT_TRACE``
    and a shipped norm."""
    if settings.norm not in LEAN_NORMS:
        return False
    if grid is None:
        return trace == LEAN_EXACT_TRACE
    return (bool(trace) and settings.solver == "newton_schulz" and settings.ns_backward == "implicit"
            and all(LEAN_BACKENDS.get(op) == name for op, name in trace))


def kernel_rows(x: torch.Tensor, y: torch.Tensor, s: AttentionSettings) -> torch.Tensor:
    """k(X, Y) (..., N, M) by the C kernel rows: what the ``cpu`` backend of ``kernel`` computes without
    autograd."""
    out = kernel_rows_cpu(_batch_rows(x), _batch_rows(y), s.spec, 1.0 / float(s.bandwidth))
    return out.reshape(*x.shape[:-1], y.shape[-2])


def lean_value_conv(q: torch.Tensor, k: torch.Tensor, v_tok: torch.Tensor, s: AttentionSettings, hw, grid,
                    weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The heads merged + DWConv(V), (B, N, C), for a signature whose general call fit (``lean_trace_fits``).

    q, k (B, H, N, d) (``k is q`` when K = Q), v_tok (B, N, C) float32/float64 CPU tensors; hw the grid or None
    (1-D); grid the resolved landmarks, None for the exact kernel; weight (C, 1, 3, 3), bias (C,) or None. The
    steps of ``nystrom.nystrom`` with the plain steps (docs/DESIGN.md §2–§4.6): L = pool(Q), W = k(L, L),
    W⁺ = NS(W + εI), C_k, C_q, the C normalisation, the §4.6 scale, DWConv(V) with the heads added into it;
    for the exact kernel those of ``nystrom.attention_core``: k(Q, K), the dense normalisation (§4.1), the
    scale, the conv."""
    b, n, c = v_tok.shape
    heads = q.shape[1]
    v = v_tok.reshape(b, n, heads, c // heads).transpose(1, 2)
    if grid is None:
        out = normalize_dense(kernel_rows(q, k, s), v, s.norm, s.norm_eps)
        if s.norm in WHITENED_NORMS:
            out = scale_whitened(out, v, s.norm_scale)
        return add_value_conv(out, ValueConv(v_tok, hw, weight, bias)).transpose(1, 2).reshape(b, n, c)
    marks = pool_grid_cpu(q, hw, grid)
    w = kernel_rows(marks, marks, s)
    m = w.shape[-1]
    p = w + _cached_scaled_eye(m, s.ns_eps, w.dtype, w.device) if s.ns_eps else w  # ``regularise`` in eager mode
    w_inv = ns_native.newton_schulz_native(p, s.iters, None, CHECK_EVERY)
    c_k = kernel_rows(k, marks, s)
    c_q = c_k if k is q else kernel_rows(q, marks, s)
    e = v.shape[-1]
    out = normalize_cpu(c_q.reshape(-1, n, m), c_k.reshape(-1, n, m), v.reshape(-1, n, e), s.norm, s.norm_eps,
                        w_inv.reshape(-1, m, m)).reshape(b, heads, n, e)  # the ``cpu`` backend's call
    if s.norm in WHITENED_NORMS:
        out = scale_whitened(out, v, s.norm_scale)
    return add_value_conv(out, ValueConv(v_tok, hw, weight, bias)).transpose(1, 2).reshape(b, n, c)

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
    plan = lean_call(q, k, v_tok, settings, hw, grid)                      # the same, bound to the signature
    out = plan(q, k, v_tok, weight, bias)

``lean_call`` binds a signature's line once: for the Nyström path of the exp families (the shipped kernels)
``LeanNystrom``, which resolves the C entry points, sizes, thread counts and scalars when it is made and then
makes the C calls itself (same functions, same arguments, same bits as ``lean_value_conv``, without the
wrappers' per-call work); else ``LeanCall``, ``lean_value_conv`` with the signature's arguments bound.
"""

from __future__ import annotations

import torch

from . import grid_cpu
from ._clib import threads_for_work
from .kernel import native as kernel_native
from .kernel.cpu import _batch_rows, kernel_rows_cpu
from .newton_schulz import native as ns_native
from .newton_schulz.naive import CHECK_EVERY, _cached_scaled_eye
from .normalization import cpu as norm_native
from .normalization.cpu import normalize_cpu
from .normalization.reference import normalize_dense, plain_scale, scale_whitened
from .grid_cpu import pool_grid_cpu
from .settings import AttentionSettings
from .validation import SHIPPED_NORMS, WHITENED_NORMS
from .value_conv import ValueConv, add_value_conv

__all__ = ["LEAN_BACKENDS", "LeanCall", "LeanNystrom", "kernel_rows", "lean_call", "lean_trace_fits",
           "lean_value_conv"]

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
    W⁺ = NS(W + εI), C_k, C_q, the C normalisation with the §4.6 scale in its pass (``normalize_nystrom_scaled``),
    DWConv(V) with the heads added into it;
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
                        w_inv.reshape(-1, m, m), plain_scale(s.norm, s.norm_scale, n)).reshape(b, heads, n, e)
    # the ``cpu`` backend's call, with the §4.6 scale in the C pass (``normalize_nystrom_scaled``)
    return add_value_conv(out, ValueConv(v_tok, hw, weight, bias)).transpose(1, 2).reshape(b, n, c)


class LeanCall:
    """``lean_value_conv`` bound to one signature's settings, grid and landmarks: call(q, k, v_tok, weight,
    bias) -> (B, N, C)."""

    def __init__(self, s: AttentionSettings, hw, grid) -> None:
        self.settings, self.hw, self.grid = s, hw, grid

    def __call__(self, q, k, v_tok, weight, bias) -> torch.Tensor:
        return lean_value_conv(q, k, v_tok, self.settings, self.hw, self.grid, weight, bias)


class LeanNystrom:
    """The Nyström line of ``lean_value_conv`` for one signature whose kernel family is an exp family: q, k
    (B, H, N, d) with contiguous last dimensions (``k is q`` when K = Q), v_tok (B, N, C), landmarks ``grid``
    (lh, lw) (an int on a 1-D sequence), ``hw`` the token grid or None. Made once per signature (``lean_call``);
    each call makes the C calls of the wrappers (``pool_grid_cpu``, ``kernel_rows_cpu``,
    ``newton_schulz_native``, ``normalize_cpu``, ``dwconv_merge_cpu``) and the aten calls between them with
    the same arguments, so the result is the same bits (tests/ops/test_lean.py)."""

    def __init__(self, s: AttentionSettings, q: torch.Tensor, v_tok: torch.Tensor, hw, grid) -> None:
        suffix = {torch.float32: "f32", torch.float64: "f64"}[q.dtype]
        b, heads, n, d = q.shape
        c = v_tok.shape[-1]
        self.gh, self.gw = (1, n) if hw is None else (int(hw[0]), int(hw[1]))
        self.lh, self.lw = (1, int(grid)) if hw is None else (int(grid[0]), int(grid[1]))
        m, e, g = self.lh * self.lw, c // heads, b * heads
        self.sizes = b, heads, n, d, m, e, c
        self.settings = s
        self.neg_inv_lam = -1.0 / float(s.bandwidth)
        self.l1 = int(s.spec.l1)
        self.injective = int(s.norm == "injective")
        alpha = plain_scale(s.norm, s.norm_scale, n)
        self.alpha = 1.0 if alpha is None else alpha  # the §4.6 scale, in the C pass
        self.stats = norm_native._stats_size(m, e)
        self.pool = getattr(grid_cpu.load(), f"lf_pool_{suffix}")
        self.merge = getattr(grid_cpu.load(), f"lf_dwconv_merge_{suffix}")
        self.dist = getattr(kernel_native.load(), f"lf_dist_{suffix}")
        self.solve = getattr(ns_native.load(), f"lf_ns_{suffix}")
        self.normalize = getattr(norm_native.load(), f"lf_norm_fwd_{suffix}")
        # each C call's work, whose thread count ``threads_for_work`` gives at call time, as the wrappers do
        self.work = {"pool": g * n * d, "w": g * m * m * d, "rows": g * n * m * d, "norm": g * 2 * n * m * (m + e),
                     "merge": b * n * c * 9}
        self.taps = None, -1, None  # (weight, its version, its (9, C) taps): made again when the weight changes

    def _taps(self, weight: torch.Tensor) -> torch.Tensor:
        """``dwconv_merge_cpu``'s taps of ``weight``, kept while it is the same tensor at the same version (an
        in-place update, e.g. an optimizer step, or another tensor makes them again)."""
        held, version, taps = self.taps
        if held is not weight or version != weight._version:
            taps = weight.reshape(weight.shape[0], 9).t().contiguous()
            self.taps = weight, weight._version, taps
        return taps

    def _rows(self, x: torch.Tensor, marks: torch.Tensor, threads: int) -> torch.Tensor:
        """k(X, L) (B·H, R, m) of x (B, H, R, d) by the C distance loop and exp in place (``kernel_rows_cpu``)."""
        _, _, _, d, m, _, _ = self.sizes
        x = _batch_rows(x)
        out = x.new_empty(x.shape[0], x.shape[1], m)
        status = self.dist(x.data_ptr(), x.stride(0), x.stride(1), marks.data_ptr(), m * d, d, out.data_ptr(),
                           x.shape[0], x.shape[1], m, d, self.neg_inv_lam, self.l1, threads)
        if status:
            raise MemoryError("laplacianformer C loops: workspace allocation failed")
        return out.exp_()

    def __call__(self, q, k, v_tok, weight, bias) -> torch.Tensor:
        b, heads, n, d, m, e, c = self.sizes
        s = self.settings
        t = {key: threads_for_work(work) for key, work in self.work.items()}
        marks = q.new_empty(b * heads, m, d)
        self.pool(q.data_ptr(), b, heads, q.stride(0), q.stride(1), q.stride(2), self.gh, self.gw, self.lh, self.lw,
                  d, marks.data_ptr(), t["pool"])
        w = self._rows(marks.view(b, heads, m, d), marks, t["w"])
        if s.ns_eps:  # P = W + eps·I (``regularise``) into W, on its diagonal only: W's entries are positive (an
            # exp family), so adding regularise's zeros off the diagonal changes no bit there
            w.diagonal(0, -2, -1).add_(s.ns_eps)
        w_inv = torch.empty_like(w)
        if self.solve(w.data_ptr(), w_inv.data_ptr(), b * heads, m, s.iters, CHECK_EVERY, 0.0, 0,
                      ns_native.threads_for(b * heads, m, s.iters)):
            raise MemoryError("laplacianformer Newton–Schulz C loop: workspace allocation failed")
        c_k = self._rows(k, marks, t["rows"])
        c_q = c_k if k is q else self._rows(q, marks, t["rows"])
        v = v_tok.reshape(b, n, heads, e).transpose(1, 2).reshape(-1, n, e)
        if v.stride(-1) != 1:
            v = v.contiguous()
        out = q.new_empty(b * heads, n, e)
        stats = q.new_empty(b * heads, self.stats)
        rinv, dsc = q.new_empty(b * heads, n), q.new_empty(b * heads, n)
        if self.normalize(c_q.data_ptr(), n * m, m, c_k.data_ptr(), n * m, m, w_inv.data_ptr(), m * m, v.data_ptr(),
                          v.stride(0), v.stride(1), b * heads, n, n, m, e, s.norm_eps, self.alpha, self.injective,
                          out.data_ptr(), None, stats.data_ptr(), rinv.data_ptr(), dsc.data_ptr(), t["norm"]):
            raise MemoryError("laplacianformer normalisation C loop: workspace allocation failed")
        out = out.view(b, heads, n, e)
        merged = v_tok.new_empty(b, n, c)
        self.merge(v_tok.data_ptr(), b, self.gh, self.gw, c, v_tok.stride(0), v_tok.stride(1),
                   self._taps(weight).data_ptr(), None if bias is None else bias.contiguous().data_ptr(),
                   out.data_ptr(), heads, e,
                   out.stride(0), out.stride(1), out.stride(2), merged.data_ptr(), t["merge"])
        return merged


def lean_call(q: torch.Tensor, k: torch.Tensor, v_tok: torch.Tensor, s: AttentionSettings, hw, grid):
    """The lean line of a signature whose general call fit (``lean_trace_fits``), bound once: ``LeanNystrom``
    for the Nyström path of an exp family, with q, k and v_tok's last dimensions contiguous; else ``LeanCall``."""
    libraries = (grid_cpu.load(), kernel_native.load(), ns_native.load(), norm_native.load())
    if (grid is not None and s.spec.exp_of_accumulation and q.stride(-1) == 1 and k.stride(-1) == 1
            and v_tok.stride(-1) == 1 and all(lib is not None for lib in libraries)):
        return LeanNystrom(s, q, v_tok, hw, grid)
    return LeanCall(s, hw, grid)

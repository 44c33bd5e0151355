"""The fused injective / inline normalisation in Triton (docs/DESIGN.md §4.3, §6); formulas in
``ops/normalization/fused.py``, the CPU twin in ``ops/csrc/normalization.c``.

Backend ``triton`` of the op ``normalization``. Per batch·head, c (Nq, m) = C_q, k (Nk, m) = C_k,
w (m, m) = W⁺ or None (k is B), v (Nk, e); products accumulate in float32 (``tl.dot`` as "tf32x3": the
variances s_j must not lose the bits plain TF32 would), float64 for float64 inputs; inputs may be
float32/float64/float16/bfloat16.

Two kinds of pass, never mixed in one kernel (docs/KERNELS.md, "The fused normalisation"):

- **Gram passes** (``gram_kernel``, a loop over a split of the rows): partial sums of
  (s ⊙ (x − x̄))ᵀ (y [− ȳ]), Σ y and Σ s ⊙ (y [− ȳ]) over row splits, into (G, splits, ·) workspaces
  summed in a fixed order (deterministic, no atomics): the covariance S of C_q, dM = C̃_qᵀ G, M' = (r ⊙ k̃)ᵀ v
  (with Σ r v, Σ v) and dS' = k̃ᵀ (ds ⊙ k̃) (with Σ ds k̃);
- **row passes** (one block of 16 rows per program): ``key_fwd_kernel`` t = k̃ S', s = rowsum(t ⊙ k̃),
  r = (max(s, 0) + eps)^(-1/2), stores t (for the backward), r, −r³/2 [s ≥ 0]; ``key_bwd_kernel``
  dv = r (k̃ dM') + Ḡ_k, Y = v dM'ᵀ, ds (stored for the Gram pass), dk̃ = r Y + 2 ds t (t recomputed when
  not kept; dk may overwrite t);
  ``rows_kernel`` (x − x̄) B1 [+ y B2] + bias (out = C̃_q M + v̄ and dC_q).

The m×m and m×e algebra between the passes (S' = Wᵀ S W, M = W M', dS = W dS' Wᵀ, dW) is torch.

Why two kinds: Triton gives every ``tl.dot`` of a kernel whose dots are connected the warp layout of the
first one it converts; a Gram product (an m × e result, the rows the reduced dimension) next to row
products (row-block × m results) left one of them replicated across the warps, and the key passes spilled
registers (100 of 888 specialisations, mostly on sm_80). Separated, each kernel's products share one
shape. Every launch passes ``maxnreg`` (``MAXNREG``).

m and e up to 64 (``TRITON_MAX_DIM`` of ``limits.py``, which the registry and the launcher
ask). ``aot_specialisations`` lists every launch configuration for ``benchmarks/triton_aot.py``, which
compiles them for sm_80 and sm_90 and checks (``--strict``) that none spills or exceeds a block's shared
memory.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from .limits import TRITON_MAX_DIM, triton_unfit

MAX_DIM = TRITON_MAX_DIM
_SPLITS = 16
_TL = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64"}


def _acc(dtype: torch.dtype) -> tuple[torch.dtype, object]:
    """(torch, Triton) accumulation dtype: float64 for float64 inputs, else float32."""
    return (torch.float64, tl.float64) if dtype == torch.float64 else (torch.float32, tl.float32)


@triton.jit
def _dot(a, b, ACC: tl.constexpr):
    if ACC == tl.float64:
        return tl.dot(a, b)
    return tl.dot(a, b, input_precision="tf32x3")


@triton.jit
def _vector(P, cols, C):
    """Entries ``cols`` (< C) of the vector at P, 0 beyond."""
    return tl.load(P + cols, mask=cols < C, other=0.0)


@triton.jit
def _tile(P, rn, rmask, cols, C, ACC: tl.constexpr):
    """Rows ``rn`` (where ``rmask``) of the row-major (·, C) matrix at P, columns ``cols`` (< C), as ACC; 0
    outside."""
    return tl.load(P + rn[:, None] * C + cols[None, :], mask=rmask[:, None] & (cols[None, :] < C),
                   other=0.0).to(ACC)


@triton.jit
def _centred(P, mean, rn, rmask, cols, C, ACC: tl.constexpr):
    """``_tile`` minus the column means ``mean``, 0 outside (the masked rows add nothing to a sum)."""
    inside = rmask[:, None] & (cols[None, :] < C)
    return tl.where(inside, _tile(P, rn, rmask, cols, C, ACC) - mean[None, :], 0.0)


@triton.jit
def _matrix(P, R, C, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, ACC: tl.constexpr):
    """The row-major (R, C) matrix at P as a (BLOCK_R, BLOCK_C) tile, 0 outside."""
    rows = tl.arange(0, BLOCK_R)
    return _tile(P, rows, rows < R, tl.arange(0, BLOCK_C), C, ACC)


@triton.jit
def _store(P, value, rn, rmask, cols, C):
    """``value`` into rows ``rn`` (where ``rmask``), columns ``cols`` (< C) of the row-major (·, C) matrix
    at P, in P's dtype."""
    tl.store(P + rn[:, None] * C + cols[None, :], value.to(P.dtype.element_ty),
             mask=rmask[:, None] & (cols[None, :] < C))


@triton.jit
def _row_block(X, XBAR, N, C, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr, ACC: tl.constexpr):
    """A row pass's block: its rows of the g-th (N, C) matrix at X minus the g-th mean at XBAR, with the
    row indices, their mask and the column indices (program ids: row block, g)."""
    pid, g = tl.program_id(0), tl.program_id(1)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rn < N
    cols = tl.arange(0, BLOCK_C)
    return _centred(X + g * N * C, _vector(XBAR + g * C, cols, C), rn, rmask, cols, C, ACC), rn, rmask, cols


@triton.jit
def gram_kernel(X, XBAR, S, Y, YBAR, PART, YSUM, SYSUM, N, P, Q, rows_per_split, SPLITS,
                SCALE: tl.constexpr, CENTRE_Y: tl.constexpr, ACC: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_Q: tl.constexpr):
    """Over the rows of one split: Σ (s ⊙ (x − x̄))ᵀ ỹ (P, Q), Σ y and, with SCALE, Σ s ⊙ ỹ (Q), where
    ỹ = y − ȳ with CENTRE_Y, else y."""
    split, g = tl.program_id(0), tl.program_id(1)
    rp = tl.arange(0, BLOCK_P)
    rq = tl.arange(0, BLOCK_Q)
    xbar = _vector(XBAR + g * P, rp, P)
    ybar = _vector(YBAR + g * Q, rq, Q)
    acc = tl.zeros((BLOCK_P, BLOCK_Q), dtype=ACC)
    ysum = tl.zeros((BLOCK_Q,), dtype=ACC)
    sysum = tl.zeros((BLOCK_Q,), dtype=ACC)
    lo = split * rows_per_split
    for n0 in range(lo, lo + rows_per_split, BLOCK_N):
        rn = n0 + tl.arange(0, BLOCK_N)
        rmask = rn < N
        x = _centred(X + g * N * P, xbar, rn, rmask, rp, P, ACC)
        y = _tile(Y + g * N * Q, rn, rmask, rq, Q, ACC)
        ysum += tl.sum(y, axis=0)
        if CENTRE_Y:
            y = tl.where(rmask[:, None] & (rq[None, :] < Q), y - ybar[None, :], 0.0)
        if SCALE:
            s = tl.load(S + g * N + rn, mask=rmask, other=0.0).to(ACC)
            x = x * s[:, None]
            sysum += tl.sum(y * s[:, None], axis=0)
        acc += _dot(tl.trans(x), y, ACC)
    base = g * SPLITS + split
    _store(PART + base * P * Q, acc, rp, rp < P, rq, Q)
    tl.store(YSUM + base * Q + rq, ysum, mask=rq < Q)
    if SCALE:
        tl.store(SYSUM + base * Q + rq, sysum, mask=rq < Q)


@triton.jit
def key_fwd_kernel(K, KBAR, SP, T, RINV, DSC, NK, M, eps,
                   SAVE_T: tl.constexpr, ACC: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr):
    g = tl.program_id(1)
    x, rn, rmask, rm = _row_block(K, KBAR, NK, M, BLOCK_N, BLOCK_M, ACC)
    t = _dot(x, _matrix(SP + g * M * M, M, M, BLOCK_M, BLOCK_M, ACC), ACC)
    s = tl.sum(t * x, axis=1)
    r = 1.0 / tl.sqrt(tl.maximum(s, 0.0) + eps)
    if SAVE_T:
        _store(T + g * NK * M, t, rn, rmask, rm, M)
    tl.store(RINV + g * NK + rn, r, mask=rmask)
    tl.store(DSC + g * NK + rn, tl.where(s >= 0.0, -0.5 * r * r * r, 0.0), mask=rmask)


@triton.jit
def rows_kernel(X, XBAR, B1, Y, B2, BIAS, OUT, N, K1, K2, Q,
                HAS_Y: tl.constexpr, ACC: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K1: tl.constexpr,
                BLOCK_K2: tl.constexpr, BLOCK_Q: tl.constexpr):
    g = tl.program_id(1)
    x, rn, rmask, _ = _row_block(X, XBAR, N, K1, BLOCK_N, BLOCK_K1, ACC)
    acc = _dot(x, _matrix(B1 + g * K1 * Q, K1, Q, BLOCK_K1, BLOCK_Q, ACC), ACC)
    if HAS_Y:
        y = _tile(Y + g * N * K2, rn, rmask, tl.arange(0, BLOCK_K2), K2, ACC)
        acc += _dot(y, _matrix(B2 + g * K2 * Q, K2, Q, BLOCK_K2, BLOCK_Q, ACC), ACC)
    rq = tl.arange(0, BLOCK_Q)
    _store(OUT + g * N * Q, acc + _vector(BIAS + g * Q, rq, Q)[None, :], rn, rmask, rq, Q)


@triton.jit
def key_bwd_kernel(K, KBAR, V, SP, DMK, GK, RINV, DSC, T, DK, DV, DS, NK, M, E,
                   INJ: tl.constexpr, HAS_T: tl.constexpr, ACC: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr):
    g = tl.program_id(1)
    x, rn, rmask, rm = _row_block(K, KBAR, NK, M, BLOCK_N, BLOCK_M, ACC)
    re = tl.arange(0, BLOCK_E)
    v = _tile(V + g * NK * E, rn, rmask, re, E, ACC)
    dmk = _matrix(DMK + g * M * E, M, E, BLOCK_M, BLOCK_E, ACC)
    dv = _dot(x, dmk, ACC)
    y = _dot(v, tl.trans(dmk), ACC)
    if INJ:
        r = tl.load(RINV + g * NK + rn, mask=rmask, other=0.0)
        dv = dv * r[:, None]
        ds = tl.load(DSC + g * NK + rn, mask=rmask, other=0.0) * tl.sum(y * x, axis=1)
        tl.store(DS + g * NK + rn, ds, mask=rmask)
        if HAS_T:
            t = _tile(T + g * NK * M, rn, rmask, rm, M, ACC)
        else:
            t = _dot(x, _matrix(SP + g * M * M, M, M, BLOCK_M, BLOCK_M, ACC), ACC)
        dk = r[:, None] * y + 2.0 * ds[:, None] * t
    else:
        dk = y
    _store(DV + g * NK * E, dv + _vector(GK + g * E, re, E)[None, :], rn, rmask, re, E)
    _store(DK + g * NK * M, dk, rn, rmask, rm, M)


MAXNREG = 255
"""``.maxnreg`` of every launch: without it ptxas, for some specialisations, picks a register target
below what the kernel needs (64, 80, 96 or 128, an occupancy heuristic that differs between sm_80 and
sm_90, dtypes and warp counts) and spills a few bytes; with it they use what they need (<= 255, which
8 warps of 32 threads can always have)."""
_OPTIONS = ("num_warps", "num_stages", "maxnreg")


def _p2(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


def gram_config(p: int, q: int, dtype: torch.dtype) -> dict:
    """BLOCK_N (rows per step), num_warps, num_stages of ``gram_kernel`` for a (p, q) result: 4 warps up to
    32 × 32 (or 64 × 16) results, 8 beyond; steps of 32 rows up to width 32, of 16 beyond."""
    width, area = max(_p2(p), _p2(q)), _p2(p) * _p2(q)
    return dict(BLOCK_N=32 if width <= 32 else 16, num_warps=4 if area <= 32 * 32 else 8, num_stages=3,
                maxnreg=MAXNREG)


def row_config(width: int, dtype: torch.dtype) -> dict:
    """BLOCK_N (rows per program), num_warps, num_stages of the row passes for their widest tile: blocks
    of 16 rows (fewer rows than columns, so the products' warps split the columns), 4 warps up to width
    32, 8 at 64."""
    return dict(BLOCK_N=16, num_warps=4 if _p2(width) <= 32 else 8, num_stages=1, maxnreg=MAXNREG)


def gram_spec(p: int, q: int, dtype: torch.dtype, centre_y: bool, scale: bool) -> dict:
    return dict(SCALE=scale, CENTRE_Y=centre_y, ACC=_acc(dtype)[1], BLOCK_P=_p2(p), BLOCK_Q=_p2(q),
                **gram_config(p, q, dtype))


def key_fwd_spec(m: int, dtype: torch.dtype, save_t: bool) -> dict:
    return dict(SAVE_T=save_t, ACC=_acc(dtype)[1], BLOCK_M=_p2(m), **row_config(m, dtype))


def key_bwd_spec(m: int, e: int, dtype: torch.dtype, inj: bool, has_t: bool) -> dict:
    return dict(INJ=inj, HAS_T=has_t, ACC=_acc(dtype)[1], BLOCK_M=_p2(m), BLOCK_E=_p2(e),
                **row_config(max(m, e), dtype))


def rows_spec(k1: int, k2: int, q: int, dtype: torch.dtype) -> dict:
    """k2 = 0: without the second product."""
    return dict(HAS_Y=k2 > 0, ACC=_acc(dtype)[1], BLOCK_K1=_p2(k1), BLOCK_K2=_p2(max(k2, 1)), BLOCK_Q=_p2(q),
                **row_config(max(k1, k2, q), dtype))


def _launch(spec: dict) -> tuple[dict, dict]:
    """A spec -> (constexprs, launch options)."""
    opts = {k: spec[k] for k in _OPTIONS}
    return {k: v for k, v in spec.items() if k not in opts}, opts


def _splits(n: int, block_n: int) -> tuple[int, int]:
    blocks = triton.cdiv(max(n, 1), block_n)
    splits = max(1, min(_SPLITS, blocks))
    rows = triton.cdiv(blocks, splits) * block_n
    return triton.cdiv(max(n, 1), rows), rows


def _gram(x, xbar, y, ybar, centre_y: bool, scale=None):
    """(Σ (s ⊙ (x − x̄))ᵀ ỹ (G, P, Q), Σ y (G, Q), Σ s ⊙ ỹ (G, Q) or None) in the accumulation dtype;
    x (G, N, P), y (G, N, Q) contiguous, s = ``scale`` (G, N) or 1, ỹ = y − ȳ if ``centre_y`` else y."""
    g, n, p = x.shape
    q = y.shape[2]
    meta, opts = _launch(gram_spec(p, q, x.dtype, centre_y, scale is not None))
    splits, rows = _splits(n, meta["BLOCK_N"])
    acc = _acc(x.dtype)[0]
    part = x.new_empty(g, splits, p, q, dtype=acc)
    ysum = x.new_empty(g, splits, q, dtype=acc)
    sysum = None if scale is None else x.new_empty(g, splits, q, dtype=acc)
    gram_kernel[(splits, g)](x, xbar, ysum if scale is None else scale, y, ybar, part, ysum,
                             ysum if scale is None else sysum, n, p, q, rows, splits, **meta, **opts)
    return part.sum(1), ysum.sum(1), None if sysum is None else sysum.sum(1)


def _rows(x, xbar, b1, y, b2, bias, out_dtype):
    """(x − x̄) B1 [+ y B2] + bias: x (G, N, K1), B1 (G, K1, Q), y (G, N, K2), B2 (G, K2, Q), bias (G, Q)."""
    g, n, k1 = x.shape
    q = b1.shape[2]
    k2 = 0 if y is None else y.shape[2]
    out = x.new_empty(g, n, q, dtype=out_dtype)
    meta, opts = _launch(rows_spec(k1, k2, q, x.dtype))
    rows_kernel[(triton.cdiv(n, meta["BLOCK_N"]), g)](
        x, xbar, b1.contiguous(), x if y is None else y, b1 if b2 is None else b2.contiguous(), bias.contiguous(),
        out, n, k1, max(k2, 1), q, **meta, **opts)
    return out


def _forward(c, k, w, v, eps: float, inj: bool, keep_t: bool):
    g, nq, m = c.shape
    nk, e = k.shape[1], v.shape[2]
    f32 = _acc(c.dtype)[0]
    c_mean = c.mean(1, dtype=f32) if inj else c.new_zeros(g, m, dtype=f32)
    k_mean = k.mean(1, dtype=f32)
    zeros_e = c.new_zeros(g, e, dtype=f32)
    t = rinv = dsc = sw = sp = None
    if inj:
        cov = _gram(c, c_mean, c, c_mean, True)[0] / nq
        sw = cov if w is None else torch.bmm(cov, w.to(f32))
        sp = (sw if w is None else torch.bmm(w.to(f32).transpose(1, 2), sw)).contiguous()
        t = c.new_empty(g, nk, m, dtype=f32) if keep_t else None
        rinv = c.new_empty(g, nk, dtype=f32)
        dsc = c.new_empty(g, nk, dtype=f32)
        meta, opts = _launch(key_fwd_spec(m, c.dtype, t is not None))
        key_fwd_kernel[(triton.cdiv(nk, meta["BLOCK_N"]), g)](
            k, k_mean, sp, rinv if t is None else t, rinv, dsc, nk, m, float(eps), **meta, **opts)
        m_k, v_sum, rv_sum = _gram(k, k_mean, v, zeros_e, False, scale=rinv)
    else:
        m_k, v_sum, _ = _gram(k, k_mean, v, zeros_e, False)
        rv_sum = v_sum
    v_mean = v_sum / max(nk, 1)
    m_mat = m_k if w is None else torch.bmm(w.to(f32), m_k)
    out = _rows(c, c_mean, m_mat, None, None, v_mean, c.dtype)
    return out, t, (c_mean, k_mean, sw, sp, m_k, m_mat, rv_sum, v_mean, rinv, dsc)


def _backward(grad, c, k, w, v, inj: bool, saved, t):
    c_mean, k_mean, sw, sp, m_k, m_mat, rv_sum, v_mean, rinv, dsc = saved
    g, nq, m = c.shape
    nk, e = k.shape[1], v.shape[2]
    f32 = _acc(c.dtype)[0]
    w32 = None if w is None else w.to(f32)
    zeros_e = grad.new_zeros(g, e, dtype=f32)
    d_m, g_sum, _ = _gram(c, c_mean, grad, zeros_e, False)
    d_mk = (d_m if w is None else torch.bmm(w32.transpose(1, 2), d_m)).contiguous()
    g_k = g_sum / max(nk, 1)
    d_k = t if t is not None else c.new_empty(g, nk, m, dtype=f32)
    d_v = v.new_empty(g, nk, e)
    ds = c.new_empty(g, nk, dtype=f32) if inj else None
    meta, opts = _launch(key_bwd_spec(m, e, c.dtype, inj, t is not None))
    key_bwd_kernel[(triton.cdiv(nk, meta["BLOCK_N"]), g)](
        k, k_mean, v, d_mk if sp is None else sp, d_mk, g_k, *((g_k,) * 2 if rinv is None else (rinv, dsc)),
        d_k, d_k, d_v, g_k if ds is None else ds, nk, m, e, **meta, **opts)
    m_t = m_mat.transpose(1, 2).contiguous()
    if inj:
        d_sp, _, u_sum = _gram(k, k_mean, k, k_mean, True, scale=ds)
        mean_dk = (torch.bmm(rv_sum.unsqueeze(1), d_mk.transpose(1, 2))
                   + 2.0 * torch.bmm(u_sum.unsqueeze(1), sp)) / max(nk, 1)
        d_s = d_sp if w is None else torch.bmm(torch.bmm(w32, d_sp), w32.transpose(1, 2))
        d_c = _rows(c, c_mean, d_s * (2.0 / max(nq, 1)), grad, m_t,
                    -torch.bmm((g_sum / max(nq, 1)).unsqueeze(1), m_t).squeeze(1), c.dtype)
    else:
        d_sp = None
        mean_dk = torch.bmm(v_mean.unsqueeze(1), d_mk.transpose(1, 2))
        d_c = _rows(grad, zeros_e, m_t, None, None, grad.new_zeros(g, m, dtype=f32), c.dtype)
    d_k.sub_(mean_dk)
    d_w = None
    if w is not None:
        d_w = torch.bmm(d_m, m_k.transpose(1, 2))
        if inj:
            d_w = torch.baddbmm(d_w, sw, d_sp, alpha=2.0)
        d_w = d_w.to(w.dtype)
    return d_c, d_k.to(k.dtype), d_w, d_v


class NormalizationTriton(torch.autograd.Function):
    """out (G, Nq, e) for c (G, Nq, m), k (G, Nk, m), w (G, m, m) or None, v (G, Nk, e) contiguous, float
    eps and ``inj`` (True: injective, False: inline); first-order backward (docs/DESIGN.md §4.3)."""

    @staticmethod
    def forward(ctx, c, k, w, v, eps, inj):
        out, t, saved = _forward(c, k, w, v, eps, inj, keep_t=True)
        ctx.save_for_backward(c, k, w, v, *saved)
        ctx.inj, ctx.t = inj, t
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        c, k, w, v, *saved = ctx.saved_tensors
        t, ctx.t = ctx.t, None  # t becomes dC_k; a second backward recomputes it
        d_c, d_k, d_w, d_v = _backward(grad.contiguous(), c, k, w, v, ctx.inj, saved, t)
        return d_c, d_k, d_w, d_v, None, None


def forward_saving(c: torch.Tensor, k: torch.Tensor, w: torch.Tensor | None, v: torch.Tensor, eps: float,
                   inj: bool) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """The forward without autograd and without t, for a caller that runs the backward itself (the lean
    recompute, docs/DESIGN.md §5.5): out and the m×m, m×e and per-key statistics of the backward."""
    c, k, v = c.contiguous(), k.contiguous(), v.contiguous()
    out, _, saved = _forward(c, k, None if w is None else w.contiguous(), v, eps, inj, keep_t=False)
    return out, saved


def backward_saved(grad: torch.Tensor, c: torch.Tensor, k: torch.Tensor, w: torch.Tensor | None, v: torch.Tensor,
                   inj: bool, saved: tuple[torch.Tensor, ...]):
    """(dc, dk, dw or None, dv) of ``forward_saving`` from the same factors and its statistics (t recomputed)."""
    c, k, v = c.contiguous(), k.contiguous(), v.contiguous()
    return _backward(grad.contiguous(), c, k, None if w is None else w.contiguous(), v, inj, tuple(saved), None)


def normalize_triton(c: torch.Tensor, k: torch.Tensor, v: torch.Tensor, norm: str, eps: float,
                     w: torch.Tensor | None) -> torch.Tensor:
    """(G, Nq, m), (G, Nk, m), (G, Nk, e), w (G, m, m) or None -> (G, Nq, e), autograd when needed;
    ValueError for the m, e, dtype that ``limits.triton_unfit`` refuses."""
    why = triton_unfit(c.dtype, k.shape[-1], v.shape[-1])
    if why is not None:
        raise ValueError(f"normalize_triton: {why}")
    c, k, v = c.contiguous(), k.contiguous(), v.contiguous()
    w = None if w is None else w.contiguous()
    inj = norm == "injective"
    tensors = (c, k, v) if w is None else (c, k, v, w)
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return NormalizationTriton.apply(c, k, w, v, float(eps), inj)
    return _forward(c, k, w, v, eps, inj, keep_t=False)[0]


_SIZES = {"N", "P", "Q", "M", "E", "NK", "K1", "K2", "SPLITS", "rows_per_split"}
_INPUTS = {"X", "Y", "K", "V", "DV", "OUT"}
"""Pointer arguments in the input dtype; the others are workspaces in the accumulation dtype."""


def _signature(kernel, dtype: torch.dtype, constexprs: dict) -> dict:
    """Runtime arguments of ``kernel`` (those not in ``constexprs``) -> Triton types: inputs in ``dtype``,
    workspaces in its accumulation dtype, sizes i32, eps fp32."""
    acc = _TL[_acc(dtype)[0]]
    sig = {}
    for name in kernel.arg_names:
        if name in constexprs:
            continue
        if name == "eps":
            sig[name] = "fp32"
        elif name in _SIZES:
            sig[name] = "i32"
        else:
            sig[name] = f"*{_TL[dtype]}" if name in _INPUTS else f"*{acc}"
    return sig


def _launches(m: int, e: int, dtype: torch.dtype):
    """(kernel, spec, label) of every launch of ``_forward`` / ``_backward`` for these m, e, dtype."""
    tag_m = f"dtype={_TL[dtype]} m={m}"  # the launches that do not depend on e
    tag = f"{tag_m} e={e}"
    yield gram_kernel, gram_spec(m, m, dtype, True, False), f"norm_gram {tag_m} use=cov"
    yield gram_kernel, gram_spec(m, e, dtype, False, True), f"norm_gram {tag} use=key_fwd"
    yield gram_kernel, gram_spec(m, e, dtype, False, False), f"norm_gram {tag} use=dM"  # and the inline key_fwd
    yield gram_kernel, gram_spec(m, m, dtype, True, True), f"norm_gram {tag_m} use=key_bwd"
    for save_t in (True, False):
        yield key_fwd_kernel, key_fwd_spec(m, dtype, save_t), f"norm_key_fwd {tag_m} save_t={int(save_t)}"
    for inj, has_t in ((True, True), (True, False), (False, False)):
        yield (key_bwd_kernel, key_bwd_spec(m, e, dtype, inj, has_t),
               f"norm_key_bwd {tag} inj={int(inj)} has_t={int(has_t)}")
    yield rows_kernel, rows_spec(m, 0, e, dtype), f"norm_rows {tag} use=out"
    yield rows_kernel, rows_spec(m, e, m, dtype), f"norm_rows {tag} use=dc"
    yield rows_kernel, rows_spec(e, 0, m, dtype), f"norm_rows {tag} use=dc_inline"


def aot_specialisations(d_max: int = 128, m_max: int = 128):
    """Every (kernel, signature, constexprs, num_warps, num_stages, label, options) the launchers above can
    produce (``options``: the compile option ``maxnreg``) for m <= m_max landmarks and e <= d_max value
    features within what the registry serves (``limits.triton_unfit``), from the same
    ``*_spec`` functions (benchmarks/triton_aot.py).
    m and e are enumerated as powers of two (the specs depend on them only through ``next_power_of_2``);
    identical specialisations are yielded once, under the label of their first launch."""
    dims = lambda top: [b for b in (16, 32, 64, 128) if b <= _p2(min(top, MAX_DIM))]  # noqa: E731
    seen = set()
    for dtype in _TL:
        for m in dims(m_max):
            for e in dims(d_max):
                if triton_unfit(dtype, m, e) is not None:
                    continue
                for kernel, spec, label in _launches(m, e, dtype):
                    meta, opts = _launch(spec)
                    sig = _signature(kernel, dtype, meta)
                    key = (kernel.__name__, tuple(sorted(sig.items())),
                           tuple(sorted((k, str(v)) for k, v in meta.items())), tuple(sorted(opts.items())))
                    if key not in seen:
                        seen.add(key)
                        yield (kernel, sig, meta, opts["num_warps"], opts["num_stages"], label,
                               {"maxnreg": opts["maxnreg"]})

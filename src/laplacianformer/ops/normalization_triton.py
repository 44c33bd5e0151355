"""The fused injective / inline normalisation in Triton (docs/DESIGN.md §4.3, §6); formulas in
``ops/injective.py``, the CPU twin in ``csrc/normalization.c``.

Backend ``triton`` of the op ``normalization``. Per batch·head, c (Nq, m) = C_q, k (Nk, m) = C_k,
w (m, m) = W⁺ or None (k is B), v (Nk, e); products accumulate in float32 (``tl.dot`` as "tf32x3": the
variances s_j must not lose the bits plain TF32 would), float64 for float64 inputs; inputs may be
float32/float64/float16/bfloat16.

- ``tn_kernel``: partial sums over row splits of (x − x̄)ᵀ (y − ȳ) and Σ y (the covariance S of C_q and
  dM = C̃_qᵀ G), into a (G, splits, P, Q) workspace summed in a fixed order (deterministic, no atomics);
- ``key_fwd_kernel``: t = k̃ S', s = rowsum(t ⊙ k̃), r = (max(s, 0) + eps)^(-1/2), stored t (for the
  backward), r, −r³/2 [s ≥ 0]; partial sums of (r ⊙ k̃)ᵀ v, Σ r v, Σ v;
- ``rows_kernel``: (x − x̄) B1 [+ y B2] + bias, row by row (out = C̃_q M + v̄ and dC_q);
- ``key_bwd_kernel``: dv = r (k̃ dM') + Ḡ_k, Y = v dM'ᵀ, ds, dk̃ = r Y + 2 ds t (t recomputed when not
  kept; dk may overwrite t), partial sums of k̃ᵀ (ds ⊙ k̃) and Σ ds k̃.
The m×m and m×e algebra between the passes (S' = Wᵀ S W, M = W M', dS = W dS' Wᵀ, dW) is torch.

m and e up to 64 (``MAX_DIM``): compiled for sm_90 (``triton.compile`` with ``GPUTarget("cuda", 90, 32)``)
these passes use no spill stores with float32/bfloat16 tiles of 64 (products as "tf32x3", split TF32
with float32 accuracy, on the tensor cores); at 128 they spilled and the key backward asked for more
shared memory than a block gets. ``aot_specialisations`` lists every launch configuration for
``benchmarks/triton_aot.py``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

MAX_DIM = 64
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
def tn_kernel(X, XBAR, Y, YBAR, PART, YSUM, N, P, Q, rows_per_split, SPLITS,
              CENTRE_Y: tl.constexpr, ACC: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_Q: tl.constexpr):
    split, g = tl.program_id(0), tl.program_id(1)
    rp = tl.arange(0, BLOCK_P)
    rq = tl.arange(0, BLOCK_Q)
    xbar = tl.load(XBAR + g * P + rp, mask=rp < P, other=0.0)
    ybar = tl.load(YBAR + g * Q + rq, mask=rq < Q, other=0.0)
    acc = tl.zeros((BLOCK_P, BLOCK_Q), dtype=ACC)
    ysum = tl.zeros((BLOCK_Q,), dtype=ACC)
    lo = split * rows_per_split
    for n0 in range(lo, lo + rows_per_split, BLOCK_N):
        rn = n0 + tl.arange(0, BLOCK_N)
        rmask = rn < N
        x = tl.load(X + g * N * P + rn[:, None] * P + rp[None, :], mask=rmask[:, None] & (rp[None, :] < P), other=0.0)
        x = tl.where(rmask[:, None] & (rp[None, :] < P), x.to(ACC) - xbar[None, :], 0.0)
        y = tl.load(Y + g * N * Q + rn[:, None] * Q + rq[None, :], mask=rmask[:, None] & (rq[None, :] < Q), other=0.0)
        y = y.to(ACC)
        ysum += tl.sum(y, axis=0)
        if CENTRE_Y:
            y = tl.where(rmask[:, None] & (rq[None, :] < Q), y - ybar[None, :], 0.0)
        acc += _dot(tl.trans(x), y, ACC)
    base = (g * SPLITS + split) * P * Q
    tl.store(PART + base + rp[:, None] * Q + rq[None, :], acc, mask=(rp[:, None] < P) & (rq[None, :] < Q))
    tl.store(YSUM + (g * SPLITS + split) * Q + rq, ysum, mask=rq < Q)


@triton.jit
def key_fwd_kernel(K, KBAR, SP, V, T, RINV, DSC, PART, RVS, VS, NK, M, E, eps, rows_per_split, SPLITS,
                   INJ: tl.constexpr, SAVE_T: tl.constexpr, ACC: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr):
    split, g = tl.program_id(0), tl.program_id(1)
    rm = tl.arange(0, BLOCK_M)
    re = tl.arange(0, BLOCK_E)
    kbar = tl.load(KBAR + g * M + rm, mask=rm < M, other=0.0)
    sp = tl.load(SP + g * M * M + rm[:, None] * M + rm[None, :], mask=(rm[:, None] < M) & (rm[None, :] < M), other=0.0)
    acc = tl.zeros((BLOCK_M, BLOCK_E), dtype=ACC)
    rvs = tl.zeros((BLOCK_E,), dtype=ACC)
    vs = tl.zeros((BLOCK_E,), dtype=ACC)
    lo = split * rows_per_split
    for n0 in range(lo, lo + rows_per_split, BLOCK_N):
        rn = n0 + tl.arange(0, BLOCK_N)
        rmask = rn < NK
        kmask = rmask[:, None] & (rm[None, :] < M)
        x = tl.load(K + g * NK * M + rn[:, None] * M + rm[None, :], mask=kmask, other=0.0)
        x = tl.where(kmask, x.to(ACC) - kbar[None, :], 0.0)
        vmask = rmask[:, None] & (re[None, :] < E)
        v = tl.load(V + g * NK * E + rn[:, None] * E + re[None, :], mask=vmask, other=0.0).to(ACC)
        if INJ:
            t = _dot(x, sp, ACC)
            s = tl.sum(t * x, axis=1)
            r = 1.0 / tl.sqrt(tl.maximum(s, 0.0) + eps)
            if SAVE_T:
                tl.store(T + g * NK * M + rn[:, None] * M + rm[None, :], t, mask=kmask)
            tl.store(RINV + g * NK + rn, r, mask=rmask)
            tl.store(DSC + g * NK + rn, tl.where(s >= 0.0, -0.5 * r * r * r, 0.0), mask=rmask)
            r = tl.where(rmask, r, 0.0)
        else:
            r = tl.where(rmask, 1.0, 0.0)
        acc += _dot(tl.trans(x * r[:, None]), v, ACC)
        rvs += tl.sum(v * r[:, None], axis=0)
        vs += tl.sum(v, axis=0)
    base = (g * SPLITS + split)
    tl.store(PART + base * M * E + rm[:, None] * E + re[None, :], acc, mask=(rm[:, None] < M) & (re[None, :] < E))
    tl.store(RVS + base * E + re, rvs, mask=re < E)
    tl.store(VS + base * E + re, vs, mask=re < E)


@triton.jit
def rows_kernel(X, XBAR, B1, Y, B2, BIAS, OUT, N, K1, K2, Q,
                HAS_Y: tl.constexpr, ACC: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K1: tl.constexpr, BLOCK_K2: tl.constexpr,
                BLOCK_Q: tl.constexpr):
    pid, g = tl.program_id(0), tl.program_id(1)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K1)
    rq = tl.arange(0, BLOCK_Q)
    rmask = rn < N
    xmask = rmask[:, None] & (rk[None, :] < K1)
    x = tl.load(X + g * N * K1 + rn[:, None] * K1 + rk[None, :], mask=xmask, other=0.0)
    xbar = tl.load(XBAR + g * K1 + rk, mask=rk < K1, other=0.0)
    x = tl.where(xmask, x.to(ACC) - xbar[None, :], 0.0)
    b1 = tl.load(B1 + g * K1 * Q + rk[:, None] * Q + rq[None, :], mask=(rk[:, None] < K1) & (rq[None, :] < Q), other=0.0)
    acc = _dot(x, b1, ACC)
    if HAS_Y:
        r2 = tl.arange(0, BLOCK_K2)
        y = tl.load(Y + g * N * K2 + rn[:, None] * K2 + r2[None, :], mask=rmask[:, None] & (r2[None, :] < K2), other=0.0)
        b2 = tl.load(B2 + g * K2 * Q + r2[:, None] * Q + rq[None, :], mask=(r2[:, None] < K2) & (rq[None, :] < Q),
                     other=0.0)
        acc += _dot(y.to(ACC), b2, ACC)
    bias = tl.load(BIAS + g * Q + rq, mask=rq < Q, other=0.0)
    acc += bias[None, :]
    tl.store(OUT + g * N * Q + rn[:, None] * Q + rq[None, :], acc.to(OUT.dtype.element_ty),
             mask=rmask[:, None] & (rq[None, :] < Q))


@triton.jit
def key_bwd_kernel(K, KBAR, V, SP, DMK, GK, RINV, DSC, T, DK, DV, PART, USUM, NK, M, E, rows_per_split, SPLITS,
                   INJ: tl.constexpr, HAS_T: tl.constexpr, ACC: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr):
    split, g = tl.program_id(0), tl.program_id(1)
    rm = tl.arange(0, BLOCK_M)
    re = tl.arange(0, BLOCK_E)
    mm_mask = (rm[:, None] < M) & (rm[None, :] < M)
    me_mask = (rm[:, None] < M) & (re[None, :] < E)
    kbar = tl.load(KBAR + g * M + rm, mask=rm < M, other=0.0)
    dmk = tl.load(DMK + g * M * E + rm[:, None] * E + re[None, :], mask=me_mask, other=0.0)
    gk = tl.load(GK + g * E + re, mask=re < E, other=0.0)
    if INJ:
        sp = tl.load(SP + g * M * M + rm[:, None] * M + rm[None, :], mask=mm_mask, other=0.0)
    acc = tl.zeros((BLOCK_M, BLOCK_M), dtype=ACC)
    usum = tl.zeros((BLOCK_M,), dtype=ACC)
    lo = split * rows_per_split
    for n0 in range(lo, lo + rows_per_split, BLOCK_N):
        rn = n0 + tl.arange(0, BLOCK_N)
        rmask = rn < NK
        kmask = rmask[:, None] & (rm[None, :] < M)
        vmask = rmask[:, None] & (re[None, :] < E)
        x = tl.load(K + g * NK * M + rn[:, None] * M + rm[None, :], mask=kmask, other=0.0)
        x = tl.where(kmask, x.to(ACC) - kbar[None, :], 0.0)
        v = tl.load(V + g * NK * E + rn[:, None] * E + re[None, :], mask=vmask, other=0.0).to(ACC)
        dv = _dot(x, dmk, ACC)
        y = _dot(v, tl.trans(dmk), ACC)
        if INJ:
            r = tl.load(RINV + g * NK + rn, mask=rmask, other=0.0)
            dv = dv * r[:, None]
            ds = tl.load(DSC + g * NK + rn, mask=rmask, other=0.0) * tl.sum(y * x, axis=1)
            if HAS_T:
                t = tl.load(T + g * NK * M + rn[:, None] * M + rm[None, :], mask=kmask, other=0.0)
            else:
                t = _dot(x, sp, ACC)
            dk = r[:, None] * y + 2.0 * ds[:, None] * t
            u = x * ds[:, None]
            acc += _dot(tl.trans(u), x, ACC)
            usum += tl.sum(u, axis=0)
        else:
            dk = y
        tl.store(DV + g * NK * E + rn[:, None] * E + re[None, :], (dv + gk[None, :]).to(DV.dtype.element_ty), mask=vmask)
        tl.store(DK + g * NK * M + rn[:, None] * M + rm[None, :], dk, mask=kmask)
    base = g * SPLITS + split
    tl.store(PART + base * M * M + rm[:, None] * M + rm[None, :], acc, mask=mm_mask)
    tl.store(USUM + base * M + rm, usum, mask=rm < M)


def _p2(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


def _config(m: int, e: int) -> tuple[int, int]:
    """(BLOCK_N, num_warps) of the row passes for m, e: fewer rows per block for wide tiles (registers)."""
    width = max(_p2(m), _p2(e))
    if width <= 32:
        return 32, 4
    if width <= 64:
        return 16, 8
    return 16, 8


def _splits(n: int, block_n: int) -> tuple[int, int]:
    blocks = triton.cdiv(max(n, 1), block_n)
    splits = max(1, min(_SPLITS, blocks))
    rows = triton.cdiv(blocks, splits) * block_n
    return triton.cdiv(max(n, 1), rows), rows


def _tn(x, xbar, y, ybar, centre_y: bool):
    """(Σ (x − x̄)ᵀ (y − ȳ) (G, P, Q), Σ y (G, Q)) in float32; x (G, N, P), y (G, N, Q) contiguous."""
    g, n, p = x.shape
    q = y.shape[2]
    bn, warps = _config(p, q)
    splits, rows = _splits(n, bn)
    acc, acc_tl = _acc(x.dtype)
    part = x.new_empty(g, splits, p, q, dtype=acc)
    ysum = x.new_empty(g, splits, q, dtype=acc)
    tn_kernel[(splits, g)](x, xbar, y, ybar, part, ysum, n, p, q, rows, splits, CENTRE_Y=centre_y, ACC=acc_tl,
                           BLOCK_N=bn, BLOCK_P=_p2(p), BLOCK_Q=_p2(q), num_warps=warps)
    return part.sum(1), ysum.sum(1)


def _rows(x, xbar, b1, y, b2, bias, out_dtype):
    """(x − x̄) B1 [+ y B2] + bias: x (G, N, K1), B1 (G, K1, Q), y (G, N, K2), B2 (G, K2, Q), bias (G, Q)."""
    g, n, k1 = x.shape
    q = b1.shape[2]
    k2 = 0 if y is None else y.shape[2]
    out = x.new_empty(g, n, q, dtype=out_dtype)
    bn, warps = _config(max(k1, k2), q)
    rows_kernel[(triton.cdiv(n, bn), g)](
        x, xbar, b1.contiguous(), x if y is None else y, b1 if b2 is None else b2.contiguous(), bias.contiguous(),
        out, n, k1, max(k2, 1), q, HAS_Y=y is not None, ACC=_acc(x.dtype)[1], BLOCK_N=bn, BLOCK_K1=_p2(k1), BLOCK_K2=_p2(max(k2, 1)),
        BLOCK_Q=_p2(q), num_warps=warps)
    return out


def _forward(c, k, w, v, eps: float, inj: bool, keep_t: bool):
    g, nq, m = c.shape
    nk, e = k.shape[1], v.shape[2]
    f32, acc_tl = _acc(c.dtype)
    c_mean = c.mean(1, dtype=f32) if inj else c.new_zeros(g, m, dtype=f32)
    k_mean = k.mean(1, dtype=f32)
    if inj:
        cov, _ = _tn(c, c_mean, c, c_mean, True)
        cov = cov / nq
        sw = cov if w is None else torch.bmm(cov, w.to(f32))
        sp = sw if w is None else torch.bmm(w.to(f32).transpose(1, 2), sw)
        sp = sp.contiguous()
    else:
        sw = sp = c.new_zeros(g, m, m, dtype=f32)
    bn, warps = _config(m, e)
    splits, rows = _splits(nk, bn)
    t = c.new_empty(g, nk, m, dtype=f32) if inj and keep_t else None
    rinv = c.new_empty(g, nk, dtype=f32)
    dsc = c.new_empty(g, nk, dtype=f32)
    part = c.new_empty(g, splits, m, e, dtype=f32)
    rvs = c.new_empty(g, splits, e, dtype=f32)
    vs = c.new_empty(g, splits, e, dtype=f32)
    key_fwd_kernel[(splits, g)](k, k_mean, sp, v, rinv if t is None else t, rinv, dsc, part, rvs, vs, nk, m, e,
                                float(eps), rows, splits, INJ=inj, SAVE_T=t is not None, ACC=acc_tl, BLOCK_N=bn,
                                BLOCK_M=_p2(m), BLOCK_E=_p2(e), num_warps=warps)
    m_k, rv_sum, v_mean = part.sum(1), rvs.sum(1), vs.sum(1) / max(nk, 1)
    m_mat = m_k if w is None else torch.bmm(w.to(f32), m_k)
    out = _rows(c, c_mean, m_mat, None, None, v_mean, c.dtype)
    return out, t, (c_mean, k_mean, sw, sp, m_k, m_mat, rv_sum, v_mean, rinv, dsc)


def _backward(grad, c, k, w, v, inj: bool, saved, t):
    c_mean, k_mean, sw, sp, m_k, m_mat, rv_sum, v_mean, rinv, dsc = saved
    g, nq, m = c.shape
    nk, e = k.shape[1], v.shape[2]
    f32, acc_tl = _acc(c.dtype)
    w32 = None if w is None else w.to(f32)
    zeros_e = grad.new_zeros(g, e, dtype=f32)
    d_m, g_sum = _tn(c, c_mean, grad, zeros_e, False)
    d_mk = d_m if w is None else torch.bmm(w32.transpose(1, 2), d_m)
    d_mk = d_mk.contiguous()
    g_k = g_sum / max(nk, 1)
    bn, warps = _config(m, e)
    splits, rows = _splits(nk, bn)
    d_k = t if t is not None else c.new_empty(g, nk, m, dtype=f32)
    d_v = v.new_empty(g, nk, e)
    part = c.new_empty(g, splits, m, m, dtype=f32)
    usum = c.new_empty(g, splits, m, dtype=f32)
    key_bwd_kernel[(splits, g)](k, k_mean, v, sp, d_mk, g_k, rinv, dsc, d_k, d_k, d_v, part, usum, nk, m, e, rows,
                                splits, INJ=inj, HAS_T=t is not None, ACC=acc_tl, BLOCK_N=bn, BLOCK_M=_p2(m), BLOCK_E=_p2(e),
                                num_warps=warps)
    m_t = m_mat.transpose(1, 2).contiguous()
    if inj:
        d_sp, u_sum = part.sum(1), usum.sum(1)
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
    """(G, Nq, m), (G, Nk, m), (G, Nk, e), w (G, m, m) or None -> (G, Nq, e), autograd when needed."""
    c, k, v = c.contiguous(), k.contiguous(), v.contiguous()
    w = None if w is None else w.contiguous()
    inj = norm == "injective"
    tensors = (c, k, v) if w is None else (c, k, v, w)
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return NormalizationTriton.apply(c, k, w, v, float(eps), inj)
    return _forward(c, k, w, v, eps, inj, keep_t=False)[0]


def _signature(kernel, tname: str, workspaces=(), acc: str = "fp32") -> dict:
    """Runtime arguments of ``kernel`` -> Triton types: pointers in ``tname`` (``acc`` for the workspaces
    ``workspaces``), sizes i32, eps fp32."""
    sig = {}
    for param in kernel.params:
        if param.is_constexpr:
            continue
        name = param.name
        if name == "eps":
            sig[name] = "fp32"
        elif name in _SIZES:
            sig[name] = "i32"
        else:
            sig[name] = f"*{acc}" if name in workspaces else f"*{tname}"
    return sig


_SIZES = {"N", "P", "Q", "M", "E", "NK", "K1", "K2", "SPLITS", "rows_per_split"}


_WORKSPACES = {
    "tn": ("XBAR", "YBAR", "PART", "YSUM"),
    "key_fwd": ("KBAR", "SP", "T", "RINV", "DSC", "PART", "RVS", "VS"),
    "rows": ("XBAR", "B1", "B2", "BIAS"),
    "key_bwd": ("KBAR", "SP", "DMK", "GK", "RINV", "DSC", "T", "DK", "PART", "USUM"),
}


def aot_specialisations(d_max: int = 128, m_max: int = 128):
    """Every (kernel, signature, constexprs, num_warps, num_stages, label) the launchers above can produce
    for m <= m_max landmarks and e <= d_max value features (benchmarks/triton_aot.py)."""
    seen = set()
    for spec in _specialisations(d_max, m_max):
        if spec[-1] not in seen:
            seen.add(spec[-1])
            yield spec


def _specialisations(d_max: int, m_max: int):
    pow2 = lambda top: [b for b in (16, 32, 64, 128) if b <= max(16, triton.next_power_of_2(min(top, MAX_DIM)))]
    for dtype, tname in _TL.items():
        acc = "fp64" if dtype == torch.float64 else "fp32"
        acc_tl = _acc(dtype)[1]
        for bm in pow2(m_max):
            for be in pow2(d_max):
                bn, warps = _config(bm, be)
                for inj in (True, False):
                    for flag in (True, False):
                        yield (key_fwd_kernel, _signature(key_fwd_kernel, tname, _WORKSPACES["key_fwd"], acc),
                               dict(INJ=inj, SAVE_T=flag, ACC=acc_tl, BLOCK_N=bn, BLOCK_M=bm, BLOCK_E=be), warps, 3,
                               f"key_fwd dtype={tname} m={bm} e={be} inj={int(inj)} save_t={int(flag)}")
                        yield (key_bwd_kernel, _signature(key_bwd_kernel, tname, _WORKSPACES["key_bwd"], acc),
                               dict(INJ=inj, HAS_T=flag, ACC=acc_tl, BLOCK_N=bn, BLOCK_M=bm, BLOCK_E=be), warps, 3,
                               f"key_bwd dtype={tname} m={bm} e={be} inj={int(inj)} has_t={int(flag)}")
                # covariance (P = Q = m, centred y) and dM (P = m, Q = e)
                for bp, bq, centre, label in ((bm, bm, True, "cov"), (bm, be, False, "dM")):
                    bn_, warps_ = _config(bp, bq)
                    yield (tn_kernel, _signature(tn_kernel, tname, _WORKSPACES["tn"], acc),
                           dict(CENTRE_Y=centre, ACC=acc_tl, BLOCK_N=bn_, BLOCK_P=bp, BLOCK_Q=bq), warps_, 3,
                           f"tn[{label}] dtype={tname} p={bp} q={bq}")
                # out = c̃ M + v̄ (K1 = m, Q = e); injective dc (K1 = m, K2 = e, Q = m); inline dc (K1 = e, Q = m)
                for k1, k2, q, label in ((bm, None, be, "out"), (bm, be, bm, "dc"), (be, None, bm, "dc_inline")):
                    bn_, warps_ = _config(max(k1, k2 or 0), q)
                    yield (rows_kernel, _signature(rows_kernel, tname, _WORKSPACES["rows"], acc),
                           dict(HAS_Y=k2 is not None, ACC=acc_tl, BLOCK_N=bn_, BLOCK_K1=k1, BLOCK_K2=k2 or 16, BLOCK_Q=q),
                           warps_, 3, f"rows[{label}] dtype={tname} k1={k1} k2={k2 or 0} q={q}")

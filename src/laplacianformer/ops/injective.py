"""Fused injective and inline normalisation of the Nyström factors, with a hand-written backward
(SPEC.md §4, the linear-cost form).

Per batch·head, with c = C_q (N×m), b = C_k W⁺ᵀ (N×m), v (N×e):

    c̄ = mean_i c_i,  b̄ = mean_j b_j,  c̃ = c − c̄,  b̃ = b − b̄,  v̄ = mean_j v_j
    injective:  S = c̃ᵀc̃ / N (m×m),  s_j = max(b̃_jᵀ S b̃_j, 0),  r_j = (s_j + eps)^(-1/2),
                M = b̃ᵀ (r ⊙ v) (m×e),  out = c̃ M + v̄
    inline:     M = b̃ᵀ v,  out = c M + v̄

Backward with G = dL/dout (N×e), Ḡ = (1/N_keys) Σ_i G_i (queries and keys may differ in number):

    dM = c̃ᵀ G,  dc̃ = G Mᵀ,  dv = Ḡ + r ⊙ (b̃ dM),  dr_j = (b̃ dM)_j · v_j
    ds_j = −½ r_j³ dr_j [s_j ≥ 0],  u = ds ⊙ b̃,  dS = b̃ᵀ u,  dc̃ += (2/N) c̃ dS
    db̃ = r ⊙ (v dMᵀ) + 2 u S,  dc = dc̃ − mean_i dc̃_i,  db = db̃ − mean_j db̃_j

Why a custom function: autograd of the composite keeps and creates about ten (N, m) temporaries
per call, and fresh large allocations are slow on CPU (page faults).  Here the forward keeps only
its inputs and m×m / m×e / N-sized results; both passes walk c and b in row blocks (``BLOCK_ELEMENTS``)
through a few reused scratch buffers, recompute c̃ and b̃ per block, and write straight into the
outputs, so the only (N, ·) allocations are out, dc, db and dv.  Products with v use N×e arrays
(r ⊙ v) rather than N×m ones.  Both covariances stay centred (no E[ccᵀ] − c̄c̄ᵀ cancellation in float32).

The backward is first order only: a second derivative through it raises a RuntimeError
(``once_differentiable``).  Callers wanting double backward use the composite
``normalization.normalize_nystrom_reference``.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable


BLOCK_ELEMENTS = 1 << 18
"""Elements of one (rows, m) working block on CPU: the passes below walk c and b in blocks of about
this size (1 MiB in float32, cache-resident) and write into preallocated outputs, instead of
allocating (N, m) temporaries.  On other devices (cheap caching allocator, costly launches) one block
covers everything."""


def _rows_contiguous(x: torch.Tensor) -> torch.Tensor:
    """x itself when its last dimension is contiguous (the products read any row stride, e.g. the heads of
    a (B, N, H·e) value tensor), else a contiguous copy."""
    return x if x.stride(-1) == 1 else x.contiguous()


def _centre(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    mean = x.mean(-2, keepdim=True)
    return x - mean, mean


def _blocks(x: torch.Tensor) -> list[tuple[slice, slice]]:
    """(group slice, row slice) pairs covering x (groups, rows, width); each x[g, r] of a contiguous x
    is contiguous: a block either spans all rows (several groups) or lies in one group."""
    groups, rows, width = x.shape
    if x.device.type != "cpu":
        return [(slice(0, groups), slice(0, rows))]
    per_group = max(rows * width, 1)
    if per_group <= BLOCK_ELEMENTS:
        step = max(1, BLOCK_ELEMENTS // per_group)
        return [(slice(g, min(g + step, groups)), slice(0, rows)) for g in range(0, groups, step)]
    step = max(1, BLOCK_ELEMENTS // max(width, 1))
    return [(slice(g, g + 1), slice(i, min(i + step, rows))) for g in range(groups) for i in range(0, rows, step)]


class _Scratch:
    """One reusable buffer per name, viewed at each block's (groups, rows, width) shape."""

    def __init__(self, like: torch.Tensor, blocks: list[tuple[slice, slice]]):
        self.like = like
        self.shape = (max(g.stop - g.start for g, _ in blocks), max(r.stop - r.start for _, r in blocks))
        self.buffers: dict[tuple[str, int], torch.Tensor] = {}

    def get(self, name: str, g: slice, r: slice, width: int) -> torch.Tensor:
        key = (name, width)
        if key not in self.buffers:
            self.buffers[key] = self.like.new_empty(self.shape[0] * self.shape[1] * width)
        size = (g.stop - g.start) * (r.stop - r.start) * width
        return self.buffers[key][:size].view(g.stop - g.start, r.stop - r.start, width)


def _injective_forward(c, b, v, eps):
    """Blockwise forward.  Returns out (G, Nq, e) and what the backward needs:
    c̄ (G, 1, m), b̄ (G, 1, m), S (G, m, m), s (G, Nk, 1) unclamped, r (G, Nk, 1), M (G, m, e)."""
    groups, n_q, m = c.shape
    n_k, e = b.shape[1], v.shape[2]
    c_mean = c.mean(-2, keepdim=True)
    b_mean = b.mean(-2, keepdim=True)
    c_blocks, b_blocks = _blocks(c), _blocks(b)
    c_scratch, b_scratch = _Scratch(c, c_blocks), _Scratch(b, b_blocks)
    cov = c.new_zeros(groups, m, m)
    for g, r in c_blocks:
        c_t = torch.sub(c[g, r], c_mean[g], out=c_scratch.get("c", g, r, m))
        cov[g].baddbmm_(c_t.transpose(1, 2), c_t)
    cov.div_(n_q)
    s = b.new_empty(groups, n_k, 1)
    rinv = b.new_empty(groups, n_k, 1)
    m_mat = b.new_zeros(groups, m, e)
    for g, r in b_blocks:
        b_t = torch.sub(b[g, r], b_mean[g], out=b_scratch.get("b", g, r, m))
        t = torch.bmm(b_t, cov[g], out=b_scratch.get("t", g, r, m))
        torch.sum(t.mul_(b_t), -1, keepdim=True, out=s[g, r])
        r_blk = torch.clamp_min(s[g, r], 0.0, out=rinv[g, r]).add_(eps).rsqrt_()
        m_mat[g].baddbmm_(b_t.transpose(1, 2), torch.mul(v[g, r], r_blk, out=b_scratch.get("v", g, r, e)))
    out = c.new_empty(groups, n_q, e)
    v_mean = v.mean(-2, keepdim=True)
    for g, r in c_blocks:
        c_t = torch.sub(c[g, r], c_mean[g], out=c_scratch.get("c", g, r, m))
        torch.baddbmm(v_mean[g], c_t, m_mat[g], out=out[g, r])
    return out, (c_mean, b_mean, cov, s, rinv, m_mat)


def injective_forward(c: torch.Tensor, b: torch.Tensor, v: torch.Tensor, eps: float) -> torch.Tensor:
    """Output of the injective variant without autograd bookkeeping.

    c (G, Nq, m), b (G, Nk, m), v (G, Nk, e) -> (G, Nq, e)."""
    return _injective_forward(c.contiguous(), b.contiguous(), _rows_contiguous(v), eps)[0]


def inline_forward(c: torch.Tensor, b: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Output of the inline variant.  (G, Nq, m), (G, Nk, m), (G, Nk, e) -> (G, Nq, e)."""
    b_t, _ = _centre(b)
    return torch.baddbmm(v.mean(-2, keepdim=True), c, torch.bmm(b_t.transpose(1, 2), v))


class InjectiveNormalization(torch.autograd.Function):
    """out = c̃ M + v̄ for (G, Nq, m) c, (G, Nk, m) b and (G, Nk, e) v; see the module docstring."""

    @staticmethod
    def forward(ctx, c, b, v, eps):
        c, b, v = c.contiguous(), b.contiguous(), _rows_contiguous(v)
        out, saved = _injective_forward(c, b, v, eps)
        ctx.save_for_backward(c, b, v, *saved)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        c, b, v, c_mean, b_mean, cov, s, rinv, m_mat = ctx.saved_tensors
        groups, n_q, m = c.shape
        n_k, e = b.shape[1], v.shape[2]
        grad = grad.contiguous()
        c_blocks, b_blocks = _blocks(c), _blocks(b)
        c_scratch, b_scratch = _Scratch(c, c_blocks), _Scratch(b, b_blocks)
        d_m = c.new_zeros(groups, m, e)
        for g, r in c_blocks:
            c_t = torch.sub(c[g, r], c_mean[g], out=c_scratch.get("c", g, r, m))
            d_m[g].baddbmm_(c_t.transpose(1, 2), grad[g, r])
        grad_mean = grad.sum(-2, keepdim=True).div_(n_k)
        d_v = v.new_empty(v.shape)
        d_b = b.new_empty(b.shape)
        d_b_sum = b.new_zeros(groups, 1, m)
        d_cov = c.new_zeros(groups, m, m)
        cov2 = cov * 2.0
        d_m_t = d_m.transpose(1, 2)
        scale = rinv.pow(3).mul_(-0.5).mul_(s >= 0)
        for g, r in b_blocks:
            b_t = torch.sub(b[g, r], b_mean[g], out=b_scratch.get("b", g, r, m))
            p = torch.bmm(b_t, d_m[g], out=b_scratch.get("p", g, r, e))
            r_blk = rinv[g, r]
            torch.mul(p, r_blk, out=d_v[g, r]).add_(grad_mean[g])
            d_s = p.mul_(v[g, r]).sum(-1, keepdim=True).mul_(scale[g, r])
            u = torch.mul(b_t, d_s, out=b_scratch.get("u", g, r, m))
            d_cov[g].baddbmm_(b_t.transpose(1, 2), u)
            d_b_blk = torch.bmm(u, cov2[g], out=d_b[g, r])
            d_b_blk.baddbmm_(torch.mul(v[g, r], r_blk, out=p), d_m_t[g])
            d_b_sum[g] += d_b_blk.sum(-2, keepdim=True)
        d_b.sub_(d_b_sum.div_(n_k))
        d_cov.mul_(2.0 / n_q)
        d_c = c.new_empty(c.shape)
        d_c_sum = c.new_zeros(groups, 1, m)
        m_t = m_mat.transpose(1, 2)
        for g, r in c_blocks:
            c_t = torch.sub(c[g, r], c_mean[g], out=c_scratch.get("c", g, r, m))
            d_c_blk = torch.bmm(c_t, d_cov[g], out=d_c[g, r])
            d_c_blk.baddbmm_(grad[g, r], m_t[g])
            d_c_sum[g] += d_c_blk.sum(-2, keepdim=True)
        d_c.sub_(d_c_sum.div_(n_q))
        return d_c, d_b, d_v, None


class InlineNormalization(torch.autograd.Function):
    """out = c (b̃ᵀ v) + v̄ for (G, N, m) factors c, b and values v (G, N, e); see the module docstring."""

    @staticmethod
    def forward(ctx, c, b, v):
        b_t, _ = _centre(b)
        m_mat = torch.bmm(b_t.transpose(1, 2), v)
        ctx.save_for_backward(c, b, v, m_mat)
        return torch.baddbmm(v.mean(-2, keepdim=True), c, m_mat)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        c, b, v, m_mat = ctx.saved_tensors
        grad = grad.contiguous()
        d_m = torch.bmm(c.transpose(1, 2), grad)
        b_t, _ = _centre(b)
        d_v = torch.baddbmm(grad.sum(-2, keepdim=True).div_(v.shape[-2]), b_t, d_m)
        d_b = torch.bmm(v, d_m.transpose(1, 2), out=b_t)
        d_b -= d_b.mean(-2, keepdim=True)
        d_c = torch.bmm(grad, m_mat.transpose(1, 2))
        return d_c, d_b, d_v

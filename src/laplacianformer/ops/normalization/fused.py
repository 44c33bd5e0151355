"""Fused injective and inline normalisation of the Nyström factors, with a hand-written backward
(DESIGN.md §4, the linear-cost form).

Per batch·head, with c = C_q (Nq×m), k = C_k (Nk×m), W = W⁺ (m×m), v (Nk×e) and the key factor
b = k Wᵀ (Nk×m, row j = W⁺ c_kj):

    c̄ = mean_i c_i,  k̄ = mean_j k_j,  c̃ = c − c̄,  k̃ = k − k̄,  b̃ = b − b̄ = k̃ Wᵀ,  v̄ = mean_j v_j
    injective:  S = c̃ᵀc̃ / Nq (m×m),  s_j = max(b̃_j S b̃_jᵀ, 0),  r_j = (s_j + eps)^(-1/2),
                M = b̃ᵀ (r ⊙ v) (m×e),  out = c̃ M + v̄
    inline:     M = b̃ᵀ v,  out = c M + v̄

This is DESIGN.md §4 with ĝ = c bᵀ: row centring of ĝ is c b̃ᵀ, the column mean of that is c̄ b̃ᵀ, so
h_ij − mu_j = c̃_i · b̃_j, s_j is its column variance, and Σ_j z_ij v_j = c̃_i M + v̄ (the 1/N term
gives v̄).  The injective op never forms b: with S' = Wᵀ S W and M' = (r ⊙ k̃)ᵀ v (m×e),

    s_j = k̃_j S' k̃_jᵀ,  M = W M',  out = [c̃ | 1] [M ; v̄]

(the ones column folds v̄ into the output product).  Called with b itself (no W), W = I: S' = S, M' = M.

Backward with G = dL/dout (Nq×e), Ḡ_k = Σ_i G_i / Nk, Ḡ_q = Σ_i G_i / Nq:

    dM = c̃ᵀ G,  dM' = Wᵀ dM,  dv = [r ⊙ k̃ | 1] [dM' ; Ḡ_k]   (= Ḡ_k + r ⊙ (k̃ dM'))
    Y = v dM'ᵀ (Nk×m),  dr_j = Y_j · k̃_j,  ds_j = −½ r_j³ dr_j [s_j ≥ 0],  u = ds ⊙ k̃
    dS' = k̃ᵀ u,  dk̃ = r ⊙ Y + 2 u S',  dk = dk̃ − mean_j dk̃_j
    dS = W dS' Wᵀ,  dW = dM M'ᵀ + 2 S W dS'   (from M = W M', S' = Wᵀ S W; S, dS' symmetric)
    dc = [c̃ | 1] [(2/Nq) dS ; −Ḡ_q Mᵀ] + G Mᵀ

dc needs no centring pass of its own: dc̃ = (2/Nq) c̃ dS + G Mᵀ and Σ_i c̃_i = 0, so mean_i dc̃_i =
Ḡ_q Mᵀ.  mean_j dk̃_j = (Σ_j r_j v_j dM'ᵀ + 2 Σ_j u_j S') / Nk comes from two (1, ·) sums.
With b given instead of (k, W), the same formulas with W = I give db (dS = dS', no dW).

Why a custom function: autograd of the composite keeps and creates about ten (N, m) temporaries
per call, and fresh large allocations are slow on CPU (page faults).  Here the forward keeps only
its inputs and m×m / m×e / N-sized results.  It never forms b: one (Nk, m) tensor less, kept for
the backward or not, and one N·m² product less in the forward and two in the backward.  The passes
walk c and k in row blocks (``BLOCK_ELEMENTS``) through a few scratch buffers (kept between calls on
CPU, see ``_WORKSPACE``), recompute c̃ and k̃ per block, and write straight into the outputs, so
the only (N, ·) allocations are out, dc, dk and dv.  Column sums come out of the products through
extra columns of the scratch: [d | 1]ᵀ d gives Σ d, [r ⊙ k̃ | r | 1]ᵀ v gives M', Σ_j r_j v_j and
Σ v, [c̃ | 1]ᵀ G gives dM and Σ G, k̃ᵀ [u | ds] gives dS' and Σ u; k̄ is one product with a
constant row (``mean`` for small inputs), so there are no separate reduction passes.

Both covariances stay centred, with no E[ccᵀ] − c̄c̄ᵀ cancellation in float32: S comes from the
shifted data d = c − p, p the mean of an evenly spaced sample of about 64–128 rows of c, as
S = dᵀd/Nq − d̄ᵀd̄ with d̄ = c̄ − p small, in the same pass as c̄ = p + d̄; S' is a congruence of S,
and s, M', dS' are products of centred k̃.

The backward is first order only: a second derivative through it raises a RuntimeError
(``once_differentiable``).  Callers wanting double backward use the composite
``reference.normalize_nystrom_reference``.
"""

from __future__ import annotations

import threading

import torch
from torch.autograd.function import once_differentiable

from ..layout import last_dim_contiguous


BLOCK_ELEMENTS = 1 << 18
"""Elements of one (rows, m) working block on CPU: the passes below walk c and k in blocks of at most
this size (1 MiB in float32, cache-resident; equal row counts within a group) and write into
preallocated outputs, instead of allocating (N, m) temporaries.  Inputs of at most this size, and
everything on other devices (cheap caching allocator, costly launches), are one block."""

_PILOT_ROWS = 64
"""About this many (at most twice as many) evenly spaced rows of c give the shift p of the covariance pass."""


def _centre(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    mean = x.mean(-2, keepdim=True)
    return x - mean, mean


def _blocks(x: torch.Tensor) -> list[tuple[slice | None, slice | None]]:
    """(group slice, row slice) pairs covering x (groups, rows, width); each x[g, r] of a contiguous x
    is contiguous: a block either spans all rows (several groups) or lies in one group.  A single
    block covering all of x is [(None, None)] (``_part`` then returns whole tensors, no views)."""
    groups, rows, width = x.shape
    per_group = max(rows * width, 1)
    if x.device.type != "cpu" or groups * per_group <= BLOCK_ELEMENTS:
        return [(None, None)]
    if per_group <= BLOCK_ELEMENTS:
        step = max(1, BLOCK_ELEMENTS // per_group)
        return [(slice(g, min(g + step, groups)), slice(0, rows)) for g in range(0, groups, step)]
    step = max(1, BLOCK_ELEMENTS // max(width, 1))
    step = -(-rows // -(-rows // step))  # the same number of blocks, of balanced sizes
    return [(slice(g, g + 1), slice(i, min(i + step, rows))) for g in range(groups) for i in range(0, rows, step)]


def _part(x: torch.Tensor, g: slice | None, r: slice | None = None) -> torch.Tensor:
    """x[g] or x[g, r] of a block from ``_blocks``; x itself for the single whole block."""
    if g is None:
        return x
    return x[g] if r is None else x[g, r]


def _accumulate(acc: torch.Tensor, g: slice | None, r: slice | None, a: torch.Tensor, b: torch.Tensor) -> None:
    """acc[g] (+)= a @ b: a block's contribution to a sum over rows (the first block of a group writes)."""
    if r is None or r.start == 0:
        torch.bmm(a, b, out=_part(acc, g))
    else:
        acc[g].baddbmm_(a, b)


_WORKSPACE = threading.local()
"""Per thread, the CPU scratch buffers of the last calls, kept between calls: (name, width, dtype) ->
(rows, width) tensor.  Blocks hold at most ``BLOCK_ELEMENTS`` elements of width m, so this is a few
MiB per thread and dtype (about 5 × 1 MiB in float32).  A fresh multi-MiB buffer costs a page fault
per 4 KiB page on first touch, each call, whenever the C allocator has returned the memory to the
system (as it does when large blocks are freed); kept buffers do not."""


class _Scratch:
    """Reusable buffers, one per name, viewed at each block's (groups, rows, width) shape.

    ``ones_column=True`` makes the last column of every view 1 (set once per call: in any contiguous
    (…, width) view of the buffer's start the last column sits at the same flat positions).  On CPU the
    buffers come from (and stay in) the thread's ``_WORKSPACE``; elsewhere they are allocated per call."""

    def __init__(self, *walks: tuple[torch.Tensor, list[tuple[slice | None, slice | None]]]):
        self.like = walks[0][0]
        self.rows = max(_block_rows(x, g, r) for x, blocks in walks for g, r in blocks)
        self.buffers: dict[str, torch.Tensor] = {}
        self.kept = getattr(_WORKSPACE, "buffers", None) if self.like.device.type == "cpu" else None
        if self.like.device.type == "cpu" and self.kept is None:
            self.kept = _WORKSPACE.buffers = {}

    def _new(self, name: str, width: int) -> torch.Tensor:
        if self.kept is None:
            return self.like.new_empty(self.rows, width)
        key = (name, width, self.like.dtype)
        buf = self.kept.get(key)
        if buf is None or buf.shape[0] < self.rows:
            with torch.inference_mode(False):  # a normal tensor: usable as out= inside and outside inference mode
                buf = self.kept[key] = self.like.new_empty(self.rows, width)
        return buf[: self.rows]

    def get(self, name: str, x: torch.Tensor, g: slice | None, r: slice | None, width: int,
            ones_column: bool = False) -> torch.Tensor:
        """The (groups, rows, width) scratch view for block (g, r) of x."""
        buf = self.buffers.get(name)
        if buf is None:
            buf = self.buffers[name] = self._new(name, width)
            if ones_column:
                buf[:, -1].fill_(1.0)
        if g is None:
            return buf[: x.shape[0] * x.shape[1]].view(x.shape[0], x.shape[1], width)
        n_g, n_r = g.stop - g.start, r.stop - r.start
        return buf[: n_g * n_r].view(n_g, n_r, width)


def _block_rows(x: torch.Tensor, g: slice | None, r: slice | None) -> int:
    return x.shape[0] * x.shape[1] if g is None else (g.stop - g.start) * (r.stop - r.start)


def _mean_rows(x: torch.Tensor) -> torch.Tensor:
    """Mean over dim -2 of (G, N, w) -> (G, 1, w); for large x as a product with a constant row (a GEMV,
    faster on CPU than the strided reduction of ``mean(-2)``)."""
    if x.shape[1] * x.shape[2] < 1 << 16:
        return x.mean(-2, keepdim=True)
    return torch.bmm(x.new_full((x.shape[0], 1, x.shape[1]), 1.0 / x.shape[1]), x)


def _injective_forward(c, k, w, v, eps):
    """Forward of the module docstring.

    c (G, Nq, m), k (G, Nk, m), w (G, m, m) or None (then k is b), v (G, Nk, e); c, k, w contiguous,
    v with contiguous rows.  Returns out (G, Nq, e) and what the backward needs: c̄ (G, 1, m),
    k̄ (G, 1, m), S W (G, m, m) (S when w is None), S' (G, m, m), s (G, Nk, 1) unclamped, r (G, Nk, 1),
    M' (G, m, e), M (G, m, e), Σ_j r_j v_j (G, 1, e)."""
    groups, n_q, m = c.shape
    n_k, e = k.shape[1], v.shape[2]
    c_blocks, k_blocks = _blocks(c), _blocks(k)
    scratch = _Scratch((c, c_blocks), (k, k_blocks))
    # Queries: d = c − p, p the mean of a row sample; [d | 1]ᵀ d = [dᵀd ; Σ d] gives c̄ and the centred S.
    pilot = c[:, :: max(1, n_q // _PILOT_ROWS)].mean(-2, keepdim=True)
    cov_aug = c.new_empty(groups, m + 1, m)
    for g, r in c_blocks:
        d1 = scratch.get("c", c, g, r, m + 1, ones_column=True)
        torch.sub(_part(c, g, r), _part(pilot, g), out=d1[..., :m])
        _accumulate(cov_aug, g, r, d1.transpose(1, 2), d1[..., :m])
    cov_aug.div_(n_q)
    d_mean = cov_aug[:, m:]
    cov = torch.baddbmm(cov_aug[:, :m], d_mean.transpose(1, 2), d_mean, alpha=-1.0)
    if w is None:
        cov_w = sw = cov
    else:
        sw = torch.bmm(cov, w)
        cov_w = torch.bmm(w.transpose(1, 2), sw)
    # Keys: s_j = k̃_j S' k̃_jᵀ, r_j, and [r ⊙ k̃ | r | 1]ᵀ v = [M' ; Σ r ⊙ v ; Σ v].
    k_mean = _mean_rows(k)
    s = k.new_empty(groups, n_k, 1)
    rinv = k.new_empty(groups, n_k, 1)
    mk_aug = k.new_empty(groups, m + 2, e)
    for g, r in k_blocks:
        k_t = torch.sub(_part(k, g, r), _part(k_mean, g), out=scratch.get("k", k, g, r, m))
        t = torch.bmm(k_t, _part(cov_w, g), out=scratch.get("t", k, g, r, m))
        s_blk = torch.sum(t.mul_(k_t), -1, keepdim=True, out=_part(s, g, r))
        r_blk = torch.clamp_min(s_blk, 0.0, out=_part(rinv, g, r)).add_(eps).rsqrt_()
        kr = scratch.get("kr", k, g, r, m + 2, ones_column=True)
        kr[..., m : m + 1] = r_blk
        torch.mul(k_t, r_blk, out=kr[..., :m])
        _accumulate(mk_aug, g, r, kr.transpose(1, 2), _part(v, g, r))
    m_k, rv_sum, v_mean = mk_aug[:, :m], mk_aug[:, m : m + 1], mk_aug[:, m + 1 :].div_(n_k)
    m_mat = m_k if w is None else torch.bmm(w, m_k)
    # out = [c̃ | 1] [M ; v̄].
    c_mean = pilot + d_mean
    rhs = torch.cat((m_mat, v_mean), 1)
    out = c.new_empty(groups, n_q, e)
    for g, r in c_blocks:
        c1 = scratch.get("c", c, g, r, m + 1, ones_column=True)
        torch.sub(_part(c, g, r), _part(c_mean, g), out=c1[..., :m])
        torch.bmm(c1, _part(rhs, g), out=_part(out, g, r))
    return out, (c_mean, k_mean, sw, cov_w, s, rinv, m_k, m_mat, rv_sum)


def _injective_backward(grad, c, k, w, v, c_mean, k_mean, sw, cov_w, s, rinv, m_k, m_mat, rv_sum):
    """Gradients (dc, dk, dW or None, dv) of the forward; see the module docstring."""
    groups, n_q, m = c.shape
    n_k, e = k.shape[1], v.shape[2]
    c_blocks, k_blocks = _blocks(c), _blocks(k)
    scratch = _Scratch((c, c_blocks), (k, k_blocks))
    # Queries: [c̃ | 1]ᵀ G = [dM ; Σ G].
    dm_aug = c.new_empty(groups, m + 1, e)
    for g, r in c_blocks:
        c1 = scratch.get("c", c, g, r, m + 1, ones_column=True)
        torch.sub(_part(c, g, r), _part(c_mean, g), out=c1[..., :m])
        _accumulate(dm_aug, g, r, c1.transpose(1, 2), _part(grad, g, r))
    d_m, grad_sum = dm_aug[:, :m], dm_aug[:, m:]
    d_mk = d_m if w is None else torch.bmm(w.transpose(1, 2), d_m)
    d_mk_t = d_mk.transpose(1, 2)
    rhs_v = torch.cat((d_mk, grad_sum / n_k), 1)
    scale = rinv.pow(3).mul_(-0.5).mul_(s >= 0)
    # Keys: dv = [r ⊙ k̃ | 1] [dM' ; Ḡ_k], Y = v dM'ᵀ, dr = rowsum(Y ⊙ k̃), k̃ᵀ [u | ds] = [dS' | Σ u],
    # dk̃ = r ⊙ Y + 2 u S'.
    d_v = v.new_empty(v.shape)
    d_k = k.new_empty(k.shape)
    dcov_aug = k.new_empty(groups, m, m + 1)
    for g, r in k_blocks:
        k_t = torch.sub(_part(k, g, r), _part(k_mean, g), out=scratch.get("k", k, g, r, m))
        r_blk = _part(rinv, g, r)
        kr = scratch.get("kr", k, g, r, m + 1, ones_column=True)
        torch.mul(k_t, r_blk, out=kr[..., :m])
        torch.bmm(kr, _part(rhs_v, g), out=_part(d_v, g, r))
        y = torch.bmm(_part(v, g, r), _part(d_mk_t, g), out=_part(d_k, g, r))
        u1 = scratch.get("u", k, g, r, m + 1)
        d_s = torch.sum(torch.mul(y, k_t, out=scratch.get("t", k, g, r, m)), -1, keepdim=True, out=u1[..., m:])
        torch.mul(k_t, d_s.mul_(_part(scale, g, r)), out=u1[..., :m])
        _accumulate(dcov_aug, g, r, k_t.transpose(1, 2), u1)
        y.mul_(r_blk).baddbmm_(u1[..., :m], _part(cov_w, g), alpha=2.0)
    d_cov_w, u_sum = dcov_aug[..., :m], dcov_aug[..., m:].transpose(1, 2)
    d_k.sub_(torch.baddbmm(torch.bmm(rv_sum, d_mk_t), u_sum, cov_w, alpha=2.0).div_(n_k))
    if w is None:
        d_cov, d_w = d_cov_w, None
    else:
        d_cov = torch.bmm(torch.bmm(w, d_cov_w), w.transpose(1, 2))
        d_w = torch.baddbmm(torch.bmm(d_m, m_k.transpose(1, 2)), sw, d_cov_w, alpha=2.0)
    # Queries: dc = [c̃ | 1] [(2/N) dS ; −Ḡ_q Mᵀ] + G Mᵀ.
    m_t = m_mat.transpose(1, 2)
    rhs_q = torch.cat((d_cov * (2.0 / n_q), torch.bmm(grad_sum, m_t).div_(-n_q)), 1)
    d_c = c.new_empty(c.shape)
    for g, r in c_blocks:
        c1 = scratch.get("c", c, g, r, m + 1, ones_column=True)
        torch.sub(_part(c, g, r), _part(c_mean, g), out=c1[..., :m])
        d_c_blk = torch.bmm(c1, _part(rhs_q, g), out=_part(d_c, g, r))
        d_c_blk.baddbmm_(_part(grad, g, r), _part(m_t, g))
    return d_c, d_k, d_w, d_v


def injective_forward(c: torch.Tensor, k: torch.Tensor, v: torch.Tensor, eps: float,
                      w: torch.Tensor | None = None) -> torch.Tensor:
    """Output of the injective variant without autograd bookkeeping.

    c (G, Nq, m), k (G, Nk, m), v (G, Nk, e), w (G, m, m) or None -> (G, Nq, e).  With w the key
    factor is b = k wᵀ (k = C_k, w = W⁺); without, k is b itself."""
    w = None if w is None else w.contiguous()
    return _injective_forward(c.contiguous(), k.contiguous(), w, last_dim_contiguous(v), eps)[0]


def inline_forward(c: torch.Tensor, b: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Output of the inline variant.  (G, Nq, m), (G, Nk, m), (G, Nk, e) -> (G, Nq, e)."""
    b_t, _ = _centre(b)
    return torch.baddbmm(v.mean(-2, keepdim=True), c, torch.bmm(b_t.transpose(1, 2), v))


def forward_saving(c: torch.Tensor, k: torch.Tensor, w: torch.Tensor | None, v: torch.Tensor, eps: float,
                   inj: bool) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """The forward of ``InjectiveNormalization`` (``inj``) or of the inline variant, without autograd, for a
    caller that runs the backward itself (the lean recompute, docs/DESIGN.md §5.5): returns out and the small
    tensors ``backward_saved`` needs besides the factors, which the caller keeps or recomputes.

    c (G, Nq, m), k (G, Nk, m), w (G, m, m) or None (k is b), v (G, Nk, e). Injective: m×m, m×e and
    per-key (G, Nk, 1) statistics; inline: M = b̃ᵀ v (G, m, e)."""
    if inj:
        c, k, v = c.contiguous(), k.contiguous(), last_dim_contiguous(v)
        return _injective_forward(c, k, None if w is None else w.contiguous(), v, eps)
    b = k if w is None else k @ w.transpose(-1, -2)
    m_mat = torch.bmm(_centre(b)[0].transpose(1, 2), v)
    return torch.baddbmm(v.mean(-2, keepdim=True), c, m_mat), (m_mat,)


def backward_saved(grad: torch.Tensor, c: torch.Tensor, k: torch.Tensor, w: torch.Tensor | None, v: torch.Tensor,
                   inj: bool, saved: tuple[torch.Tensor, ...]):
    """(dc, dk, dw or None, dv) of ``forward_saving`` for dL/dout ``grad`` (G, Nq, e), the same factors and
    its ``saved`` tensors."""
    if inj:
        c, k, v = c.contiguous(), k.contiguous(), last_dim_contiguous(v)
        return _injective_backward(grad.contiguous(), c, k, None if w is None else w.contiguous(), v, *saved)
    b = k if w is None else k @ w.transpose(-1, -2)
    d_c, d_b, d_v = _inline_backward(grad, c, b, v, saved[0])
    if w is None:
        return d_c, d_b, None, d_v
    return d_c, d_b @ w, d_b.transpose(-1, -2) @ k, d_v  # b = k wᵀ


def _inline_backward(grad, c, b, v, m_mat):
    """(dc, db, dv) of out = c (b̃ᵀ v) + v̄, given M = b̃ᵀ v."""
    grad = grad.contiguous()
    d_m = torch.bmm(c.transpose(1, 2), grad)
    b_t, _ = _centre(b)
    d_v = torch.baddbmm(grad.sum(-2, keepdim=True).div_(v.shape[-2]), b_t, d_m)
    d_b = torch.bmm(v, d_m.transpose(1, 2), out=b_t)
    d_b -= d_b.mean(-2, keepdim=True)
    d_c = torch.bmm(grad, m_mat.transpose(1, 2))
    return d_c, d_b, d_v


class InjectiveNormalization(torch.autograd.Function):
    """out = c̃ M + v̄ for c (G, Nq, m), k (G, Nk, m), w (G, m, m) or None, v (G, Nk, e) and a float
    eps; the key factor is b = k wᵀ (k itself when w is None).  See the module docstring."""

    @staticmethod
    def forward(ctx, c, k, w, v, eps):
        c, k, v = c.contiguous(), k.contiguous(), last_dim_contiguous(v)
        w = None if w is None else w.contiguous()
        out, saved = _injective_forward(c, k, w, v, eps)
        ctx.save_for_backward(c, k, w, v, *saved)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        c, k, w, v, *saved = ctx.saved_tensors
        d_c, d_k, d_w, d_v = _injective_backward(grad.contiguous(), c, k, w, v, *saved)
        return d_c, d_k, d_w, d_v, None


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
        return _inline_backward(grad, c, b, v, m_mat)

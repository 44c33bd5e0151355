"""Passes A and B of the fused backward in Triton (docs/KERNELS.md, "The fused backward"): the per-split
statistics the landmark algebra (pass C) needs, from the rows read once more as queries (A) and as keys (B).
The specification is ``backward_reference.py``: ``query_grad_pass`` (pass A) and ``key_grad_pass`` (pass B).
As in the forward passes (``triton.py``), C_q and C_k are recomputed from q, k and the landmarks per tile of
``BLOCK_ROWS`` rows and never stored; the rows of group g = b·H + h are cut by ``limits.splits_for`` (grid
(splits, G)), and each program writes its split's partials to float32 workspaces (G, splits, ·) that the
next pass sums in split order (deterministic, no atomics).

- ``query_grad_kernel`` (pass A): per query tile c = C_q (− c̄ with ``WHITEN``, "injective") and the output
  gradient G, per split the partials of dM = α Σ_i c_iᵀ G_i (α the output scale of the whitened norm,
  docs/DESIGN.md §4.6, a runtime argument applied once to the split's sum, 1 otherwise) and Σ_i G_i. With ``CONV`` (the layer's DWConv(V),
  docs/DESIGN.md §4.5) a last loop gives the depthwise weight's partials Σ_i G_ij v_(i + dy·GW + dx), j of
  the 9 taps t = (dy + 1)·3 + (dx + 1), V read through its row stride and masked at the (GH, GW) grid's
  borders (zero padding) as the forward output pass reads it.
- ``key_grad_kernel`` (pass B, the whitened norms, k̄ centring always): the prologue sums A's partials of dM
  in split order and forms dM' = W⁺ᵀ dM (IEEE) and S' + S'ᵀ; per key tile first u_j = v_j dM'ᵀ, then
  k̃ = C_k − k̄ (rows × landmarks), a_j = k̃_j (S' + S'ᵀ) (IEEE), s_j = ½ a_j·k̃_j (= k̃_j S' k̃_jᵀ),
  r_j = (max(s_j, 0) + eps)^-½, dr_j = k̃_j·u_j, ds_j = −½ r_j³ dr_j (0 where s_j < 0), dk̃_j = r_j u_j +
  ds_j a_j, and per split the partials of dS' = Σ_j ds_j k̃_jᵀ k̃_j (IEEE) and Σ_j dk̃_j.

dM'ᵀ (pass B) is formed once per program in column chunks into a float32 scratch of
the program's own (G, splits, ·), then read back per tile in ``CHUNK_E``-column chunks (after a CTA
barrier): held whole in registers, this (m, e) operand of the row products spilled (below). grad, q, k, v
are read in place through their (batch, head, row) strides (last dim contiguous), in their dtype (float32,
float16 or bfloat16, one dtype per call, ``limits.LOAD_DTYPES``), converted to float32 right after each load:
every product and sum runs in float32, and the state, the partials and the scratch are float32 whatever the
inputs. Products: the m×m ones, S' k̃ and the dS' sum IEEE float32, the rest "tf32x3" (never plain TF32). The
streamed norms (``limits.STREAMED_NORMS``; the ablation norms run the step path), m <= 64, d, e <= 128
(``limits.unfit``), no padding mask and no prefix tokens (the fused training path has neither).

**Register budget** (``python -m benchmarks.triton_aot --arch 80,90 --strict --module
laplacianformer.ops.streaming.backward_stats_triton``): every specialisation at 8 warps and ``maxnreg`` 255
without a spill. What spilled on the way (m = 64, spill-store bytes on sm_80 / sm_90): pass B with dM' and
S' + S'ᵀ held in registers and the tile transposed (landmarks × rows), as the forward key pass held it then,
1460 / 1420; dM' from the scratch in 32-column chunks, transposed, 130–270 / 0–540 whatever the products'
precisions; in row form (rows × landmarks) 88 / 80, 36 / 0 with the dS' sum IEEE, none with that and
16-column chunks (the form kept). 16 warps spilled more (1232 / 772: 128 registers a thread, as a 512-thread
block cannot have 255). The conv's partials, a (16, e)
register tile over the taps, have their own loop as well. Half-precision data and α: pass B with u = v dM'ᵀ
formed after k̃ and a (as it was for float32) spilled 4 bytes on sm_80 at m = 64 with float16 or bfloat16 v
(float32: 255 registers, no spill); u is now formed first, before k̃ and a are live: 255 / 239–244 registers on
sm_80 / sm_90, no spill in any dtype. The other kernel families' profiles (exponential, Matérn-3/2, Cauchy: a
root or more live values than exp in place) spilled again at m = 64 (fp32: Cauchy 4 bytes on sm_80, exponential
8 on sm_90; fp16 / bf16 up to 20; found by the strict AOT run of the model path for every family, 7 December
2026). 8-column chunks of dM' or a distance loop unrolled 4 times did not help; their pass B takes tiles of 16
rows at 64 landmarks, which compile at 255 registers or fewer without a spill on both targets in every dtype. Pass A with the α multiply (once, on the split's dM before its store) and
half loads: no change (255 at most, no spill). ``aot_specialisations`` lists every launch configuration for
``benchmarks/triton_aot.py``, per data dtype.
"""

from __future__ import annotations

import math
from functools import partial
from itertools import chain

import torch
import triton
import triton.language as tl

from .._triton_common import distinct_launches, family_exp_in_place, power_of_two_sizes
from ..kernel.limits import TRITON_KERNEL_IDS
from .limits import MAX_D, MAX_M, STREAMED_NORMS, conv_unfit, splits_for, triton_kernel_id, unfit, whitens
from .triton import _kernel_tile, _launch, _rows_contiguous, _square, _tile_triples, config, split_rows_of
from .triton import distance_budget  # noqa: F401  (read per module by benchmarks/triton_aot.py)

TAPS = 16
"""Rows of the conv partials' register tile: the 9 taps of the 3×3 weight padded to a power of two."""


@triton.jit
def _split_rows(rn, row_end, N):
    """Rows ``rn`` inside the split (< row_end) and the sequence (< N): no padding mask in the training path."""
    return (rn < N) & (rn < row_end)


@triton.jit
def _tile_rows(n0, row_end, N, BLOCK_N: tl.constexpr):
    """(rn, ok): the rows n0 .. n0 + BLOCK_N of a tile and which of them are inside the split (``_split_rows``)."""
    rn = n0 + tl.arange(0, BLOCK_N)
    return rn, _split_rows(rn, row_end, N)


@triton.jit
def query_grad_kernel(GR, sgb, sgh, sgn, Q, sqb, sqh, sqn, V, svb, svh, svn, L, CMEAN,
                      PDM, PG, PDW, GH, GW, H, N, M, D, E, scale, alpha, rows_per_split, SPLITS,
                      WHITEN: tl.constexpr, CONV: tl.constexpr, KID: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, KU: tl.constexpr, BLOCK_E: tl.constexpr,
                      BLOCK_T: tl.constexpr):
    """Pass A of group program_id(1), split program_id(0): GR, Q, V (B, H, N, ·) strided, L (G, M, D), CMEAN (G, M)
    -> PDM (G, S, M, E) (α times the split's Σ cᵀ G), PG (G, S, E), PDW (G, S, 9, E) (CONV). GR, Q, V float32,
    float16 or bfloat16 (converted to float32 after each load)."""
    split, g = tl.program_id(0), tl.program_id(1)
    b, h = g // H, g % H
    Gg, Qg, Vg, Lg = GR + b * sgb + h * sgh, Q + b * sqb + h * sqh, V + b * svb + h * svh, L + g * M * D
    rm = tl.arange(0, BLOCK_M)
    re = tl.arange(0, BLOCK_E)
    landmarks = rm < M
    cols = re < E
    c_mean = tl.zeros((BLOCK_M,), dtype=tl.float32)
    if WHITEN:
        c_mean = tl.load(CMEAN + g * M + rm, mask=landmarks, other=0.0)
    dm = tl.zeros((BLOCK_M, BLOCK_E), dtype=tl.float32)
    g_sum = tl.zeros((BLOCK_E,), dtype=tl.float32)
    lo, row_end = split_rows_of(split, rows_per_split)
    for n0 in range(lo, row_end, BLOCK_N):
        rn, ok = _tile_rows(n0, row_end, N, BLOCK_N)
        c = _kernel_tile(Qg, sqn, Lg, n0, ok, N, M, D, scale, KID, BLOCK_N, BLOCK_M, KU)
        if WHITEN:
            c = tl.where(ok[:, None] & landmarks[None, :], c - c_mean[None, :], 0.0)
        dt = tl.load(Gg + rn[:, None] * sgn + re[None, :], mask=ok[:, None] & cols[None, :], other=0.0)
        dt = dt.to(tl.float32)
        g_sum += tl.sum(dt, axis=0)
        dm += tl.dot(tl.trans(c), dt, input_precision="tf32x3")
    part = g * SPLITS + split
    tl.store(PDM + part * M * E + rm[:, None] * E + re[None, :], dm * alpha, mask=landmarks[:, None] & cols[None, :])
    tl.store(PG + part * E + re, g_sum, mask=cols)
    if CONV:  # the DWConv weight's partials, in a loop of their own (module docstring)
        rt = tl.arange(0, BLOCK_T)
        taps = tl.zeros((BLOCK_T, BLOCK_E), dtype=tl.float32)
        for n0 in range(lo, row_end, BLOCK_N):
            rn, ok = _tile_rows(n0, row_end, N, BLOCK_N)
            gr = tl.load(Gg + rn[:, None] * sgn + re[None, :], mask=ok[:, None] & cols[None, :], other=0.0)
            gr = gr.to(tl.float32)
            gy = rn // GW
            gx = rn - gy * GW
            for t in range(0, 9):  # a loop, not unrolled: one neighbour tile live at a time
                dy = t // 3 - 1
                dx = t % 3 - 1
                inside = ok & (gy + dy >= 0) & (gy + dy < GH) & (gx + dx >= 0) & (gx + dx < GW)
                v = tl.load(Vg + (rn + dy * GW + dx)[:, None] * svn + re[None, :],
                            mask=inside[:, None] & cols[None, :], other=0.0)
                taps += tl.where(rt[:, None] == t, tl.sum(gr * v.to(tl.float32), axis=0)[None, :], 0.0)
        tl.store(PDW + part * 9 * E + rt[:, None] * E + re[None, :], taps, mask=(rt[:, None] < 9) & cols[None, :])


@triton.jit
def key_grad_kernel(K, skb, skh, skn, V, svb, svh, svn, L, WI, KMEAN, SP, PDM, WORK, PDSP, PDKT,
                    H, N, M, D, E, scale, eps, rows_per_split, SPLITS, DM_SPLITS,
                    KID: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, KU: tl.constexpr,
                    BLOCK_EC: tl.constexpr):
    """Pass B of group program_id(1), split program_id(0): K, V (B, H, N, ·) strided, L (G, M, D), WI, SP (G, M, M),
    KMEAN (G, M), PDM (G, DM_SPLITS, M, E) pass A's partials of dM -> PDSP (G, S, M, M), PDKT (G, S, M).
    WORK (G, S, E, M): the program's copy of dM'ᵀ. K, V float32, float16 or bfloat16 (converted after the load)."""
    split, g = tl.program_id(0), tl.program_id(1)
    b, h = g // H, g % H
    Kg, Vg, Lg = K + b * skb + h * skh, V + b * svb + h * svh, L + g * M * D
    rm = tl.arange(0, BLOCK_M)
    rc = tl.arange(0, BLOCK_EC)
    landmarks = rm < M
    part = g * SPLITS + split
    Dk = WORK + part * E * M
    # prologue: dM = Σ_s pdm (split order) and dM' = W⁺ᵀ dM in column chunks, dM'ᵀ into the program's scratch
    w_inv_t = _square(WI + g * M * M, M, BLOCK_M, True)
    for e0 in range(0, E, BLOCK_EC):
        ce = e0 + rc
        inside = landmarks[:, None] & (ce[None, :] < E)
        dm = tl.zeros((BLOCK_M, BLOCK_EC), dtype=tl.float32)
        for s in range(0, DM_SPLITS):
            dm += tl.load(PDM + (g * DM_SPLITS + s) * M * E + rm[:, None] * E + ce[None, :], mask=inside, other=0.0)
        tl.store(Dk + ce[None, :] * M + rm[:, None], tl.dot(w_inv_t, dm, input_precision="ieee"), mask=inside)
    tl.debug_barrier()  # dM'ᵀ complete before any thread reads it back
    sp_sym = _square(SP + g * M * M, M, BLOCK_M, False) + _square(SP + g * M * M, M, BLOCK_M, True)
    k_mean = tl.load(KMEAN + g * M + rm, mask=landmarks, other=0.0)
    dsp = tl.zeros((BLOCK_M, BLOCK_M), dtype=tl.float32)
    dkt_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
    lo = split * rows_per_split
    row_end = lo + rows_per_split
    for n0 in range(lo, row_end, BLOCK_N):
        rn = n0 + tl.arange(0, BLOCK_N)
        ok = _split_rows(rn, row_end, N)
        # u = v dM'ᵀ over column chunks of v and dM', before k̃ and a are live (module docstring, "Register budget")
        u = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        for e0 in range(0, E, BLOCK_EC):
            ce = e0 + rc
            dmp_t = tl.load(Dk + ce[:, None] * M + rm[None, :], mask=(ce[:, None] < E) & landmarks[None, :], other=0.0)
            v = tl.load(Vg + rn[:, None] * svn + ce[None, :], mask=ok[:, None] & (ce[None, :] < E), other=0.0)
            u = tl.dot(v.to(tl.float32), dmp_t, u, input_precision="tf32x3")
        kt = _kernel_tile(Kg, skn, Lg, n0, ok, N, M, D, scale, KID, BLOCK_N, BLOCK_M, KU)
        kt = tl.where(ok[:, None] & landmarks[None, :], kt - k_mean[None, :], 0.0)  # k̃ (rows × landmarks)
        a = tl.dot(kt, sp_sym, input_precision="ieee")  # k̃ (S' + S'ᵀ)
        s_row = 0.5 * tl.sum(a * kt, axis=1)
        r = 1.0 / tl.sqrt(tl.maximum(s_row, 0.0) + eps)
        dr = tl.sum(kt * u, axis=1)
        ds = tl.where(ok & (s_row >= 0.0), -0.5 * r * r * r * dr, 0.0)
        dkt_sum += tl.sum(r[:, None] * u + ds[:, None] * a, axis=0)
        dsp = tl.dot(tl.trans(kt * ds[:, None]), kt, dsp, input_precision="ieee")
    tl.store(PDSP + part * M * M + rm[:, None] * M + rm[None, :], dsp, mask=landmarks[:, None] & landmarks[None, :])
    tl.store(PDKT + part * M + rm, dkt_sum, mask=landmarks)


CHUNK_E = 16
"""Columns of dM' (pass B) read back from the program's scratch per product (at 32
pass B spilled on sm_80: module docstring, "Register budget")."""


def query_grad_spec(m, d, e, kid: int, whiten: bool, conv: bool = False) -> dict:
    """Pass A: the forward passes' tiles (``triton.config``) plus the conv partials' (TAPS, BLOCK_E) tile."""
    return dict(WHITEN=whiten, CONV=conv, KID=kid, BLOCK_T=TAPS, **config(m, d, e))


def key_grad_spec(m, d, e, kid: int) -> dict:
    """Pass B: the forward passes' row and landmark tiles (``triton.config``), dM' in CHUNK_E columns (e itself
    takes no specialisation)."""
    cfg = config(m, d, e)
    cfg.pop("BLOCK_E")
    # the profiles other than exp in place keep more of the kernel tile live: at 64 landmarks their pass B spilled
    # 4-20 bytes with 32-row tiles (module docstring, "Register budget"); 16-row tiles, none
    if cfg["BLOCK_M"] >= 64 and not family_exp_in_place(kid):
        cfg["BLOCK_N"] = cfg["BLOCK_N"] // 2
    return dict(KID=kid, BLOCK_EC=CHUNK_E, **cfg)


def _check_state(name: str, st, groups: int, m: int, d: int, e: int) -> None:
    shapes = dict(marks=(m, d), w_inv=(m, m), c_mean=(m,), k_mean=(m,), sp=(m, m), m_prime=(m, e))
    for field, shape in shapes.items():
        t = getattr(st, field)
        if t.dtype != torch.float32 or t.numel() != groups * _prod(shape) or tuple(t.shape[-len(shape):]) != shape:
            raise ValueError(f"{name}: st.{field} must be float32 (B, H, {', '.join(map(str, shape))}), got "
                             f"{t.dtype} {tuple(t.shape)}")


def _prod(shape) -> int:
    out = 1
    for s in shape:
        out *= s
    return out


def _groups(st, field: str, groups: int, *shape: int) -> torch.Tensor:
    return getattr(st, field).reshape(groups, *shape).contiguous()


def dtype_name(dtype: torch.dtype) -> str:
    """The name of a dtype without "torch." (the launchers' messages)."""
    return str(dtype).removeprefix("torch.")


def check_alpha(name: str, norm: str, alpha) -> float:
    """α as a float, or ValueError naming ``alpha`` (shared by passes A, C and D): a finite positive number, and
    1 for the norm without a whitened part (``limits.output_alpha`` gives it 1)."""
    alpha = float(alpha)
    if not math.isfinite(alpha) or alpha <= 0.0:
        raise ValueError(f"{name}: alpha={alpha}: expected a finite positive output scale")
    if alpha != 1.0 and not whitens(norm):
        raise ValueError(f"{name}: alpha={alpha}: norm {norm!r} has no whitened part to scale (alpha must be 1)")
    return alpha


def query_grad_triton(grad: torch.Tensor, qs: torch.Tensor, vv: torch.Tensor, st, bandwidth: float, kernel: str,
                      norm: str, conv=None, alpha: float = 1.0) -> dict:
    """Pass A (``backward_reference.query_grad_pass``) per split: grad (B, H, N, e), qs (B, H, N, d), vv (B, H, N, e)
    (strided, last dim contiguous; with ``conv``, an ``ops.value_conv.ValueConv``, vv is the head view of its
    tokens), all three float32, float16 or bfloat16 (one dtype; read as such, summed in float32), st a float32
    ``ForwardState``; ``alpha`` the output scale α of the whitened norms (``limits.output_alpha``; 1 for the others).
    Returns {"pdm": (G, S, m, e), "pg": (G, S, e), "pdw": (G, S, 9, e) or None (conv only)}, float32, G = B·H,
    S = ``splits_for(N, G)``'s splits: summed over S, dM = α Σ cᵀ G, Σ G and the conv weight's gradient (tap t = 3·ky + kx, channel h·e + j). ValueError naming the argument for what it
    does not serve."""
    b, h, n, d = qs.shape
    e, m = vv.shape[-1], st.marks.shape[-2]
    why = unfit(norm, m, d, e, qs.dtype)
    if why is None and conv is not None:
        why = conv_unfit(conv, vv, None, qs.dtype)
    if why is not None:
        raise ValueError(f"query_grad_triton: {why}")
    dtype = dtype_name(qs.dtype)
    if tuple(vv.shape) != (b, h, n, e) or vv.dtype != qs.dtype:
        raise ValueError(f"query_grad_triton: vv must be {dtype} (qs's dtype) (B, H, N, e) = ({b}, {h}, {n}, e), "
                         f"got {vv.dtype} {tuple(vv.shape)}")
    if tuple(grad.shape) != (b, h, n, e) or grad.dtype != qs.dtype:
        raise ValueError(f"query_grad_triton: grad must be {dtype} {(b, h, n, e)} (qs's dtype, vv's shape), got "
                         f"{grad.dtype} {tuple(grad.shape)}")
    if n == 0:
        raise ValueError("query_grad_triton: qs: empty input (N = 0)")
    alpha = check_alpha("query_grad_triton", norm, alpha)
    kid = triton_kernel_id("query_grad_triton", kernel)
    groups = b * h
    _check_state("query_grad_triton", st, groups, m, d, e)
    gr, q, v = _rows_contiguous(grad), _rows_contiguous(qs), _rows_contiguous(vv)
    lm = _groups(st, "marks", groups, m, d)
    cmean = _groups(st, "c_mean", groups, m)
    splits, rows = splits_for(n, groups)
    f32 = dict(dtype=torch.float32, device=q.device)
    pdm = torch.empty(groups, splits, m, e, **f32)
    pg = torch.empty(groups, splits, e, **f32)
    pdw = torch.empty(groups, splits, 9, e, **f32) if conv is not None else None
    gh, gw = (1, n) if conv is None or conv.hw is None else conv.hw
    meta, opts = _launch(query_grad_spec(m, d, e, kid, whitens(norm), conv is not None))
    query_grad_kernel[(splits, groups)](
        gr, gr.stride(0), gr.stride(1), gr.stride(2), q, q.stride(0), q.stride(1), q.stride(2),
        v, v.stride(0), v.stride(1), v.stride(2), lm, cmean,
        pdm, pg, pg if pdw is None else pdw,  # a placeholder CONV=False leaves unwritten
        gh, gw, h, n, m, d, e, -1.0 / float(bandwidth), alpha, rows, splits, **meta, **opts)
    return dict(pdm=pdm, pg=pg, pdw=pdw)


def key_grad_triton(ks: torch.Tensor, vv: torch.Tensor, st, pdm: torch.Tensor, bandwidth: float, kernel: str,
                    eps: float) -> dict:
    """Pass B (``backward_reference.key_grad_pass``, the whitened norms) per split: ks (B, H, N, d), vv (B, H, N, e)
    (strided, last dim contiguous; float32, float16 or bfloat16, one dtype), st a float32 ``ForwardState``
    (k̄ = st.k_mean, S' = st.sp, W⁺), pdm (G, S_A, m, e) pass A's partials of dM (``query_grad_triton``'s "pdm",
    α included; summed in split order, any S_A). Returns {"pdsp": (G, S, m, m), "pdkt": (G, S, m)} float32,
    S = ``splits_for(N, G)``'s splits: summed over S, dS' and Σ_j dk̃_j. ValueError naming the argument for
    what it does not serve."""
    b, h, n, d = ks.shape
    e, m = vv.shape[-1], st.marks.shape[-2]
    why = unfit(None, m, d, e, ks.dtype)
    if why is not None:
        raise ValueError(f"key_grad_triton: {why}")
    if tuple(vv.shape) != (b, h, n, e) or vv.dtype != ks.dtype:
        raise ValueError(f"key_grad_triton: vv must be {dtype_name(ks.dtype)} (ks's dtype) (B, H, N, e) = ({b}, {h}, "
                         f"{n}, e), got {vv.dtype} {tuple(vv.shape)}")
    if n == 0:
        raise ValueError("key_grad_triton: ks: empty input (N = 0)")
    kid = triton_kernel_id("key_grad_triton", kernel)
    groups = b * h
    if pdm.dim() != 4 or tuple(pdm.shape[::2]) != (groups, m) or pdm.shape[3] != e or pdm.shape[1] < 1 \
            or pdm.dtype != torch.float32:
        raise ValueError(f"key_grad_triton: pdm must be float32 (G, S, m, e) = ({groups}, S, {m}, {e}), got "
                         f"{pdm.dtype} {tuple(pdm.shape)}")
    _check_state("key_grad_triton", st, groups, m, d, e)
    k, v = _rows_contiguous(ks), _rows_contiguous(vv)
    lm = _groups(st, "marks", groups, m, d)
    wi = _groups(st, "w_inv", groups, m, m)
    kmean = _groups(st, "k_mean", groups, m)
    sp = _groups(st, "sp", groups, m, m)
    dm_parts = pdm.contiguous()
    splits, rows = splits_for(n, groups)
    f32 = dict(dtype=torch.float32, device=k.device)
    pdsp = torch.empty(groups, splits, m, m, **f32)
    pdkt = torch.empty(groups, splits, m, **f32)
    work = torch.empty(groups, splits, e, m, **f32)  # dM'ᵀ per program
    meta, opts = _launch(key_grad_spec(m, d, e, kid))
    key_grad_kernel[(splits, groups)](
        k, k.stride(0), k.stride(1), k.stride(2), v, v.stride(0), v.stride(1), v.stride(2), lm, wi, kmean, sp,
        dm_parts, work, pdsp, pdkt, h, n, m, d, e, -1.0 / float(bandwidth), float(eps), rows, splits, dm_parts.shape[1],
        **meta, **opts)
    return dict(pdsp=pdsp, pdkt=pdkt)


_INTS = {"sgb", "sgh", "sgn", "sqb", "sqh", "sqn", "skb", "skh", "skn", "svb", "svh", "svn", "GH", "GW", "H", "N",
         "M", "D", "E", "rows_per_split", "SPLITS", "DM_SPLITS"}
DATA = {"GR", "Q", "K", "V"}
"""The pointers of the data tensors (grad, q, k, v), typed by the inputs' dtype; every other pointer is float32."""
DISTANCE_LOOPS = {"query_grad_kernel": _tile_triples, "key_grad_kernel": _tile_triples}
"""Passes A and B recompute C with ``triton._kernel_tile`` (benchmarks/triton_aot.py checks the loop, with the
forward passes' ``distance_budget``; pass A's db loop transposes it)."""
POINTER_TYPES = {"fp32": "*fp32", "fp16": "*fp16", "bf16": "*bf16"}
"""The AOT labels' dtype -> the data pointers' Triton type (``limits.LOAD_DTYPES``)."""


def _signature(kernel, constexprs: dict, dtype: str = "fp32") -> dict:
    """Runtime arguments -> Triton types: sizes and strides i32, scale, alpha and eps fp32, the data pointers
    ``POINTER_TYPES[dtype]``, every other pointer (state, partials, scratch) fp32."""
    return {name: "i32" if name in _INTS else "fp32" if name in ("scale", "alpha", "eps")
            else POINTER_TYPES[dtype] if name in DATA else "*fp32"
            for name in kernel.arg_names if name not in constexprs}


def _launches(m: int, e: int, dtype: str = "fp32"):
    """(kernel, spec, label) of every launch of both launchers for these m, e and data dtype (the specs do not
    depend on d: ``config`` takes nothing from d; nor on the dtype, which only types the data pointers)."""
    for kid in sorted(TRITON_KERNEL_IDS):
        kind = f"dtype={dtype} kid={kid}"
        for norm in STREAMED_NORMS:
            inj = int(whitens(norm))
            for conv in (False, True):
                yield (query_grad_kernel, query_grad_spec(m, MAX_D, e, kid, whitens(norm), conv),
                       f"bwd_query {kind} m={m} e={e} inj={inj} norm={norm} conv={int(conv)}")
        yield key_grad_kernel, key_grad_spec(m, MAX_D, e, kid), f"bwd_key {kind} m={m} inj=1"  # e: no constexpr


def aot_specialisations(d_max: int = 128, m_max: int = 128):
    """Every (kernel, signature, constexprs, num_warps, num_stages, label, options) ``query_grad_triton`` and
    ``key_grad_triton`` can produce for m <= min(m_max, 64), e <= min(d_max, 128) and any d <= 128, from the
    same ``*_spec`` functions (benchmarks/triton_aot.py): m and e as powers of two (the specs depend on them
    only through ``next_power_of_2``), every streamed norm, every kernel family of the Triton profile, the conv on
    and off, and each data
    dtype (float32, then float16 and bfloat16: labels ``dtype=fp32|fp16|bf16``, the data pointers typed so);
    identical specialisations once per dtype, under the label of their first launch."""
    sizes = [(m, e) for m in power_of_two_sizes(m_max, MAX_M) for e in power_of_two_sizes(d_max, MAX_D)]
    return chain.from_iterable(distinct_launches(_sized_launches(sizes, dtype), partial(_signature, dtype=dtype))
                               for dtype in POINTER_TYPES)


def _sized_launches(sizes, dtype: str):
    for m, e in sizes:
        yield from _launches(m, e, dtype)
"""Fused Triton kernels for the kernel primitives (docs/DESIGN.md §1, §6); formulas in ``cpu.py``.

- ``laplace_kernel_fwd_kernel``: C = exp(scale · D) tile by tile (scale = -1/lam), D the L1 or squared
  L2 distance, fused in one pass (no raw-distance round trip).
- ``laplace_matmul_fwd_kernel``: C @ V with C recomputed per (BLOCK_N, BLOCK_M) tile and never stored.
- ``laplace_dx_kernel`` / ``laplace_dy_kernel``: the backward, either from a given dL/dC and C
  (``laplace_kernel``) or recomputing C and dL/dC = dO Vᵀ tile by tile (``laplace_kernel_matmul``).
  dY and dV are reduced over N in fixed splits into float32 workspaces and summed by a second pass
  (deterministic, no atomics). sign(0) = 0.

Inputs float32/float16/bfloat16, accumulation in float32, outputs in the input dtype. Products with V
run as float32 ``tl.dot`` (IEEE for float32 inputs, TF32 on GPU for half inputs). The host functions
are registered with ``torch.library.triton_op`` (``laplacianformer::...``) so torch.compile traces them,
with autograd through ``_autograd.py`` (the glue shared with ``cpu.py``). Dispatch: ``kernel/__init__.py``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from ..layout import flatten_batch
from ._autograd import register_kernel_autograd, register_matmul_autograd

_SPLITS = 16


@triton.jit
def _distance_tile(x, y, L1: tl.constexpr):
    diff = x[:, None, :] - y[None, :, :]
    if L1:
        return tl.sum(tl.abs(diff), axis=2)
    return tl.sum(diff * diff, axis=2)


@triton.jit
def _sign_weighted(x, y, gp, L1: tl.constexpr, AXIS: tl.constexpr):
    diff = x[:, None, :] - y[None, :, :]
    if L1:
        s = tl.where(diff > 0, 1.0, tl.where(diff < 0, -1.0, 0.0))
    else:
        s = 2.0 * diff
    return tl.sum(s * gp[:, :, None], axis=AXIS)


@triton.jit
def laplace_kernel_fwd_kernel(
    X, Y, OUT, N, M, D, scale,
    L1: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid_n, pid_m, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rd = tl.arange(0, BLOCK_D)
    x = tl.load(X + b * N * D + rn[:, None] * D + rd[None, :], mask=(rn[:, None] < N) & (rd[None, :] < D), other=0.0)
    y = tl.load(Y + b * M * D + rm[:, None] * D + rd[None, :], mask=(rm[:, None] < M) & (rd[None, :] < D), other=0.0)
    c = tl.exp(_distance_tile(x.to(tl.float32), y.to(tl.float32), L1) * scale)
    tl.store(OUT + b * N * M + rn[:, None] * M + rm[None, :], c.to(OUT.dtype.element_ty),
             mask=(rn[:, None] < N) & (rm[None, :] < M))


@triton.jit
def laplace_matmul_fwd_kernel(
    X, Y, V, OUT, N, M, D, E, scale,
    L1: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr,
):
    pid_n, b = tl.program_id(0), tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rd = tl.arange(0, BLOCK_D)
    re = tl.arange(0, BLOCK_E)
    x = tl.load(X + b * N * D + rn[:, None] * D + rd[None, :], mask=(rn[:, None] < N) & (rd[None, :] < D), other=0.0)
    x = x.to(tl.float32)
    acc = tl.zeros((BLOCK_N, BLOCK_E), dtype=tl.float32)
    for m0 in range(0, M, BLOCK_M):
        rm = m0 + tl.arange(0, BLOCK_M)
        y = tl.load(Y + b * M * D + rm[:, None] * D + rd[None, :], mask=(rm[:, None] < M) & (rd[None, :] < D), other=0.0)
        v = tl.load(V + b * M * E + rm[:, None] * E + re[None, :], mask=(rm[:, None] < M) & (re[None, :] < E), other=0.0)
        c = tl.exp(_distance_tile(x, y.to(tl.float32), L1) * scale)
        c = tl.where(rm[None, :] < M, c, 0.0)
        if IEEE:
            acc += tl.dot(c, v.to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(c, v.to(tl.float32))
    tl.store(OUT + b * N * E + rn[:, None] * E + re[None, :], acc.to(OUT.dtype.element_ty),
             mask=(rn[:, None] < N) & (re[None, :] < E))


@triton.jit
def _grad_tile(G, C, V, rn, rm, re, b, N, M, E, x, y, scale, go,
               L1: tl.constexpr, HAS_V: tl.constexpr, IEEE: tl.constexpr):
    """dL/dD on one (BLOCK_N, BLOCK_M) tile, and the recomputed (HAS_V) or loaded C tile."""
    mask = (rn[:, None] < N) & (rm[None, :] < M)
    if HAS_V:
        c = tl.exp(_distance_tile(x, y, L1) * scale)
        c = tl.where(mask, c, 0.0)
        v = tl.load(V + b * M * E + rm[:, None] * E + re[None, :], mask=(rm[:, None] < M) & (re[None, :] < E), other=0.0)
        v = v.to(tl.float32)
        if IEEE:
            g = tl.dot(go, tl.trans(v), input_precision="ieee")
        else:
            g = tl.dot(go, tl.trans(v))
    else:
        offs = b * N * M + rn[:, None] * M + rm[None, :]
        c = tl.load(C + offs, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(G + offs, mask=mask, other=0.0).to(tl.float32)
    return g * c * scale, c


@triton.jit
def laplace_dx_kernel(
    X, Y, G, C, V, GO, DX, N, M, D, E, scale,
    L1: tl.constexpr, HAS_V: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr,
):
    pid_n, b = tl.program_id(0), tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rd = tl.arange(0, BLOCK_D)
    re = tl.arange(0, BLOCK_E)
    xmask = (rn[:, None] < N) & (rd[None, :] < D)
    x = tl.load(X + b * N * D + rn[:, None] * D + rd[None, :], mask=xmask, other=0.0).to(tl.float32)
    go = tl.zeros((BLOCK_N, BLOCK_E), dtype=tl.float32)
    if HAS_V:
        go = tl.load(GO + b * N * E + rn[:, None] * E + re[None, :], mask=(rn[:, None] < N) & (re[None, :] < E),
                     other=0.0).to(tl.float32)
    dx = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    for m0 in range(0, M, BLOCK_M):
        rm = m0 + tl.arange(0, BLOCK_M)
        y = tl.load(Y + b * M * D + rm[:, None] * D + rd[None, :], mask=(rm[:, None] < M) & (rd[None, :] < D),
                    other=0.0).to(tl.float32)
        gp, _ = _grad_tile(G, C, V, rn, rm, re, b, N, M, E, x, y, scale, go, L1, HAS_V, IEEE)
        dx += _sign_weighted(x, y, gp, L1, 1)
    tl.store(DX + b * N * D + rn[:, None] * D + rd[None, :], dx.to(DX.dtype.element_ty), mask=xmask)


@triton.jit
def laplace_dy_kernel(
    X, Y, G, C, V, GO, DY_PART, DV_PART, N, M, D, E, scale, ROWS_PER_SPLIT,
    L1: tl.constexpr, HAS_V: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr,
):
    pid_m, split, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    nsplit = tl.num_programs(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rd = tl.arange(0, BLOCK_D)
    re = tl.arange(0, BLOCK_E)
    ymask = (rm[:, None] < M) & (rd[None, :] < D)
    y = tl.load(Y + b * M * D + rm[:, None] * D + rd[None, :], mask=ymask, other=0.0).to(tl.float32)
    dy = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    dv = tl.zeros((BLOCK_M, BLOCK_E), dtype=tl.float32)
    n_lo = split * ROWS_PER_SPLIT
    for n0 in range(n_lo, n_lo + ROWS_PER_SPLIT, BLOCK_N):
        rn = n0 + tl.arange(0, BLOCK_N)
        x = tl.load(X + b * N * D + rn[:, None] * D + rd[None, :], mask=(rn[:, None] < N) & (rd[None, :] < D),
                    other=0.0).to(tl.float32)
        go = tl.zeros((BLOCK_N, BLOCK_E), dtype=tl.float32)
        if HAS_V:
            go = tl.load(GO + b * N * E + rn[:, None] * E + re[None, :], mask=(rn[:, None] < N) & (re[None, :] < E),
                         other=0.0).to(tl.float32)
        gp, c = _grad_tile(G, C, V, rn, rm, re, b, N, M, E, x, y, scale, go, L1, HAS_V, IEEE)
        dy -= _sign_weighted(x, y, gp, L1, 0)
        if HAS_V:
            if IEEE:
                dv += tl.dot(tl.trans(c), go, input_precision="ieee")
            else:
                dv += tl.dot(tl.trans(c), go)
    part = b * nsplit + split
    tl.store(DY_PART + part * M * D + rm[:, None] * D + rd[None, :], dy, mask=ymask)
    if HAS_V:
        tl.store(DV_PART + part * M * E + rm[:, None] * E + re[None, :], dv,
                 mask=(rm[:, None] < M) & (re[None, :] < E))


def _pow2(n: int, lo: int = 16) -> int:
    return max(lo, triton.next_power_of_2(n))


def _blocks(d: int) -> tuple[int, int]:
    """(BLOCK_N, BLOCK_M): keep the (BLOCK_N, BLOCK_M, BLOCK_D) difference tile near 16K elements."""
    bd = _pow2(d)
    return (32, 16) if bd <= 32 else (16, 16)


_TL = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
_INTS = {"N", "M", "D", "E", "ROWS_PER_SPLIT"}


def _signature(kernel, ptr: str, f32_ptrs: tuple[str, ...] = ()) -> dict[str, str]:
    """Triton types of ``kernel``'s runtime arguments: pointers ``*ptr`` (``*fp32`` for ``f32_ptrs``)."""
    sig = {}
    for p in kernel.params:
        if p.is_constexpr:
            continue
        name = p.name
        sig[name] = "i32" if name in _INTS else "fp32" if name == "scale" else f"*{'fp32' if name in f32_ptrs else ptr}"
    return sig


def _pow2s(hi: int) -> list[int]:
    return [b for b in (16, 32, 64, 128, 256) if b <= max(16, triton.next_power_of_2(hi))]


def aot_specialisations(d_max: int = 128, m_max: int = 128):
    """Every (kernel, signature, constexprs, num_warps, num_stages, label) the launchers below can produce
    for d, e <= d_max (benchmarks/triton_aot.py; docs/KERNELS.md)."""
    for dtype, tname in _TL.items():
        ieee = dtype == torch.float32
        for l1 in (True, False):
            kind = "L1" if l1 else "L2"
            for bd in _pow2s(d_max):
                bn, bm = _blocks(bd)
                yield (laplace_kernel_fwd_kernel, _signature(laplace_kernel_fwd_kernel, tname),
                       dict(L1=l1, BLOCK_N=bn, BLOCK_M=bm, BLOCK_D=bd), 4, 3,
                       f"kernel_fwd dtype={tname} kind={kind} d={bd}")
                meta = dict(L1=l1, HAS_V=False, IEEE=ieee, BLOCK_N=bn, BLOCK_M=bm, BLOCK_D=bd, BLOCK_E=16)
                for k in (laplace_dx_kernel, laplace_dy_kernel):
                    fam = "kernel_bwd_dx" if k is laplace_dx_kernel else "kernel_bwd_dy"
                    yield (k, _signature(k, tname, ("DY_PART", "DV_PART")), meta, 4, 3,
                           f"{fam} dtype={tname} kind={kind} d={bd} v=0")
                for be in _pow2s(d_max):
                    yield (laplace_matmul_fwd_kernel, _signature(laplace_matmul_fwd_kernel, tname),
                           dict(L1=l1, IEEE=ieee, BLOCK_N=bn, BLOCK_M=bm, BLOCK_D=bd, BLOCK_E=be), 4, 3,
                           f"matmul_fwd dtype={tname} kind={kind} d={bd} e={be}")
                    meta = dict(L1=l1, HAS_V=True, IEEE=ieee, BLOCK_N=bn, BLOCK_M=bm, BLOCK_D=bd, BLOCK_E=be)
                    for k in (laplace_dx_kernel, laplace_dy_kernel):
                        fam = "matmul_bwd_dx" if k is laplace_dx_kernel else "matmul_bwd_dy"
                        yield (k, _signature(k, tname, ("DY_PART", "DV_PART")), meta, 4, 3,
                               f"{fam} dtype={tname} kind={kind} d={bd} e={be} v=1")


def _splits(n: int, block_n: int) -> tuple[int, int]:
    blocks = triton.cdiv(n, block_n)
    splits = max(1, min(_SPLITS, blocks))
    rows = triton.cdiv(blocks, splits) * block_n
    return triton.cdiv(n, rows), rows


@triton_op("laplacianformer::laplace_kernel_fwd", mutates_args=())
def laplace_kernel_fwd(x: torch.Tensor, y: torch.Tensor, scale: float, l1: bool) -> torch.Tensor:
    """exp(scale · D).  x: (B, N, d), y: (B, M, d) contiguous -> (B, N, M)."""
    b, n, d = x.shape
    m = y.shape[1]
    out = torch.empty(b, n, m, dtype=x.dtype, device=x.device)
    bn, bm = _blocks(d)
    grid = (triton.cdiv(n, bn), triton.cdiv(m, bm), b)
    wrap_triton(laplace_kernel_fwd_kernel)[grid](x, y, out, n, m, d, scale, L1=l1, BLOCK_N=bn, BLOCK_M=bm,
                                                 BLOCK_D=_pow2(d))
    return out


@triton_op("laplacianformer::laplace_matmul_fwd", mutates_args=())
def laplace_matmul_fwd(x: torch.Tensor, y: torch.Tensor, v: torch.Tensor, scale: float, l1: bool) -> torch.Tensor:
    """exp(scale · D) @ V.  x: (B, N, d), y: (B, M, d), v: (B, M, e) contiguous -> (B, N, e)."""
    b, n, d = x.shape
    m, e = v.shape[1], v.shape[2]
    out = torch.empty(b, n, e, dtype=x.dtype, device=x.device)
    bn, bm = _blocks(d)
    grid = (triton.cdiv(n, bn), b)
    wrap_triton(laplace_matmul_fwd_kernel)[grid](
        x, y, v, out, n, m, d, e, scale, L1=l1, IEEE=v.dtype == torch.float32,
        BLOCK_N=bn, BLOCK_M=bm, BLOCK_D=_pow2(d), BLOCK_E=_pow2(e),
    )
    return out


def _backward(x, y, g, c, v, go, scale, l1):
    b, n, d = x.shape
    m = y.shape[1]
    has_v = v is not None
    e = v.shape[2] if has_v else 16
    bn, bm = _blocks(d)
    ieee = (v.dtype if has_v else x.dtype) == torch.float32
    dx = torch.empty_like(x)
    dummy = x
    args = (g if g is not None else dummy, c if c is not None else dummy, v if has_v else dummy,
            go if go is not None else dummy)
    meta = dict(L1=l1, HAS_V=has_v, IEEE=ieee, BLOCK_N=bn, BLOCK_M=bm, BLOCK_D=_pow2(d), BLOCK_E=_pow2(e))
    wrap_triton(laplace_dx_kernel)[(triton.cdiv(n, bn), b)](x, y, *args, dx, n, m, d, e, scale, **meta)
    splits, rows = _splits(n, bn)
    dy_part = torch.empty(b, splits, m, d, dtype=torch.float32, device=x.device)
    dv_part = torch.empty(b, splits, m, e, dtype=torch.float32, device=x.device) if has_v else dy_part
    wrap_triton(laplace_dy_kernel)[(triton.cdiv(m, bm), splits, b)](
        x, y, *args, dy_part, dv_part, n, m, d, e, scale, rows, **meta
    )
    dy = dy_part.sum(1).to(y.dtype)
    dv = dv_part.sum(1).to(v.dtype) if has_v else None
    return dx, dy, dv


@triton_op("laplacianformer::laplace_kernel_bwd", mutates_args=())
def laplace_kernel_bwd(
    x: torch.Tensor, y: torch.Tensor, grad: torch.Tensor, out: torch.Tensor, scale: float, l1: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dX, dY) of exp(scale · D) given dL/dC ``grad`` and C ``out`` (B, N, M)."""
    dx, dy, _ = _backward(x, y, grad.contiguous(), out, None, None, scale, l1)
    return dx, dy


@triton_op("laplacianformer::laplace_matmul_bwd", mutates_args=())
def laplace_matmul_bwd(
    x: torch.Tensor, y: torch.Tensor, v: torch.Tensor, grad: torch.Tensor, scale: float, l1: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dX, dY, dV) of exp(scale · D) @ V given dL/dO ``grad`` (B, N, e), recomputing C."""
    return _backward(x, y, None, None, v, grad.contiguous(), scale, l1)


register_kernel_autograd(laplace_kernel_fwd, laplace_kernel_bwd)
register_matmul_autograd(laplace_matmul_fwd, laplace_matmul_bwd)


def laplace_kernel_triton(x: torch.Tensor, y: torch.Tensor, lam: float, kind: str = "laplacian") -> torch.Tensor:
    """exp(-dist(x_i, y_j) / lam).  x: (..., N, d), y: (..., M, d) -> (..., N, M)."""
    out = laplace_kernel_fwd(flatten_batch(x), flatten_batch(y), -1.0 / float(lam), kind == "laplacian")
    return out.reshape(*x.shape[:-1], y.shape[-2])


def laplace_kernel_matmul_triton(
    x: torch.Tensor, y: torch.Tensor, v: torch.Tensor, lam: float, kind: str = "laplacian"
) -> torch.Tensor:
    """k(X, Y) @ V, fused.  x: (..., N, d), y: (..., M, d), v: (..., M, e) -> (..., N, e)."""
    out = laplace_matmul_fwd(flatten_batch(x), flatten_batch(y), flatten_batch(v), -1.0 / float(lam), kind == "laplacian")
    return out.reshape(*x.shape[:-1], v.shape[-1])

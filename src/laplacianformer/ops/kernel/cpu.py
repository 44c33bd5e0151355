"""Fast CPU path for the kernel primitives (SPEC.md §1, §6).

The rows of x are processed in chunks small enough for the (chunk, M, d) difference tensor to stay in
cache, with in-place elementwise ops, so no (N, M, d) temporary is ever allocated; the backward
recomputes the differences chunk by chunk instead of storing them:

    C_nm  = exp(-D_nm / lam),  D_nm = sum_d |x_nd - y_md|     (laplacian)  or  sum_d (x_nd - y_md)^2
    G'_nm = dL/dC_nm · C_nm · (-1/lam)
    dX_nd = sum_m G'_nm s_nmd,  dY_md = -sum_n G'_nm s_nmd,  s = sign(x_nd - y_md)  (2 (x_nd - y_md))

sign(0) = 0: at x_nd = y_md the L1 term contributes no gradient (torch.sign's convention, the
subgradient of minimal norm).  ``laplace_kernel_matmul`` computes k(X, Y) @ V chunk by chunk and never
stores the N×M matrix; its backward recomputes each chunk of C.
"""

from __future__ import annotations

import torch

_CHUNK_ELEMS = 1 << 16


def _chunk_rows(batch: int, m: int, d: int) -> int:
    return max(1, _CHUNK_ELEMS // max(1, batch * m * d))


def _dist_chunk(xb: torch.Tensor, y: torch.Tensor, kind: str) -> torch.Tensor:
    """xb: (B, n, d), y: (B, M, d) -> (B, n, M) distances."""
    diff = xb.unsqueeze(-2) - y.unsqueeze(-3)
    if kind == "laplacian":
        return diff.abs_().sum(-1)
    return diff.square_().sum(-1)


def _kernel_chunk(xb: torch.Tensor, y: torch.Tensor, lam: float, kind: str) -> torch.Tensor:
    return _dist_chunk(xb, y, kind).mul_(-1.0 / lam).exp_()


def _grad_chunk(xb: torch.Tensor, y: torch.Tensor, gp: torch.Tensor, kind: str):
    """gp: (B, n, M) = dL/dD.  Returns (dX chunk (B, n, d), dY contribution (B, M, d))."""
    diff = xb.unsqueeze(-2) - y.unsqueeze(-3)
    if kind == "laplacian":
        diff.sign_()
    else:
        diff.mul_(2.0)
    diff.mul_(gp.unsqueeze(-1))
    return diff.sum(-2), diff.sum(-3).neg_()


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-2], t.shape[-1])


class _KernelCPU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y, lam, kind):
        xf, yf = _flat(x), _flat(y)
        b, n, d = xf.shape
        m = yf.shape[1]
        out = torch.empty(b, n, m, dtype=x.dtype)
        step = _chunk_rows(b, m, d)
        for s in range(0, n, step):
            out[:, s : s + step] = _kernel_chunk(xf[:, s : s + step], yf, lam, kind)
        ctx.save_for_backward(x, y, out)
        ctx.lam, ctx.kind = lam, kind
        return out.reshape(*x.shape[:-1], m)

    @staticmethod
    def backward(ctx, grad):
        x, y, out = ctx.saved_tensors
        xf, yf = _flat(x), _flat(y)
        b, n, d = xf.shape
        m = yf.shape[1]
        gp = (_flat(grad) * out).mul_(-1.0 / ctx.lam)
        dx = torch.empty_like(xf)
        dy = torch.zeros_like(yf)
        step = _chunk_rows(b, m, d)
        for s in range(0, n, step):
            gx, gy = _grad_chunk(xf[:, s : s + step], yf, gp[:, s : s + step], ctx.kind)
            dx[:, s : s + step] = gx
            dy += gy
        return dx.reshape(x.shape), dy.reshape(y.shape), None, None


class _KernelMatmulCPU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y, v, lam, kind):
        xf, yf, vf = _flat(x), _flat(y), _flat(v)
        b, n, d = xf.shape
        m, e = vf.shape[1], vf.shape[2]
        out = torch.empty(b, n, e, dtype=x.dtype)
        step = _chunk_rows(b, m, d)
        for s in range(0, n, step):
            torch.bmm(_kernel_chunk(xf[:, s : s + step], yf, lam, kind), vf, out=out[:, s : s + step])
        ctx.save_for_backward(x, y, v)
        ctx.lam, ctx.kind = lam, kind
        return out.reshape(*x.shape[:-1], e)

    @staticmethod
    def backward(ctx, grad):
        x, y, v = ctx.saved_tensors
        xf, yf, vf, gf = _flat(x), _flat(y), _flat(v), _flat(grad)
        b, n, d = xf.shape
        m = yf.shape[1]
        dx = torch.empty_like(xf)
        dy = torch.zeros_like(yf)
        dv = torch.zeros_like(vf)
        step = _chunk_rows(b, m, d)
        for s in range(0, n, step):
            xb, gb = xf[:, s : s + step], gf[:, s : s + step]
            c = _kernel_chunk(xb, yf, ctx.lam, ctx.kind)
            dv.baddbmm_(c.transpose(1, 2), gb)
            gp = torch.bmm(gb, vf.transpose(1, 2)).mul_(c).mul_(-1.0 / ctx.lam)
            gx, gy = _grad_chunk(xb, yf, gp, ctx.kind)
            dx[:, s : s + step] = gx
            dy += gy
        return dx.reshape(x.shape), dy.reshape(y.shape), dv.reshape(v.shape), None, None


def laplace_kernel_cpu(x: torch.Tensor, y: torch.Tensor, lam: float, kind: str = "laplacian") -> torch.Tensor:
    """exp(-dist(x_i, y_j) / lam), chunked.  x: (..., N, d), y: (..., M, d) -> (..., N, M)."""
    return _KernelCPU.apply(x.contiguous(), y.contiguous(), float(lam), kind)


def laplace_kernel_matmul_cpu(
    x: torch.Tensor, y: torch.Tensor, v: torch.Tensor, lam: float, kind: str = "laplacian"
) -> torch.Tensor:
    """k(X, Y) @ V without storing k(X, Y).  x: (..., N, d), y: (..., M, d), v: (..., M, e) -> (..., N, e)."""
    return _KernelMatmulCPU.apply(x.contiguous(), y.contiguous(), v.contiguous(), float(lam), kind)

"""Fast CPU path for the kernel primitives (SPEC.md §1, §6).

    D_nm  = sum_d |x_nd - y_md|  (laplacian)  or  sum_d (x_nd - y_md)^2  (gaussian)
    C_nm  = exp(-D_nm / lam)
    G'_nm = dL/dD_nm = dL/dC_nm · C_nm · (-1/lam)
    dX_nd = sum_m G'_nm s_nmd,   dY_md = -sum_n G'_nm s_nmd,   s = sign(x_nd - y_md)  (or 2 (x_nd - y_md))

sign(0) = 0: where x_nd = y_md the L1 term contributes no gradient (torch.sign's convention, the
minimal-norm subgradient).  D and the sign reduction run in the C loops of ``native.py`` (one pass over
(n, m, d), no (N, M, d) temporary, vectorised and threaded); exp and the products with V use PyTorch.
Without a C compiler the same formulas run in PyTorch on row chunks small enough to stay in cache.
``laplace_kernel_matmul`` works on row chunks and never stores the N×M matrix; its backward recomputes
each chunk of C.
"""

from __future__ import annotations

import torch

from . import native

_CHUNK_ELEMS = 1 << 16
_MATMUL_CHUNK_ELEMS = 1 << 20


def _chunk_rows(batch: int, m: int, d: int, elems: int) -> int:
    return max(1, elems // max(1, batch * m * d))


def _use_native(x: torch.Tensor) -> bool:
    return x.dtype in (torch.float32, torch.float64) and native.load() is not None


def pairwise_distance_cpu(x: torch.Tensor, y: torch.Tensor, kind: str, scale: float = 1.0) -> torch.Tensor:
    """scale · D (B, N, M) for contiguous x (B, N, d), y (B, M, d); no autograd."""
    if _use_native(x):
        return native.pairwise_distance_native(x, y, kind == "laplacian", scale)
    b, n, d = x.shape
    m = y.shape[1]
    out = torch.empty(b, n, m, dtype=x.dtype)
    step = _chunk_rows(b, m, d, _CHUNK_ELEMS)
    for s in range(0, n, step):
        diff = x[:, s : s + step].unsqueeze(-2) - y.unsqueeze(-3)
        diff = diff.abs_() if kind == "laplacian" else diff.square_()
        torch.sum(diff, -1, out=out[:, s : s + step])
    return out.mul_(scale) if scale != 1.0 else out


def pairwise_distance_grad_cpu(
    x: torch.Tensor, y: torch.Tensor, g: torch.Tensor, c: torch.Tensor | None, scale: float, kind: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dX (B, N, d), dY (B, M, d)) for dL/dD = g · c · scale (B, N, M) (c None means 1); no autograd."""
    if _use_native(x):
        c = None if c is None else c.contiguous()
        return native.pairwise_distance_grad_native(x, y, g.contiguous(), c, scale, kind == "laplacian")
    gp = g * scale if c is None else (g * c).mul_(scale)
    b, n, d = x.shape
    m = y.shape[1]
    dx = torch.empty_like(x)
    dy = torch.zeros_like(y)
    step = _chunk_rows(b, m, d, _CHUNK_ELEMS)
    for s in range(0, n, step):
        diff = x[:, s : s + step].unsqueeze(-2) - y.unsqueeze(-3)
        diff = diff.sign_() if kind == "laplacian" else diff.mul_(2.0)
        diff.mul_(gp[:, s : s + step].unsqueeze(-1))
        torch.sum(diff, -2, out=dx[:, s : s + step])
        dy.sub_(diff.sum(-3))
    return dx, dy


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-2], t.shape[-1]).contiguous()


class _KernelCPU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y, lam, kind):
        xf, yf = _flat(x), _flat(y)
        out = pairwise_distance_cpu(xf, yf, kind, -1.0 / lam).exp_()
        ctx.save_for_backward(xf, yf, out)
        ctx.lam, ctx.kind, ctx.shapes = lam, kind, (x.shape, y.shape)
        return out.reshape(*x.shape[:-1], yf.shape[1])

    @staticmethod
    def backward(ctx, grad):
        xf, yf, out = ctx.saved_tensors
        dx, dy = pairwise_distance_grad_cpu(xf, yf, grad.reshape(out.shape), out, -1.0 / ctx.lam, ctx.kind)
        return dx.reshape(ctx.shapes[0]), dy.reshape(ctx.shapes[1]), None, None


class _KernelMatmulCPU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y, v, lam, kind):
        xf, yf, vf = _flat(x), _flat(y), _flat(v)
        b, n, d = xf.shape
        m, e = vf.shape[1], vf.shape[2]
        out = torch.empty(b, n, e, dtype=x.dtype)
        step = _chunk_rows(b, m, 1, _MATMUL_CHUNK_ELEMS)
        for s in range(0, n, step):
            c = pairwise_distance_cpu(xf[:, s : s + step].contiguous(), yf, kind, -1.0 / lam).exp_()
            out[:, s : s + step] = torch.bmm(c, vf)
        ctx.save_for_backward(xf, yf, vf)
        ctx.lam, ctx.kind, ctx.shapes = lam, kind, (x.shape, y.shape, v.shape)
        return out.reshape(*x.shape[:-1], e)

    @staticmethod
    def backward(ctx, grad):
        xf, yf, vf = ctx.saved_tensors
        b, n, d = xf.shape
        m = yf.shape[1]
        gf = grad.reshape(b, n, -1)
        dx = torch.empty_like(xf)
        dy = torch.zeros_like(yf)
        dv = torch.zeros_like(vf)
        step = _chunk_rows(b, m, 1, _MATMUL_CHUNK_ELEMS)
        for s in range(0, n, step):
            xb, gb = xf[:, s : s + step].contiguous(), gf[:, s : s + step]
            c = pairwise_distance_cpu(xb, yf, ctx.kind, -1.0 / ctx.lam).exp_()
            dv.baddbmm_(c.transpose(1, 2), gb)
            gx, gy = pairwise_distance_grad_cpu(xb, yf, torch.bmm(gb, vf.transpose(1, 2)), c, -1.0 / ctx.lam, ctx.kind)
            dx[:, s : s + step] = gx
            dy += gy
        shapes = ctx.shapes
        return dx.reshape(shapes[0]), dy.reshape(shapes[1]), dv.reshape(shapes[2]), None, None


def laplace_kernel_cpu(x: torch.Tensor, y: torch.Tensor, lam: float, kind: str = "laplacian") -> torch.Tensor:
    """exp(-dist(x_i, y_j) / lam).  x: (..., N, d), y: (..., M, d) -> (..., N, M)."""
    return _KernelCPU.apply(x, y, float(lam), kind)


def laplace_kernel_matmul_cpu(
    x: torch.Tensor, y: torch.Tensor, v: torch.Tensor, lam: float, kind: str = "laplacian"
) -> torch.Tensor:
    """k(X, Y) @ V without storing k(X, Y).  x: (..., N, d), y: (..., M, d), v: (..., M, e) -> (..., N, e)."""
    return _KernelMatmulCPU.apply(x, y, v, float(lam), kind)

"""Fast CPU path for the kernel primitives (docs/DESIGN.md §1, §6).

    D_nm  = sum_d |x_nd - y_md|  (L1 families)  or  sum_d (x_nd - y_md)^2  (the L2 ones: the spec's accumulation)
    C_nm  = f(r(D_nm) / lam)       (the family's profile, ``kernel_families``; exp(-D_nm / lam) in place for
                                    the Laplacian and the Gaussian)
    G'_nm = dL/dD_nm = dL/dC_nm · dC/dD   (``KernelSpec.slope_of``; C_nm · (-1/lam) for the exp families)
    dX_nd = sum_m G'_nm s_nmd,   dY_md = -sum_n G'_nm s_nmd,   s = sign(x_nd - y_md)  (or 2 (x_nd - y_md))

sign(0) = 0: where x_nd = y_md the L1 term contributes no gradient (torch.sign's convention, the
minimal-norm subgradient).  D and the sign reduction run in the C loops of ``native.py`` (one pass over
(n, m, d), no (N, M, d) temporary, vectorised and threaded); exp and the products with V use PyTorch.
Without a C compiler the same formulas run in PyTorch on row chunks small enough to stay in cache.
The primitives are ``torch.library.custom_op``s (``laplacianformer::laplace_kernel_cpu`` ...) with fake
implementations and registered autograd (``_autograd.py``, shared with ``triton.py``), so torch.compile
traces them without graph breaks.
``laplace_kernel_matmul`` works on row chunks and never stores the N×M matrix; its backward recomputes
each chunk of C.
"""

from __future__ import annotations

import torch

from ..kernel_families import KernelSpec, kernel_spec
from ..layout import last_dim_contiguous
from . import native
from ._autograd import register_kernel_autograd, register_matmul_autograd

_CHUNK_ELEMS = 1 << 16
_MATMUL_CHUNK_ELEMS = 1 << 22


def _chunk_rows(batch: int, m: int, d: int, elems: int) -> int:
    return max(1, elems // max(1, batch * m * d))


def _use_native(x: torch.Tensor) -> bool:
    return x.dtype in (torch.float32, torch.float64) and native.load() is not None


def _batch_rows(t: torch.Tensor) -> torch.Tensor:
    """(..., R, C) -> (B, R, C), copying as little as possible: ``reshape`` (a view when the leading
    dimensions merge, else a copy), then a contiguous copy only when the last dimension is strided. The C
    loops take any batch and row strides (e.g. q = qk[..., :d] of a wider projection); the Triton path
    uses ``layout.flatten_batch`` instead, which always returns a contiguous tensor."""
    return last_dim_contiguous(t.reshape(-1, t.shape[-2], t.shape[-1]))


def pairwise_distance_cpu(
    x: torch.Tensor, y: torch.Tensor, kernel: str, scale: float = 1.0, out: torch.Tensor | None = None
) -> torch.Tensor:
    """scale · D (B, N, M) for x (B, N, d), y (B, M, d) (any batch and row strides), into ``out`` (a
    contiguous (B, N, M) tensor) when given; no autograd."""
    if _use_native(x):
        return native.pairwise_distance_native(x, y, kernel_spec(kernel).l1, scale, out)
    b, n, d = x.shape
    m = y.shape[1]
    if out is None:
        out = torch.empty(b, n, m, dtype=x.dtype)
    step = _chunk_rows(b, m, d, _CHUNK_ELEMS)
    for s in range(0, n, step):
        diff = x[:, s : s + step].unsqueeze(-2) - y.unsqueeze(-3)
        diff = diff.abs_() if kernel_spec(kernel).l1 else diff.square_()
        torch.sum(diff, -1, out=out[:, s : s + step])
    return out.mul_(scale) if scale != 1.0 else out


def pairwise_distance_grad_cpu(
    x: torch.Tensor,
    y: torch.Tensor,
    g: torch.Tensor,
    c: torch.Tensor | None,
    scale: float,
    kernel: str,
    dx: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dX (B, N, d), dY (B, M, d)) for dL/dD = g · c · scale (B, N, M) (c None means 1); no autograd.

    x, y: any batch and row strides; g, c: (B, N, M). dX is written into ``dx`` (a (B, N, d) tensor whose last
    dimension is contiguous) when given, else into a new contiguous tensor."""
    if _use_native(x):
        c = None if c is None else c.contiguous()
        return native.pairwise_distance_grad_native(x, y, g.contiguous(), c, scale, kernel_spec(kernel).l1, dx)
    gp = g * scale if c is None else (g * c).mul_(scale)
    b, n, d = x.shape
    m = y.shape[1]
    if dx is None:
        dx = x.new_empty(x.shape)
    dy = y.new_zeros(y.shape)
    step = _chunk_rows(b, m, d, _CHUNK_ELEMS)
    for s in range(0, n, step):
        diff = x[:, s : s + step].unsqueeze(-2) - y.unsqueeze(-3)
        diff = diff.sign_() if kernel_spec(kernel).l1 else diff.mul_(2.0)
        diff.mul_(gp[:, s : s + step].unsqueeze(-1))
        torch.sum(diff, -2, out=dx[:, s : s + step])
        dy.sub_(diff.sum(-3))
    return dx, dy


def kernel_rows_cpu(x: torch.Tensor, y: torch.Tensor, spec: KernelSpec, inv_lam: float,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """k(X, Y) = f(r / lam) (B, N, M) into ``out`` when given: exp(-inv_lam · D) in place for the exp families,
    else the spec's profile on D."""
    if spec.exp_of_accumulation:
        return pairwise_distance_cpu(x, y, spec.name, -inv_lam, out).exp_()
    acc = pairwise_distance_cpu(x, y, spec.name)
    return spec.kernel_of(acc, inv_lam) if out is None else out.copy_(spec.kernel_of(acc, inv_lam))


def kernel_grad_cpu(x: torch.Tensor, y: torch.Tensor, grad: torch.Tensor, k: torch.Tensor, spec: KernelSpec,
                    inv_lam: float, dx: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(dX, dY) of k = ``kernel_rows_cpu`` for dL/dk ``grad`` (B, N, M): the slope fused into the C loop
    (-k / lam) for the exp families, else dL/dD = grad · ``slope_of`` (D recomputed when it needs it)."""
    if spec.exp_of_accumulation:
        return pairwise_distance_grad_cpu(x, y, grad, k, -inv_lam, spec.name, dx)
    acc = pairwise_distance_cpu(x, y, spec.name) if spec.slope_needs_distance else None
    return pairwise_distance_grad_cpu(x, y, grad * spec.slope_of(acc, k, inv_lam), None, 1.0, spec.name, dx)


@torch.library.custom_op("laplacianformer::laplace_kernel_cpu", mutates_args=(), device_types="cpu")
def _kernel_op(x: torch.Tensor, y: torch.Tensor, inv_lam: float, kernel: str) -> torch.Tensor:
    """f(r / lam).  x: (B, N, d), y: (B, M, d) (last dimension contiguous) -> (B, N, M)."""
    return kernel_rows_cpu(x, y, kernel_spec(kernel), inv_lam)


@torch.library.custom_op("laplacianformer::laplace_kernel_cpu_bwd", mutates_args=(), device_types="cpu")
def _kernel_bwd_op(
    x: torch.Tensor, y: torch.Tensor, grad: torch.Tensor, out: torch.Tensor, inv_lam: float, kernel: str
) -> tuple[torch.Tensor, torch.Tensor]:
    return kernel_grad_cpu(x, y, grad, out, kernel_spec(kernel), inv_lam)


def _row_chunks(b: int, n: int, m: int):
    """(first row, row count) chunks of N with at most _MATMUL_CHUNK_ELEMS kernel entries over all batches."""
    step = max(1, _MATMUL_CHUNK_ELEMS // max(1, b * m))
    return [(s, min(step, n - s)) for s in range(0, n, step)]


def _rows(t: torch.Tensor, s: int, r: int, buf: torch.Tensor) -> torch.Tensor:
    """Rows s:s+r of t (B, N, k) as a contiguous tensor: t itself when it is one chunk, else copied into buf."""
    if r == t.shape[1]:
        return t
    out = buf[: t.shape[0] * r * t.shape[2]].view(t.shape[0], r, t.shape[2])
    return out.copy_(t[:, s : s + r])


def _matmul_rows(x: torch.Tensor, y: torch.Tensor, v: torch.Tensor, inv_lam: float, kernel: str) -> torch.Tensor:
    """f(r / lam) @ V on row chunks.  x: (B, N, d), y: (B, M, d), v: (B, M, e) -> (B, N, e); no autograd."""
    spec = kernel_spec(kernel)
    b, n, d = x.shape
    m, e = v.shape[1], v.shape[2]
    chunks = _row_chunks(b, n, m)
    rmax = chunks[0][1]
    out = torch.empty(b, n, e, dtype=x.dtype)
    cbuf = torch.empty(b * rmax * m, dtype=x.dtype)
    obuf = torch.empty(b * rmax * e if len(chunks) > 1 else 0, dtype=x.dtype)
    for s, r in chunks:
        c = kernel_rows_cpu(x[:, s : s + r], y, spec, inv_lam, out=cbuf[: b * r * m].view(b, r, m))
        if r == n:
            torch.bmm(c, v, out=out)
        else:
            out[:, s : s + r] = torch.bmm(c, v, out=obuf[: b * r * e].view(b, r, e))
    return out


@torch.library.custom_op("laplacianformer::laplace_matmul_cpu", mutates_args=(), device_types="cpu")
def _matmul_op(x: torch.Tensor, y: torch.Tensor, v: torch.Tensor, inv_lam: float, kernel: str) -> torch.Tensor:
    """``_matmul_rows`` as a custom op (its autograd and fake are registered below)."""
    return _matmul_rows(x, y, v, inv_lam, kernel)


@torch.library.custom_op("laplacianformer::laplace_matmul_cpu_bwd", mutates_args=(), device_types="cpu")
def _matmul_bwd_op(
    x: torch.Tensor, y: torch.Tensor, v: torch.Tensor, grad: torch.Tensor, inv_lam: float, kernel: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    spec = kernel_spec(kernel)
    b, n, d = x.shape
    m, e = v.shape[1], v.shape[2]
    chunks = _row_chunks(b, n, m)
    rmax = chunks[0][1]
    dx = x.new_empty(x.shape)
    dy = y.new_zeros(y.shape)
    dv = v.new_zeros(v.shape)
    cbuf = torch.empty(b * rmax * m, dtype=x.dtype)
    gbuf = torch.empty(b * rmax * m, dtype=x.dtype)
    obuf = torch.empty(b * rmax * e if len(chunks) > 1 else 0, dtype=x.dtype)
    for s, r in chunks:
        xb, gb = x[:, s : s + r], _rows(grad, s, r, obuf)
        c = kernel_rows_cpu(xb, y, spec, inv_lam, out=cbuf[: b * r * m].view(b, r, m))
        dv.baddbmm_(c.transpose(1, 2), gb)
        gc = torch.bmm(gb, v.transpose(1, 2), out=gbuf[: b * r * m].view(b, r, m))
        _, gy = kernel_grad_cpu(xb, y, gc, c, spec, inv_lam, dx=dx[:, s : s + r])
        dy += gy
    return dx, dy, dv


@_kernel_op.register_fake
def _(x, y, inv_lam, kernel):
    return x.new_empty(x.shape[0], x.shape[1], y.shape[1])


@_kernel_bwd_op.register_fake
def _(x, y, grad, out, inv_lam, kernel):
    return x.new_empty(x.shape), y.new_empty(y.shape)


@_matmul_op.register_fake
def _(x, y, v, inv_lam, kernel):
    return x.new_empty(x.shape[0], x.shape[1], v.shape[2])


@_matmul_bwd_op.register_fake
def _(x, y, v, grad, inv_lam, kernel):
    return x.new_empty(x.shape), y.new_empty(y.shape), v.new_empty(v.shape)


register_kernel_autograd(_kernel_op, _kernel_bwd_op)
register_matmul_autograd(_matmul_op, _matmul_bwd_op)


def _eager_no_grad(*tensors: torch.Tensor) -> bool:
    """Whether a call may skip its custom op (whose dispatch costs ~0.3 ms): eager mode and no gradient needed.
    The op is what autograd and torch.compile see; the function inside it computes the same."""
    return not torch.compiler.is_compiling() and not (
        torch.is_grad_enabled() and any(t.requires_grad for t in tensors))


def laplace_kernel_cpu(x: torch.Tensor, y: torch.Tensor, lam: float, kernel: str = "laplacian") -> torch.Tensor:
    """f(r(x_i, y_j) / lam) of the family ``kernel``.  x: (..., N, d), y: (..., M, d) -> (..., N, M)."""
    xs, ys = _batch_rows(x), _batch_rows(y)
    if _eager_no_grad(x, y):
        out = kernel_rows_cpu(xs, ys, kernel_spec(kernel), 1.0 / float(lam))
    else:
        out = _kernel_op(xs, ys, 1.0 / float(lam), kernel)
    return out.reshape(*x.shape[:-1], y.shape[-2])


def laplace_kernel_matmul_cpu(
    x: torch.Tensor, y: torch.Tensor, v: torch.Tensor, lam: float, kernel: str = "laplacian"
) -> torch.Tensor:
    """k(X, Y) @ V without storing k(X, Y).  x: (..., N, d), y: (..., M, d), v: (..., M, e) -> (..., N, e)."""
    rows = _matmul_rows if _eager_no_grad(x, y, v) else _matmul_op
    out = rows(_batch_rows(x), _batch_rows(y), _batch_rows(v), 1.0 / float(lam), kernel)
    return out.reshape(*x.shape[:-1], v.shape[-1])


def laplace_kernel_grad_cpu(
    x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, grad: torch.Tensor, lam: float, kernel: str = "laplacian"
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dX, dY) of ``laplace_kernel_cpu`` without autograd: the backward op of its autograd, given the
    kernel ``out`` and dL/dK ``grad`` (..., N, M)."""
    m = y.shape[-2]
    dx, dy = _kernel_bwd_op(_batch_rows(x), _batch_rows(y), grad.reshape(-1, x.shape[-2], m).contiguous(),
                            out.reshape(-1, x.shape[-2], m).contiguous(), 1.0 / float(lam), kernel)
    return dx.reshape(x.shape), dy.reshape(y.shape)


def laplace_kernel_matmul_grad_cpu(
    x: torch.Tensor, y: torch.Tensor, v: torch.Tensor, grad: torch.Tensor, lam: float, kernel: str = "laplacian"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dX, dY, dV) of ``laplace_kernel_matmul_cpu`` without autograd, given dL/dO ``grad`` (..., N, e)."""
    g3 = grad.reshape(-1, x.shape[-2], v.shape[-1]).contiguous()
    dx, dy, dv = _matmul_bwd_op(_batch_rows(x), _batch_rows(y), _batch_rows(v), g3, 1.0 / float(lam), kernel)
    return dx.reshape(x.shape), dy.reshape(y.shape), dv.reshape(v.shape)

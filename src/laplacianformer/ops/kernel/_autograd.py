"""Autograd glue shared by the CPU and Triton kernel primitives (docs/DESIGN.md §1, §6).

Both register a forward op ``fwd(x, y, scale, flag)`` (kernel matrix) or ``fwd(x, y, v, scale, flag)``
(product with V) and a backward op taking the saved tensors, the contiguous output gradient, ``scale``
and ``flag`` (the kernel family: its name on the CPU, its id for Triton; ``scale`` 1 / λ); these functions
connect them.
"""

from __future__ import annotations


def register_kernel_autograd(fwd, bwd) -> None:
    """fwd(x, y, scale, flag) -> C (B, N, M); bwd(x, y, dC, C, scale, flag) -> (dX, dY)."""

    def setup(ctx, inputs, output):
        x, y, scale, flag = inputs
        ctx.save_for_backward(x, y, output)
        ctx.scale, ctx.flag = scale, flag

    def backward(ctx, grad):
        x, y, out = ctx.saved_tensors
        dx, dy = bwd(x, y, grad.contiguous(), out, ctx.scale, ctx.flag)
        return dx, dy, None, None

    fwd.register_autograd(backward, setup_context=setup)


def register_matmul_autograd(fwd, bwd) -> None:
    """fwd(x, y, v, scale, flag) -> C @ V (B, N, e); bwd(x, y, v, dO, scale, flag) -> (dX, dY, dV)."""

    def setup(ctx, inputs, output):
        x, y, v, scale, flag = inputs
        ctx.save_for_backward(x, y, v)
        ctx.scale, ctx.flag = scale, flag

    def backward(ctx, grad):
        x, y, v = ctx.saved_tensors
        dx, dy, dv = bwd(x, y, v, grad.contiguous(), ctx.scale, ctx.flag)
        return dx, dy, dv, None, None

    fwd.register_autograd(backward, setup_context=setup)

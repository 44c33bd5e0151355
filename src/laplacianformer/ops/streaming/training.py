"""The op ``fused_training``: the layer's Nyström core plus its DWConv(V), forward and backward each in a few fused
passes, for calls that need a gradient (docs/KERNELS.md, "The fused backward"; the formulas are
``backward_reference.py``'s, docs/DESIGN.md §2.1, §3, §4.3–§4.5 differentiated).

    fused_training(qkv, settings, hw, grid, heads, tied, weight, bias) -> (B, N, C), or None

qkv (B, N, P·C) is the layer's one projection (P = 3: q, k, v; P = 2 with K = Q: q, v), C = H·d; the result is
the heads merged + DWConv(V) (weight (C, 1, 3, 3), bias (C,) or None; weight None: no conv), the (B, N, C) the
layer's ``proj`` reads. The forward is the fused landmark solve and the streaming passes (5 launches; they keep
the m×m and m×e statistics of ``backward_reference.ForwardState``); the backward is passes A–E (4 launches
without whitening, 5 with) and writes dq, dk, dv straight into one (B, N, P·C) gradient, so autograd hands the
projection its gradient with no gather or copy. Backends, in the order "auto" tries them:

- ``triton``: CUDA tensors (or ``TRITON_INTERPRET=1`` when forced): ``landmarks_triton``, ``triton`` (the
  forward passes with ``save``), ``backward_stats_triton`` (A, B), ``backward_landmarks_triton`` (C, E),
  ``backward_rows_triton`` (D);
- ``torch``: the same passes in plain PyTorch (``landmark_solve_reference``, ``backward_reference``), the
  kernels' specification; never chosen automatically;
- ``steps`` (the reference of the op): returns None, and the layer runs its unfused path (the core's step
  path with autograd), which serves everything.

What both fused backends serve is declared (``limits.TRAINING``, ``limits.TRITON_TRAINING``, docs/DESIGN.md
§6.3): no padding mask and no prefix tokens (the layer does not ask then), a 2-D grid of Python ints, the
shipped norms (``limits.STREAMED_NORMS``; the ablation norms run the unfused path) with any §4.6 output scale
(``norm_scale``: α = N^-p on the whitened part, ``limits.output_alpha``; a learned gain is the caller's to
refuse: ``attention_from_qkv`` does not ask then), Newton–Schulz with the implicit backward, m <= 64, d <= 128, no graph tracing or dispatch
mode. qkv in float32, float16 or bfloat16 (``limits.LOAD_DTYPES``, under autocast or not): ``triton`` reads it
and the gradient as they are and writes dq, dk, dv in qkv's dtype, every sum in float32 and the whole
m×m algebra (Newton–Schulz included) in float32 (docs/DESIGN.md §1.3); ``torch`` computes in float32 from the
half values (the same specification).
"""

from __future__ import annotations

import torch

from ..capabilities import Call, triton_missing, unserved
from ..settings import AttentionSettings
from ..value_conv import ValueConv, value_conv_heads
from .backward_reference import ForwardState, forward_state, output_of, streaming_backward_reference
from .gates import eager_only, float32_of, fused_op
from .landmarks import landmark_solve_reference
from .limits import TRAINING, TRITON_TRAINING, conv_unfit, output_alpha, scale_power, whitens

__all__ = ["FUSED_TRAINING", "fused_training"]


def fused_training(qkv: torch.Tensor, s: AttentionSettings, hw, grid, heads: int, tied: bool,
                   weight: torch.Tensor | None = None, bias: torch.Tensor | None = None):
    """(B, N, C) = heads merged + DWConv(V) by the selected backend (module docstring), or None: run the
    unfused path. A call while torch.compile traces is none of the op's (the graph holds the step ops)."""
    if torch.compiler.is_compiling():
        return None
    return FUSED_TRAINING(qkv, s, hw, grid, heads, tied, weight, bias)


def _views(qkv: torch.Tensor, heads: int, tied: bool):
    """q, k (``k is q`` when tied), v: (B, H, N, d) head views of qkv (B, N, P·C), and v's (B, N, C) tokens."""
    b, n, width = qkv.shape
    c = width // (2 if tied else 3)
    split = lambda t: t.view(b, n, heads, c // heads).transpose(1, 2)  # noqa: E731
    q = split(qkv[..., :c])
    k = q if tied else split(qkv[..., c:2 * c])
    tokens = qkv[..., width - c:]
    return q, k, split(tokens), tokens


def _layout(qkv, s, hw, grid, heads, tied, weight, bias) -> str | None:
    """What no declaration says: the capture mode, the projection's layout, the 2-D grid of Python ints."""
    why = eager_only(TRAINING.what)
    if why is not None:
        return why
    if qkv.dim() != 3 or qkv.shape[-1] % ((2 if tied else 3) * heads) or qkv.stride(-1) != 1:
        return f"qkv: expected a (B, N, {'2' if tied else '3'}·C) projection with C a multiple of {heads} heads"
    if not (isinstance(hw, tuple) and isinstance(grid, tuple) and all(type(x) is int for x in (*hw, *grid))):
        return "a 1-D sequence or graph sizes: the fused passes take a 2-D grid of Python ints"
    if hw[0] * hw[1] != qkv.shape[1]:
        return f"hw={hw} is not a grid of the N={qkv.shape[1]} tokens"
    return None


def _call(qkv, s, hw, grid, heads, tied, weight, bias) -> Call:
    """The op's arguments (``_layout`` passed) as the ``Call`` its backends' declarations are checked against:
    the conv's weight and bias checked for their device and gradient."""
    c = qkv.shape[-1] // (2 if tied else 3)
    return Call((qkv,), kernel=s.kernel, norm=s.norm, m=grid[0] * grid[1], d=c // heads, e=c // heads,
                solver=s.solver, ns_backward=s.ns_backward, aux=tuple(t for t in (weight, bias) if t is not None))


def _conv_refusal(qkv, s, hw, grid, heads, tied, weight, bias) -> str | None:
    """A conv the passes cannot fuse (``limits.conv_unfit``)."""
    if weight is None:
        return None
    _, _, v, tokens = _views(qkv, heads, tied)
    return conv_unfit(ValueConv(tokens, hw, weight, bias), v, None)


def _refusal(*inputs) -> str | None:
    return _layout(*inputs) or unserved(TRAINING, _call(*inputs)) or _conv_refusal(*inputs)


def _triton_refusal(*inputs) -> str | None:
    why = _layout(*inputs)
    if why is None:
        call = _call(*inputs)
        why = unserved(TRITON_TRAINING, call) or _conv_refusal(*inputs)
        if why is None and any(t.dtype == torch.float64 or not t.dtype.is_floating_point for t in call.aux):
            why = (f"the conv's parameters in {sorted({str(t.dtype) for t in call.aux})}: the fused training "
                   "kernels read float32, float16 or bfloat16")
    return why or triton_missing()


class _Plan:
    """One call's fixed arguments (not tensors), handed from the op to the autograd Function; ``power``: the
    §4.6 output scale's p (α = N^-p on the whitened part)."""

    def __init__(self, s: AttentionSettings, hw, grid, heads: int, tied: bool, use_triton: bool):
        self.s, self.hw, self.grid, self.heads, self.tied, self.use_triton = s, hw, grid, heads, tied, use_triton
        self.power = scale_power(s.norm, s.norm_scale)

    def alpha(self, n: int) -> float:
        return output_alpha(self.s.norm, self.power, float(n))


def _forward_triton(q, k, v, conv, plan: _Plan):
    from .landmarks_triton import landmark_solve_triton
    from .triton import streaming_triton

    s = plan.s
    marks, w, w_inv = landmark_solve_triton(q, plan.hw, plan.grid, s.bandwidth, s.kernel, s.ns_eps, s.iters)
    out, state = streaming_triton(q, k, v, marks, w_inv, s.bandwidth, s.kernel, s.norm, s.norm_eps, None, conv,
                                  save=True, scale_power=plan.power)
    return out, ForwardState(marks=marks, w=w, w_inv=w_inv, **state)


def _forward_torch(q, k, v, conv, plan: _Plan):
    s, out_dtype = plan.s, v.dtype
    q, k, v = float32_of(q, k, v)
    marks, w, w_inv = landmark_solve_reference(q, plan.hw, plan.grid, s.bandwidth, s.kernel, s.ns_eps, s.iters)
    st = forward_state(q, k, v, marks, w, w_inv, s.bandwidth, s.kernel, s.norm, s.norm_eps)
    out = output_of(q, st, s.bandwidth, s.kernel, s.norm, plan.alpha(q.shape[-2]))
    if conv is not None:
        out = out + value_conv_heads(v, conv)  # the weight in v's dtype
    return out.to(out_dtype), st


def _backward_triton(grad, q, k, v, st: ForwardState, conv, plan: _Plan, dq, dk, dv):
    from .backward_landmarks_triton import landmark_grad_triton, pool_grad_triton
    from .backward_rows_triton import row_grad_triton
    from .backward_stats_triton import key_grad_triton, query_grad_triton

    s, n = plan.s, q.shape[-2]
    alpha = plan.alpha(n)
    a = query_grad_triton(grad, q, v, st, s.bandwidth, s.kernel, s.norm, conv, alpha=alpha)
    b = key_grad_triton(k, v, st, a["pdm"], s.bandwidth, s.kernel, s.norm_eps) if whitens(s.norm) else None
    c = landmark_grad_triton(st, a, b, n, s.bandwidth, s.kernel, s.norm, None if conv is None else conv.weight,
                             alpha=alpha)
    pdl = row_grad_triton(grad, q, k, v, st, c, s.bandwidth, s.kernel, s.norm, s.norm_eps, conv, dq,
                          None if k is q else dk, dv, alpha=alpha)
    pool_grad_triton(dq, c["d_marks"], pdl, plan.hw, plan.grid)
    return c["dweight"], c["dbias"]


def _backward_torch(grad, q, k, v, st: ForwardState, conv, plan: _Plan, dq, dk, dv):
    s = plan.s
    grad, q, k, v = float32_of(grad, q, k, v)  # the reference reads the conv's weight in v's dtype
    g = streaming_backward_reference(grad, q, k, v, st, plan.hw, plan.grid, s.bandwidth, s.kernel, s.norm,
                                     s.norm_eps, conv, plan.power)
    dq.copy_(g["dq"])
    if k is not q:
        dk.copy_(g["dk"])
    dv.copy_(g["dv"])
    return g["dweight"], g["dbias"]


class _FusedCore(torch.autograd.Function):
    """qkv (B, N, P·C), weight, bias -> (B, N, C); the backward returns d qkv in one (B, N, P·C) tensor."""

    @staticmethod
    def forward(ctx, qkv, weight, bias, plan: _Plan):
        q, k, v, tokens = _views(qkv, plan.heads, plan.tied)
        conv = None if weight is None else ValueConv(tokens, plan.hw, weight, bias)
        with torch.autocast(qkv.device.type, enabled=False):  # the passes choose their dtypes (module docstring)
            out, st = (_forward_triton if plan.use_triton else _forward_torch)(q, k, v, conv, plan)
        ctx.plan, ctx.has_conv, ctx.has_bias = plan, weight is not None, bias is not None
        ctx.save_for_backward(qkv, weight, bias, *st)
        b, n, _ = qkv.shape
        return out.transpose(1, 2).reshape(b, n, -1)

    @staticmethod
    def backward(ctx, grad_out):
        qkv, weight, bias, *state = ctx.saved_tensors
        plan = ctx.plan
        st = ForwardState(*state)
        q, k, v, tokens = _views(qkv, plan.heads, plan.tied)
        conv = ValueConv(tokens, plan.hw, weight, bias) if ctx.has_conv else None
        b, n, c = grad_out.shape
        grad_out = grad_out.to(qkv.dtype)  # the passes read the gradient in qkv's dtype (the output's)
        grad = (grad_out if grad_out.stride(-1) == 1 else grad_out.contiguous()).view(b, n, plan.heads, -1)
        grad = grad.transpose(1, 2)
        dqkv = torch.empty_like(qkv, memory_format=torch.contiguous_format)
        dq, dk, dv, _ = _views(dqkv, plan.heads, plan.tied)
        run = _backward_triton if plan.use_triton else _backward_torch
        with torch.autocast(qkv.device.type, enabled=False):
            dweight, dbias = run(grad, q, k, v, st, conv, plan, dq, dk, dv)
        if dweight is not None:
            dweight = dweight.to(weight.dtype)
        if dbias is not None and ctx.has_bias:
            dbias = dbias.to(bias.dtype)
        return dqkv, dweight, (dbias if ctx.has_bias else None), None


def _run(use_triton: bool):
    def run(qkv, s, hw, grid, heads, tied, weight, bias):
        return _FusedCore.apply(qkv, weight, bias, _Plan(s, hw, grid, heads, tied, use_triton))

    return run


FUSED_TRAINING = fused_op(
    "fused_training", (_run(True), _triton_refusal), (_run(False), _refusal),
    "the fused passes' PyTorch specification, for tests: the layer's unfused path is faster here",
    signature="fused_training(qkv, settings, hw, grid, heads, tied, weight, bias): qkv (B, N, P·C) -> (B, N, C) "
              "heads merged + DWConv(V); None from 'steps' = the layer's unfused path")

"""The op ``landmark_solve``: the landmarks, W and W⁺ of the Nyström core in one launch (docs/KERNELS.md,
"The fused landmark solve"; the formulas are docs/DESIGN.md §2.1 (pooling), §1 (the kernel) and §3
(Newton–Schulz)).

    landmark_solve(qs, ks, vv, hw, grid, settings, mask, prefix) -> (L, W, W⁺), or None

is asked by ``ops/nystrom.py``'s ``attention_core`` before ``nystrom()``: instead of the pooling (two
products), W = k(L, L), P = W + eps·I and the Newton–Schulz solve as separate ops (5 launches on a GPU),
one program per (batch, head) matrix computes them on chip. L (B, H, m, d) (the streaming passes read it),
W and W⁺ (B, H, m, m), all float32. Backends, in the order "auto" tries them:

- ``triton`` (``landmarks_triton.py``): CUDA tensors (or ``TRITON_INTERPRET=1`` when forced), forward only;
- ``torch``: ``pool_landmarks``, ``laplace_kernel``, ``regularise`` and the reference iteration
  ``newton_schulz_iterate_reference``, the kernel's test specification; never chosen automatically;
- ``steps`` (the reference of the op): returns None, and the core pools and solves by its steps
  (``grid_landmarks``, ``Steps.inverse``), which serve everything.

A call that may need a gradient never reaches the registry (the steps have the backward), nor does one
while torch.compile traces. What the solve backends serve is declared (``limits.SOLVE``,
``limits.TRITON_SOLVE``, docs/DESIGN.md §6.3): Newton–Schulz (the ablation solvers run the steps), no key
padding mask (masked pooling, §2.5), m <= 64, d <= 128, forward only; ``triton`` also CUDA tensors in float32,
float16 or bfloat16 and a family with a Triton profile. Both refuse graph tracing or a dispatch mode (which must
see the ops), prefix tokens (§2.7), a 1-D sequence or graph sizes. They serve CUDA-graph stream capture (the kernel makes no host synchronisation).
"""

from __future__ import annotations

import torch

from ..capabilities import Call, triton_missing, unserved
from ..kernel import laplace_kernel
from ..newton_schulz.naive import newton_schulz_iterate_reference, regularise
from ..pooling import pool_landmarks
from ..settings import AttentionSettings
from .gates import eager_only, float32_of, fused_op, needs_grad as _needs_grad
from .limits import SOLVE, TRITON_SOLVE

__all__ = ["LANDMARK_SOLVE", "landmark_solve", "landmark_solve_reference"]


def landmark_solve(qs: torch.Tensor, ks: torch.Tensor, vv: torch.Tensor, hw, grid, s: AttentionSettings,
                   mask: torch.Tensor | None = None, prefix: int = 0):
    """(L (B, H, m, d), W (B, H, m, m), W⁺ (B, H, m, m)) by the selected backend, or None for the steps.

    qs, ks (B, H, N, d), vv (B, H, N, e): the core's padded compute-dtype factors (ks and vv only for the
    gradient check: the solve reads qs); hw the (gh, gw) token grid, grid the (lh, lw) landmark grid
    (m = lh·lw); mask (B, N) or None; prefix the tokens before the grid.

    A call that may need a gradient, or one while torch.compile traces, returns None without asking the
    registry (as ``streaming_nystrom``): the op is forward-only, so such a call is no call of the op."""
    if torch.compiler.is_compiling() or _needs_grad(qs, ks, vv):
        return None
    return LANDMARK_SOLVE(qs, ks, vv, hw, grid, s, mask, prefix)


def landmark_solve_reference(qs: torch.Tensor, hw, grid, bandwidth: float, kernel: str, eps: float, iters: int):
    """The fused solve's specification from the existing ops: L = ``pool_landmarks`` (§2.1), W =
    ``laplace_kernel``(L, L), W⁺ = the reference Newton–Schulz iteration on ``regularise``(W, eps) (§3).
    qs (B, H, N, d) -> (L (B, H, m, d), W, W⁺ (B, H, m, m)), in qs's dtype (float64 for the tests' truth)."""
    marks = pool_landmarks(qs, hw, grid)
    w = laplace_kernel(marks, marks, bandwidth, kernel)
    return marks, w, newton_schulz_iterate_reference(regularise(w, eps), iters)


def _int_grid(pair) -> bool:
    return isinstance(pair, tuple) and len(pair) == 2 and all(type(x) is int for x in pair)


def _call(qs, ks, vv, hw, grid, s, mask, prefix) -> Call:
    """The op's arguments as the ``Call`` its backends' declarations are checked against: the solve reads qs; ks
    and vv count for the gradient (and the device); m only for a landmark grid of Python ints."""
    return Call((qs,), kernel=s.kernel, m=grid[0] * grid[1] if _int_grid(grid) else None, d=qs.shape[-1],
                masked=mask is not None, solver=s.solver, aux=(ks, vv))


def _layout(qs, ks, vv, hw, grid, s, mask, prefix) -> str | None:
    """What no declaration says: the capture mode, and the token layout the kernel pools (a 2-D grid of Python
    ints after no prefix)."""
    why = eager_only(SOLVE.what)
    if why is not None:
        return why
    if prefix:
        return f"{prefix} prefix tokens: pooling the grid after them (docs/DESIGN.md §2.7) runs the steps"
    if hw is None:
        return "a 1-D sequence: the fused landmark solve pools a 2-D token grid"
    if not (_int_grid(hw) and _int_grid(grid)):
        return "graph sizes (hw or the landmark grid not Python ints): the steps hold the shape arithmetic"
    if hw[0] * hw[1] != qs.shape[-2]:
        return f"hw={hw} is not a grid of the N={qs.shape[-2]} tokens"
    return None


def _solve_refusal(*inputs) -> str | None:
    return _layout(*inputs) or unserved(SOLVE, _call(*inputs))


def _triton_refusal(*inputs) -> str | None:
    return _layout(*inputs) or unserved(TRITON_SOLVE, _call(*inputs)) or triton_missing()


def _triton(qs, ks, vv, hw, grid, s, mask, prefix):
    from .landmarks_triton import landmark_solve_triton

    return landmark_solve_triton(qs, hw, grid, s.bandwidth, s.kernel, s.ns_eps, s.iters)


def _torch(qs, ks, vv, hw, grid, s, mask, prefix):
    qs, = float32_of(qs)  # as the Triton kernel reads half q: float32 inside
    return landmark_solve_reference(qs, hw, grid, s.bandwidth, s.kernel, s.ns_eps, s.iters)


LANDMARK_SOLVE = fused_op(
    "landmark_solve", (_triton, _triton_refusal), (_torch, _solve_refusal),
    "the fused solve's PyTorch specification, for tests: the steps are the same ops",
    signature="landmark_solve(qs, ks, vv, hw, grid, settings, mask, prefix): qs (B, H, N, d) -> (L, W, W⁺); "
              "None from 'steps' = pool and solve by the steps")

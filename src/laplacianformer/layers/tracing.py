"""torch.fx support of the layers and models (docs/ARCHITECTURE.md, "Scripting and tracing"); TorchScript is
``layers/scripting.py``'s.

- ``is_fx_tracing()``: True while ``torch.fx`` traces symbolically. Python-only work (argument checks that
  branch on shapes, activation checkpointing, fused and in-place fast paths) runs under
  ``if not is_fx_tracing():``, so a traced graph computes what eager mode computes, without shape-dependent
  Python control flow. It is ``@torch.jit.unused``: a model's scripted ``forward`` may name it after the
  TorchScript check (``models/laplacianformer.py``), and TorchScript compiles the right side of an ``and``.
- ``NOTRACE_FUNCTIONS``: the functions a traced graph keeps as one call (a leaf) instead of tracing
  into them: the attention operator and its landmark rule, padding by traced sizes. Each module that
  calls one also declares it with ``torch.fx.wrap`` at module level, so plain ``torch.fx.symbolic_trace``
  keeps them as leaves; timm's tracer learns them from ``register_with_timm_fx`` (called lazily by the
  model registration when timm is installed).
- ``fx_tracer_kwargs()``: tracer arguments (``autowrap_functions``) for tracers that take them, e.g.
  ``torchvision.models.feature_extraction.create_feature_extractor(..., tracer_kwargs=fx_tracer_kwargs())``.
"""

from typing import Callable, List

import torch

__all__ = ["NOTRACE_FUNCTIONS", "fx_tracer_kwargs", "is_fx_tracing", "notrace", "register_with_timm_fx"]

NOTRACE_FUNCTIONS: List[Callable] = []


def notrace(fn: Callable) -> Callable:
    """Record ``fn`` as an FX leaf (see the module docstring); the caller's module must also call
    ``torch.fx.wrap("<name>")`` at its top level. Returns ``fn`` unchanged."""
    if fn not in NOTRACE_FUNCTIONS:
        NOTRACE_FUNCTIONS.append(fn)
    return fn


try:
    from torch.fx._symbolic_trace import is_fx_symbolic_tracing as _fx_flag
except ImportError:  # older torch: the flag without the torch.compile distinction
    from torch.fx._symbolic_trace import _get_is_fx_tracing as _fx_flag


@torch.jit.unused
def is_fx_tracing() -> bool:
    """True while ``torch.fx`` traces symbolically (not under torch.compile/export). Not TorchScript: a
    scripted forward calls it only on a branch TorchScript drops."""
    return bool(_fx_flag())


def fx_tracer_kwargs() -> dict:
    """``dict(autowrap_functions=[...])``: the package's FX leaf functions, for a tracer's kwargs."""
    return dict(autowrap_functions=list(NOTRACE_FUNCTIONS))


def register_with_timm_fx() -> None:
    """Declare the leaf functions to timm's FX helpers (``timm.layers.register_notrace_function``).

    Imports timm: call it only when timm is installed (``models.register_timm`` does)."""
    from timm.layers import register_notrace_function

    for fn in NOTRACE_FUNCTIONS:
        register_notrace_function(fn)

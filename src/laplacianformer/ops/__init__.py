"""Operators of docs/DESIGN.md §1–§4: kernel primitives, regularised inverse, normalisation, attention.

Backend selection (docs/DESIGN.md §6): every op dispatches through one registry (``dispatch.py``) and
reads one runtime (``_runtime.py``): ``use(...)`` forces backends per op in a ``with`` block,
``explain(op, *inputs)`` says which backend serves one call, ``explain_all(q, k, v, hw=..., landmarks=...)``
every call of the attention operator. ``laplacian_attention_recompute`` is the operator on the projections of
x with the lean recompute for the backward (docs/DESIGN.md §5.5). ``AttentionSettings`` holds the operator's
settings, validated once (``settings.py``); ``laplacian_attention(..., settings=s)`` takes one.
"""

from ._runtime import capturing, configure, use
from .attention import default_bandwidth, explain_all, laplacian_attention
from .dispatch import explain, op_names
from .kernel import laplace_kernel, laplace_kernel_matmul
from .newton_schulz import conjugate_gradient_inverse, newton_schulz_pinv, pinv_residual, regularised_inverse
from .recompute import laplacian_attention_recompute
from .settings import OPERATOR_SETTINGS, AttentionSettings

__all__ = [
    "laplacian_attention",
    "laplacian_attention_recompute",
    "AttentionSettings",
    "OPERATOR_SETTINGS",
    "default_bandwidth",
    "laplace_kernel",
    "laplace_kernel_matmul",
    "newton_schulz_pinv",
    "regularised_inverse",
    "conjugate_gradient_inverse",
    "pinv_residual",
    "use",
    "configure",
    "capturing",
    "explain",
    "explain_all",
    "op_names",
]

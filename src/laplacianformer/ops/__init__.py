"""Operators of DESIGN.md §1–§4: kernel primitives, regularised inverse, normalisation, attention."""

from .attention import laplacian_attention
from .kernel import laplace_kernel, laplace_kernel_matmul
from .newton_schulz import conjugate_gradient_inverse, newton_schulz_pinv, pinv_residual, regularised_inverse

__all__ = [
    "laplacian_attention",
    "laplace_kernel",
    "laplace_kernel_matmul",
    "newton_schulz_pinv",
    "regularised_inverse",
    "conjugate_gradient_inverse",
    "pinv_residual",
]

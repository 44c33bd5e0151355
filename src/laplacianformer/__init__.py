"""LaplacianFormer: linear-cost Laplacian-kernel Nyström attention for vision (arXiv 2604.20368).

    from laplacianformer import laplacian_attention, LaplacianAttention
"""

from .layers import LaplacianAttention
from .ops import laplace_kernel, laplace_kernel_matmul, laplacian_attention, newton_schulz_pinv, regularised_inverse

__version__ = "0.1.0"

__all__ = [
    "LaplacianAttention",
    "laplacian_attention",
    "laplace_kernel",
    "laplace_kernel_matmul",
    "newton_schulz_pinv",
    "regularised_inverse",
]

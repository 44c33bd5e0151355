"""LaplacianFormer: linear-cost Laplacian-kernel Nyström attention for vision (arXiv 2604.20368).

    from laplacianformer import laplacian_attention, LaplacianAttention
    model = laplacianformer.create_model("laplacianformer_tiny", num_classes=10)
    laplacianformer.save_pretrained(model, "out/tiny")
    model = laplacianformer.from_pretrained("out/tiny")        # or a training run directory
    fast = laplacianformer.cuda_graphed(model.cuda().eval(), x)  # inference replayed from a CUDA graph
    laplacianformer.retain_freed_memory()                      # CPU inference: glibc keeps freed memory mapped
"""

from .checkpoint import CheckpointError, load_checkpoint, save_checkpoint, save_weights
from .heap import retain_freed_memory
from .hub import from_pretrained, save_pretrained
from .layers import LaplacianAttention
from .models import create_model, format_model_info, list_models, model_info  # registers with timm once timm is imported
from .models.cuda_graph import cuda_graphed
from .ops import laplace_kernel, laplace_kernel_matmul, laplacian_attention, newton_schulz_pinv, regularised_inverse

__version__ = "0.2.0"

__all__ = [
    "create_model",
    "cuda_graphed",
    "from_pretrained",
    "save_pretrained",
    "list_models",
    "model_info",
    "format_model_info",
    "load_checkpoint",
    "save_checkpoint",
    "save_weights",
    "CheckpointError",
    "LaplacianAttention",
    "laplacian_attention",
    "laplace_kernel",
    "laplace_kernel_matmul",
    "newton_schulz_pinv",
    "regularised_inverse",
    "retain_freed_memory",
]

"""nn.Modules, one per attention mechanism."""

from .laplacian_attention import LaplacianAttention, effective_landmarks

__all__ = ["LaplacianAttention", "effective_landmarks"]

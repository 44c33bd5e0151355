"""nn.Modules, one per attention mechanism, and the token-grid convolution helpers."""

from .grid_conv import conv2d_channels_last, conv_tokens, grid_to_tokens, tokens_to_grid
from .laplacian_attention import LaplacianAttention

__all__ = [
    "LaplacianAttention",
    "conv2d_channels_last",
    "conv_tokens",
    "grid_to_tokens",
    "tokens_to_grid",
]

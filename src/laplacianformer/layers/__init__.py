"""nn.Modules: one per attention mechanism, the token mixers by name, stochastic depth and the token-grid
convolution helpers."""

from .drop import DropPath, drop_path
from .grid_conv import conv2d_channels_last, conv_tokens, grid_to_tokens, tokens_to_grid
from .laplacian_attention import LaplacianAttention
from .spatial_reduction_attention import SpatialReductionAttention
from .token_mixer import ATTENTIONS, check_token_mixer, get_token_mixer

__all__ = [
    "ATTENTIONS",
    "DropPath",
    "LaplacianAttention",
    "SpatialReductionAttention",
    "check_token_mixer",
    "conv2d_channels_last",
    "conv_tokens",
    "drop_path",
    "get_token_mixer",
    "grid_to_tokens",
    "tokens_to_grid",
]

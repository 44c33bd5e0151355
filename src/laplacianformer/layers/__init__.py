"""nn.Modules: one per attention mechanism, the token mixers by name, stochastic depth, the token-grid
convolution helpers, the torch.fx support (``tracing``) and the one TorchScript adapter (``scripting``)."""

from .drop import DropPath, drop_path
from .grid_conv import GridConv2d, conv2d_channels_last, conv_tokens, grid_to_tokens, tokens_to_grid
from .laplacian_attention import LaplacianAttention
from .spatial_reduction_attention import SpatialReductionAttention
from .token_mixer import ATTENTIONS, ATTN_PRESETS, check_token_mixer, get_token_mixer, preset_kwargs
from .tracing import NOTRACE_FUNCTIONS, fx_tracer_kwargs, is_fx_tracing

__all__ = [
    "ATTENTIONS",
    "ATTN_PRESETS",
    "DropPath",
    "GridConv2d",
    "NOTRACE_FUNCTIONS",
    "LaplacianAttention",
    "SpatialReductionAttention",
    "check_token_mixer",
    "conv2d_channels_last",
    "conv_tokens",
    "drop_path",
    "fx_tracer_kwargs",
    "get_token_mixer",
    "grid_to_tokens",
    "is_fx_tracing",
    "preset_kwargs",
    "tokens_to_grid",
]

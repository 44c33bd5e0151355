"""Baseline attentions for comparison with Laplacian attention (benchmarks and ablations).

Each mechanism has a functional op on (B, H, N, d) tensors, its dense definition (the test reference)
and an nn.Module with the ``LaplacianAttention`` interface ``forward(x: (B, N, C), hw, key_padding_mask)
-> (B, N, C)``; every op and module takes a (B, N) ``key_padding_mask`` (docs/DESIGN.md §2.5):

- softmax: ``softmax_attention`` (SDPA) / ``SoftmaxAttention``
- Performer FAVOR+: ``performer_attention`` / ``PerformerAttention``
- Nyströmformer: ``nystrom_attention`` / ``NystromAttention``
- SOFT (Gaussian kernel, tied keys): ``soft_attention`` / ``SoftAttention``
"""

from ..layers.token_attention import TokenAttention
from .nystromformer import NystromAttention, iterative_pinv, nystrom_attention, nystrom_attention_dense, segment_means
from .performer import (
    PerformerAttention,
    favor_features,
    orthogonal_random_features,
    performer_attention,
    performer_attention_dense,
)
from .soft import SoftAttention, soft_attention, soft_attention_dense, soft_bandwidth
from .softmax import SoftmaxAttention, softmax_attention, softmax_attention_naive

__all__ = [
    "TokenAttention",
    "SoftmaxAttention",
    "softmax_attention",
    "softmax_attention_naive",
    "PerformerAttention",
    "performer_attention",
    "performer_attention_dense",
    "orthogonal_random_features",
    "favor_features",
    "NystromAttention",
    "nystrom_attention",
    "nystrom_attention_dense",
    "iterative_pinv",
    "segment_means",
    "SoftAttention",
    "soft_attention",
    "soft_attention_dense",
    "soft_bandwidth",
]

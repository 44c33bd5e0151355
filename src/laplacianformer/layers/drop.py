"""Stochastic depth (per-sample drop of a residual branch), as used by the model blocks (docs/DESIGN.md §5)."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["drop_path", "DropPath"]


def drop_path(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Zero whole samples of x (B, ...) with probability p and rescale the rest by 1 / (1 - p)."""
    if p == 0.0 or not training:
        return x
    keep = 1.0 - p
    shape = [x.shape[0]] + [1] * (x.dim() - 1)  # a list: scriptable and traceable
    mask = x.new_empty(shape).bernoulli_(keep)
    return x * mask / keep


class DropPath(nn.Module):
    """Module form of ``drop_path`` (per-sample stochastic depth)."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        self.p = p

    def extra_repr(self) -> str:
        return f"p={self.p}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return drop_path(x, self.p, self.training)

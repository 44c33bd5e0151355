"""Exponential moving average of model weights (as in DeiT's model EMA), kept in float32."""

from __future__ import annotations

import torch
from torch import nn


class ModelEma:
    """ema = decay * ema + (1 - decay) * weights after every step; buffers are copied.

    ``state_dict()`` / ``load_state_dict()`` hold tensors only, so they go into a weights-only checkpoint.
    """

    def __init__(self, model: nn.Module, decay: float = 0.999) -> None:
        self.decay = decay
        self.shadow = {k: v.detach().clone().float() if v.is_floating_point() else v.detach().clone()
                       for k, v in model.state_dict().items()}

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        for k, v in model.state_dict().items():
            s = self.shadow[k]
            if v.is_floating_point():
                s.mul_(self.decay).add_(v.detach().float(), alpha=1.0 - self.decay)
            else:
                s.copy_(v)

    def copy_to(self, model: nn.Module) -> None:
        """Loads the averaged weights into ``model`` (cast to its dtypes)."""
        own = model.state_dict()
        model.load_state_dict({k: v.to(own[k].dtype) for k, v in self.shadow.items()})

    def state_dict(self) -> dict:
        return {"decay": self.decay, "shadow": self.shadow}

    def load_state_dict(self, state: dict) -> None:
        self.decay = float(state["decay"])
        missing = set(self.shadow) ^ set(state["shadow"])
        if missing:
            raise ValueError(f"ema: checkpoint EMA keys differ from the model's ({sorted(missing)[:3]} ...)")
        for k, v in state["shadow"].items():
            self.shadow[k].copy_(v)

"""LaplacianFormer backbones for torchvision detectors: an FPN on the hierarchical stages (DESIGN.md §5, COCO).

    from laplacianformer.detection import retinanet, mask_rcnn
    model = mask_rcnn("laplacianformer_tiny", num_classes=91)     # torchvision MaskRCNN
    model = retinanet("laplacianformer_tiny", num_classes=91)     # torchvision RetinaNet

The backbone returns the NCHW maps of the chosen stages (strides 4/8/16/32 with the default stem);
torchvision's FeaturePyramidNetwork turns them into ``out_channels``-wide maps named "0", "1", ... plus
"pool" (Mask R-CNN, as torchvision's ResNet-FPN) or "p6", "p7" (RetinaNet). The Laplacian attention
adapts its landmark grid to every input size, so detector resolutions need no change to the backbone.
torchvision is imported only when these builders are called.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch
from torch import nn

from ..models import LaplacianFormer, create_model

__all__ = ["LaplacianFormerFPN", "fpn_backbone", "retinanet", "mask_rcnn"]


class LaplacianFormerFPN(nn.Module):
    """A LaplacianFormer body + torchvision FPN.  x: (B, C, H, W) -> OrderedDict of (B, out_channels, h, w).

    Args:
        body: a LaplacianFormer; its classifier is removed.
        out_indices: stages fed to the FPN (0-based; stride 4·2^i with the default stem).
        out_channels: FPN width (attribute ``out_channels``, which torchvision detectors read).
        extra_blocks: a torchvision ``ExtraFPNBlock`` (LastLevelMaxPool, LastLevelP6P7) or None.
    """

    def __init__(
        self, body: LaplacianFormer, out_indices: Sequence[int] = (0, 1, 2, 3), out_channels: int = 256,
        extra_blocks: nn.Module | None = None,
    ) -> None:
        super().__init__()
        from torchvision.ops import FeaturePyramidNetwork

        if not isinstance(body, LaplacianFormer):
            raise TypeError(f"body: expected a LaplacianFormer, got {type(body).__name__}")
        out_indices = [int(i) for i in out_indices]
        if not out_indices or any(not 0 <= i < len(body.stages) for i in out_indices) or sorted(set(out_indices)) != out_indices:
            raise ValueError(f"out_indices: expected increasing stage indices in [0, {len(body.stages)}), got {out_indices}")
        body.prune_intermediate_layers(out_indices, prune_head=True)
        self.body = body
        self.out_indices = out_indices
        self.strides = [body.feature_info[i]["reduction"] for i in out_indices]
        self.out_channels = out_channels
        self.fpn = FeaturePyramidNetwork(
            [body.feature_info[i]["num_chs"] for i in out_indices], out_channels, extra_blocks=extra_blocks
        )

    def forward(self, x: torch.Tensor) -> "OrderedDict[str, torch.Tensor]":
        maps = self.body.forward_intermediates(x, indices=self.out_indices, intermediates_only=True)
        return self.fpn(OrderedDict((str(i), m) for i, m in enumerate(maps)))


def fpn_backbone(
    name_or_model, *, out_indices: Sequence[int] = (0, 1, 2, 3), out_channels: int = 256, extra: str = "maxpool",
    **model_kwargs,
) -> LaplacianFormerFPN:
    """Build ``LaplacianFormerFPN`` from a registered name (``create_model(name, num_classes=0, ...)``) or a model.

    ``extra``: "maxpool" (one extra stride-2 level, Mask R-CNN), "p6p7" (two extra levels from P5,
    RetinaNet) or "none".
    """
    from torchvision.ops.feature_pyramid_network import LastLevelMaxPool, LastLevelP6P7

    if extra not in ("maxpool", "p6p7", "none"):
        raise ValueError(f"extra: expected 'maxpool', 'p6p7' or 'none', got {extra!r}")
    body = name_or_model if isinstance(name_or_model, LaplacianFormer) else create_model(name_or_model, num_classes=0, **model_kwargs)
    blocks = {"maxpool": LastLevelMaxPool(), "p6p7": LastLevelP6P7(out_channels, out_channels), "none": None}[extra]
    return LaplacianFormerFPN(body, out_indices, out_channels, blocks)


def retinanet(name_or_model, num_classes: int, *, out_channels: int = 256, model_kwargs: dict | None = None, **detector_kwargs):
    """torchvision RetinaNet on stages 1-3 (strides 8/16/32) + P6/P7, as torchvision's ResNet-50-FPN variant.

    ``model_kwargs`` go to ``create_model`` (attn, attn_kwargs, drop_path_rate, ...); ``detector_kwargs``
    to ``RetinaNet`` (min_size, max_size, image_mean, anchor_generator, ...).
    """
    from torchvision.models.detection import RetinaNet

    backbone = fpn_backbone(name_or_model, out_indices=(1, 2, 3), out_channels=out_channels, extra="p6p7", **(model_kwargs or {}))
    return RetinaNet(backbone, num_classes, **detector_kwargs)


def mask_rcnn(name_or_model, num_classes: int, *, out_channels: int = 256, model_kwargs: dict | None = None, **detector_kwargs):
    """torchvision MaskRCNN on all four stages (strides 4-32) + a max-pool level, as its ResNet-FPN variant."""
    from torchvision.models.detection import MaskRCNN

    backbone = fpn_backbone(name_or_model, out_indices=(0, 1, 2, 3), out_channels=out_channels, extra="maxpool", **(model_kwargs or {}))
    return MaskRCNN(backbone, num_classes, **detector_kwargs)

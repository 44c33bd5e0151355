"""LaplacianFormer backbones for torchvision detectors: an FPN on the hierarchical stages (docs/DESIGN.md §5).

    from laplacianformer.detection import retinanet, mask_rcnn
    model = mask_rcnn("laplacianformer_tiny", num_classes=91)     # torchvision MaskRCNN
    model = retinanet("laplacianformer_tiny", num_classes=91)     # torchvision RetinaNet

The backbone returns the NCHW maps of the chosen stages (strides 4/8/16/32 with the default stem);
torchvision's FeaturePyramidNetwork turns them into ``out_channels``-wide maps named "0", "1", ... plus
"pool" (Mask R-CNN, as torchvision's ResNet-FPN) or "p6", "p7" (RetinaNet). The Laplacian attention
adapts its landmark grid to every input size, so detector resolutions need no change to the backbone.
torchvision is imported only when these builders are called. Unknown keyword arguments raise a
``ValueError`` naming them (torchvision itself would accept and ignore them). ``resnet18`` (and the other
torchvision ResNets) build the reference ResNet-FPN with trainable BatchNorm and no pretrained weights.
See docs/DETECTION.md.
"""

from __future__ import annotations

from collections import OrderedDict
import inspect
from collections.abc import Mapping, Sequence

import torch
from torch import nn

from ..models import LaplacianFormer, create_model

__all__ = ["LaplacianFormerFPN", "fpn_backbone", "retinanet", "mask_rcnn", "build_detector", "DETECTORS", "REFERENCE_BACKBONES"]

DETECTORS = ("retinanet", "maskrcnn")
REFERENCE_BACKBONES = ("resnet18", "resnet34", "resnet50")
"""torchvision ResNets accepted as backbone names (random initialisation: nothing is downloaded)."""


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


def _check_kwargs(where: str, given: Mapping, allowed) -> None:
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        raise ValueError(f"{where}: unknown keyword argument(s) {unknown}; allowed: {sorted(allowed)}")


def _init_params(*classes) -> set[str]:
    """Named ``__init__`` parameters of ``classes`` (``self``, ``backbone``, ``num_classes``, ``**kwargs`` excluded)."""
    out: set[str] = set()
    for cls in classes:
        for name, p in inspect.signature(cls.__init__).parameters.items():
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and name not in ("self", "backbone", "num_classes"):
                out.add(name)
    return out


def _extra_block(extra: str, out_channels: int):
    from torchvision.ops.feature_pyramid_network import LastLevelMaxPool, LastLevelP6P7

    if extra not in ("maxpool", "p6p7", "none"):
        raise ValueError(f"extra: expected 'maxpool', 'p6p7' or 'none', got {extra!r}")
    return {"maxpool": LastLevelMaxPool, "p6p7": lambda: LastLevelP6P7(out_channels, out_channels),
            "none": lambda: None}[extra]()


def _resnet_fpn(name: str, out_indices: Sequence[int], out_channels: int, extra: str, model_kwargs: Mapping) -> nn.Module:
    """torchvision ResNet-FPN from scratch: trainable BatchNorm (frozen statistics of an untrained net would
    be the identity), stages ``out_indices`` (0-based: layer1..layer4, strides 4..32)."""
    import torchvision
    from torchvision.models.detection.backbone_utils import BackboneWithFPN

    _check_kwargs(f"backbone {name!r}", model_kwargs, ())
    body = getattr(torchvision.models, name)(weights=None, norm_layer=nn.BatchNorm2d)
    widths = [64, 128, 256, 512] if name in ("resnet18", "resnet34") else [256, 512, 1024, 2048]
    out_indices = [int(i) for i in out_indices]
    return_layers = {f"layer{i + 1}": str(k) for k, i in enumerate(out_indices)}
    return BackboneWithFPN(body, return_layers, [widths[i] for i in out_indices], out_channels,
                           extra_blocks=_extra_block(extra, out_channels))


def fpn_backbone(
    name_or_model, *, out_indices: Sequence[int] = (0, 1, 2, 3), out_channels: int = 256, extra: str = "maxpool",
    **model_kwargs,
) -> nn.Module:
    """An FPN backbone: ``LaplacianFormerFPN`` from a registered name (``create_model(name, num_classes=0,
    **model_kwargs)``) or a ``LaplacianFormer``; a torchvision ``BackboneWithFPN`` for ``REFERENCE_BACKBONES``.

    ``extra``: "maxpool" (one extra stride-2 level, Mask R-CNN), "p6p7" (two extra levels from P5,
    RetinaNet) or "none". ``model_kwargs`` not accepted by ``LaplacianFormer`` raise ``ValueError``.
    """
    if isinstance(name_or_model, str) and name_or_model in REFERENCE_BACKBONES:
        return _resnet_fpn(name_or_model, out_indices, out_channels, extra, model_kwargs)
    blocks = _extra_block(extra, out_channels)
    if isinstance(name_or_model, LaplacianFormer):
        if model_kwargs:
            raise ValueError(f"model_kwargs: {sorted(model_kwargs)} given with a built model; they apply to a name only")
        body = name_or_model
    else:
        allowed = _init_params(LaplacianFormer) - {"num_classes"}
        _check_kwargs("model_kwargs", model_kwargs, allowed)
        body = create_model(name_or_model, num_classes=0, **model_kwargs)
    return LaplacianFormerFPN(body, out_indices, out_channels, blocks)


def _detector_kwargs(cls_names: Sequence[str]) -> set[str]:
    from torchvision.models.detection import transform
    import torchvision.models.detection as tvd

    classes = [getattr(tvd, n) for n in cls_names] + [transform.GeneralizedRCNNTransform]
    return _init_params(*classes)


def retinanet(name_or_model, num_classes: int, *, out_channels: int = 256, model_kwargs: dict | None = None, **detector_kwargs):
    """torchvision RetinaNet on stages 1-3 (strides 8/16/32) + P6/P7, as torchvision's ResNet-50-FPN variant.

    ``model_kwargs`` go to ``create_model`` (attn, attn_kwargs, drop_path_rate, ...); ``detector_kwargs``
    to ``RetinaNet`` (min_size, max_size, image_mean, anchor_generator, ...). Unknown keys raise ValueError.
    """
    from torchvision.models.detection import RetinaNet

    _check_kwargs("retinanet", detector_kwargs, _detector_kwargs(["RetinaNet"]))
    backbone = fpn_backbone(name_or_model, out_indices=(1, 2, 3), out_channels=out_channels, extra="p6p7", **(model_kwargs or {}))
    return RetinaNet(backbone, num_classes, **detector_kwargs)


def mask_rcnn(name_or_model, num_classes: int, *, out_channels: int = 256, model_kwargs: dict | None = None, **detector_kwargs):
    """torchvision MaskRCNN on all four stages (strides 4-32) + a max-pool level, as its ResNet-FPN variant.

    Unknown ``detector_kwargs`` (checked against MaskRCNN, FasterRCNN and its transform) raise ValueError."""
    from torchvision.models.detection import MaskRCNN

    _check_kwargs("mask_rcnn", detector_kwargs, _detector_kwargs(["MaskRCNN", "FasterRCNN"]))
    backbone = fpn_backbone(name_or_model, out_indices=(0, 1, 2, 3), out_channels=out_channels, extra="maxpool", **(model_kwargs or {}))
    return MaskRCNN(backbone, num_classes, **detector_kwargs)


def build_detector(
    detector: str, backbone: str, num_classes: int, *, img_size: int, fpn_channels: int = 256,
    backbone_kwargs: Mapping | None = None, **detector_kwargs,
) -> nn.Module:
    """``retinanet``/``mask_rcnn`` by name with the transform's min_size = max_size = ``img_size`` (the long
    side of every image is resized to ``img_size``). ``num_classes`` counts the background (K + 1)."""
    if detector not in DETECTORS:
        raise ValueError(f"detector: expected one of {list(DETECTORS)}, got {detector!r}")
    build = retinanet if detector == "retinanet" else mask_rcnn
    return build(backbone, num_classes, out_channels=fpn_channels, model_kwargs=dict(backbone_kwargs or {}),
                 min_size=img_size, max_size=img_size, **detector_kwargs)

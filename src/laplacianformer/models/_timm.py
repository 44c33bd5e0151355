"""Registers the LaplacianFormer family with timm (imported only when timm is installed).

After ``import laplacianformer`` (which imports this module when timm is importable):

    timm.create_model("laplacianformer_tiny", num_classes=10, drop_path_rate=0.1)
    timm.create_model("laplacianformer_tiny", features_only=True, out_indices=(1, 2, 3))

Every ``registry.MODEL_CONFIGS`` name is registered with its entry point and pretrained cfg from
``models/laplacianformer.py`` (``entry_points``, ``default_cfgs``). No pretrained weights exist (the paper released none);
the cfgs carry the preprocessing (ImageNet mean/std, 224² bicubic) and the module names timm uses to
adapt the stem and the head.
"""

from __future__ import annotations

from timm.models import register_model

from .laplacianformer import entry_points

__all__: list[str] = []

for _entry in entry_points.values():
    register_model(_entry)

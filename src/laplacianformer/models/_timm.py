"""timm entry points for the LaplacianFormer family (imported only when timm is installed).

After ``import laplacianformer`` (which imports this module when timm is importable):

    timm.create_model("laplacianformer_tiny", num_classes=10, drop_path_rate=0.1)
    timm.create_model("laplacianformer_tiny", features_only=True, out_indices=(1, 2, 3))

No pretrained weights exist (the paper released none); the default configs carry the preprocessing
(ImageNet mean/std, 224² bicubic) and the module names timm uses to adapt the stem and the head.
"""

from __future__ import annotations

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model

from .laplacianformer import LaplacianFormer, checkpoint_filter_fn
from .registry import MODEL_CONFIGS

__all__: list[str] = []


def _create_laplacianformer(variant: str, pretrained: bool = False, **kwargs) -> LaplacianFormer:
    out_indices = kwargs.pop("out_indices", (0, 1, 2, 3))
    return build_model_with_cfg(
        LaplacianFormer,
        variant,
        pretrained,
        pretrained_filter_fn=checkpoint_filter_fn,
        feature_cfg=dict(flatten_sequential=True, out_indices=out_indices),
        **kwargs,
    )


def _cfg(**kwargs) -> dict:
    return {
        "url": "", "num_classes": 1000, "input_size": (3, 224, 224), "pool_size": (7, 7),
        "crop_pct": 0.9, "interpolation": "bicubic", "mean": IMAGENET_DEFAULT_MEAN, "std": IMAGENET_DEFAULT_STD,
        "first_conv": "patch_embed.proj", "classifier": "head", "fixed_input_size": False, "license": "mit",
        "paper_ids": "arXiv:2604.20368", "paper_name": "LaplacianFormer: Rethinking Linear Attention with Laplacian Kernel",
        **kwargs,
    }


default_cfgs = generate_default_cfgs({f"{name}.untrained": _cfg() for name in MODEL_CONFIGS})


def _entry(name: str, pretrained: bool = False, **kwargs) -> LaplacianFormer:
    return _create_laplacianformer(name, pretrained=pretrained, **dict(MODEL_CONFIGS[name], **kwargs))


@register_model
def laplacianformer_micro(pretrained: bool = False, **kwargs) -> LaplacianFormer:
    """Small CPU configuration (not a paper size): widths 32-256, depths 1/1/2/1."""
    return _entry("laplacianformer_micro", pretrained, **kwargs)


@register_model
def laplacianformer_tiny(pretrained: bool = False, **kwargs) -> LaplacianFormer:
    """Paper Tiny (12.1M params, 2.1 GMACs at 224²)."""
    return _entry("laplacianformer_tiny", pretrained, **kwargs)


@register_model
def laplacianformer_small(pretrained: bool = False, **kwargs) -> LaplacianFormer:
    """Paper Small (25.7M params, 4.8 GMACs at 224²)."""
    return _entry("laplacianformer_small", pretrained, **kwargs)


@register_model
def laplacianformer_medium(pretrained: bool = False, **kwargs) -> LaplacianFormer:
    """Paper Medium (46.3M params, 7.43 GMACs at 224²)."""
    return _entry("laplacianformer_medium", pretrained, **kwargs)


@register_model
def laplacianformer_large(pretrained: bool = False, **kwargs) -> LaplacianFormer:
    """Paper Large (63.1M params, 11.2 GMACs at 224²)."""
    return _entry("laplacianformer_large", pretrained, **kwargs)


@register_model
def laplacianformer_huge(pretrained: bool = False, **kwargs) -> LaplacianFormer:
    """Paper Huge (78.5M params, 15.5 GMACs at 224²)."""
    return _entry("laplacianformer_huge", pretrained, **kwargs)

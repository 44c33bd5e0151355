"""The table of named LaplacianFormer sizes (docs/DESIGN.md §5): plain data, no model code.

Adding a size is one ``MODEL_CONFIGS`` entry and its entry-point function in ``models/laplacianformer.py``
(tests/models check that every entry has one): the pretrained cfg follows from the table, ``create_model``
builds it, and timm registers it when installed.
The five paper sizes (Tiny–Huge) have depths/widths chosen by us so that parameters and MACs at 224²
land within ±5% of the paper's table (``PAPER`` below; checked by tests/models). ``laplacianformer_micro``
is not a paper size: a small configuration for CPU demos, tests and ablations.
"""

from __future__ import annotations

__all__ = ["MODEL_CONFIGS", "PAPER", "list_models", "model_config"]

_W4 = dict(embed_dims=(64, 128, 320, 512), num_heads=(1, 2, 5, 8))
_W5 = dict(embed_dims=(64, 128, 320, 640), num_heads=(1, 2, 5, 10))

MODEL_CONFIGS: dict[str, dict] = {
    "laplacianformer_micro": dict(
        depths=(1, 1, 2, 1), embed_dims=(32, 64, 128, 256), num_heads=(1, 2, 4, 8), mlp_ratios=(4, 4, 4, 4)
    ),
    "laplacianformer_tiny": dict(depths=(2, 2, 2, 2), mlp_ratios=(4, 6, 4, 4), **_W4),
    "laplacianformer_small": dict(depths=(3, 4, 7, 4), mlp_ratios=(4, 8, 4, 4), **_W4),
    "laplacianformer_medium": dict(depths=(3, 4, 14, 5), mlp_ratios=(4, 8, 4, 4), **_W5),
    "laplacianformer_large": dict(depths=(3, 4, 27, 5), mlp_ratios=(4, 8, 4, 4), **_W5),
    "laplacianformer_huge": dict(depths=(4, 6, 39, 5), mlp_ratios=(4, 8, 4, 4), **_W5),
}

PAPER: dict[str, dict] = {
    "laplacianformer_tiny": dict(params_m=12.1, gmacs=2.1, top1=81.4),
    "laplacianformer_small": dict(params_m=25.7, gmacs=4.8, top1=83.8),
    "laplacianformer_medium": dict(params_m=46.3, gmacs=7.43, top1=85.3),
    "laplacianformer_large": dict(params_m=63.1, gmacs=11.2, top1=85.6),
    "laplacianformer_huge": dict(params_m=78.5, gmacs=15.5, top1=85.8),
}


def list_models() -> list[str]:
    """Registered model names, smallest first."""
    return list(MODEL_CONFIGS)


def model_config(name: str) -> dict:
    """The architecture arguments of a registered name (a copy)."""
    if name not in MODEL_CONFIGS:
        raise ValueError(f"name: expected one of {list(MODEL_CONFIGS)}, got {name!r}")
    return dict(MODEL_CONFIGS[name])


"""LaplacianFormer model zoo (docs/DESIGN.md §5): the backbone family, named sizes, MAC counting, timm entry points.

    from laplacianformer.models import create_model, model_info
    model = create_model("laplacianformer_tiny", num_classes=10, attn="laplacian")

Every name is registered with timm (``timm.create_model("laplacianformer_tiny")``, ``register_timm`` of
the family module) as soon as both this package and timm are imported, in either order; importing this
package never imports timm itself (``import_hook.after_import``, docs/MODELS.md "timm").
Saving and loading (``save_pretrained``/``from_pretrained``) are in ``laplacianformer.hub``, above this package.
"""

from __future__ import annotations


from ..layers.token_mixer import ATTENTIONS
from .info import VECTOR_OPS_PER_L1_TRIPLE, count_macs, count_vector_ops, format_model_info, model_info
from .import_hook import after_import
from .laplacianformer import LaplacianFormer, checkpoint_filter_fn, create_model, register_timm
from .registry import MODEL_CONFIGS, PAPER, list_models, model_config

__all__ = [
    "ATTENTIONS",
    "VECTOR_OPS_PER_L1_TRIPLE",
    "LaplacianFormer",
    "MODEL_CONFIGS",
    "PAPER",
    "checkpoint_filter_fn",
    "count_macs",
    "count_vector_ops",
    "create_model",
    "format_model_info",
    "list_models",
    "model_config",
    "model_info",
    "register_timm",
]


after_import("timm", register_timm)

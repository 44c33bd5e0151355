"""The resolution rules of training: the stem stride of small images, and enough stage-1 tokens per
Nyström landmark (docs/DESIGN.md §2, §5.3; used by the training engine, the ablation protocol,
docs/DESIGN.md §7, and the demo).

``model_kwargs_for`` is the one place that turns a recipe's model overrides and image size into the
model's constructor options (stem stride 2 below ``SMALL_IMAGE`` px unless given): the engine builds the
trained model with it and ``geometry`` the model it checks, so both are the same model.
``geometry(rec)`` reads the stage-1 token count, landmark count and head dim off the recipe's model (one
forward of a blank image); ``check_geometry`` refuses fewer than ``MIN_TOKENS_PER_LANDMARK`` tokens per
landmark, where the Nyström approximation would barely be exercised (m close to N is nearly the exact kernel).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

MIN_TOKENS_PER_LANDMARK = 4
SMALL_IMAGE = 128
"""Images under this many pixels get stem stride 2 (instead of the model's 4) unless the recipe sets one."""


def model_kwargs_for(model_kwargs: Mapping | None, img_size: int) -> dict:
    """A recipe's model overrides plus ``stem_stride=2`` for images under ``SMALL_IMAGE`` px unless given."""
    kw = dict(model_kwargs or {})
    if "stem_stride" not in kw and img_size < SMALL_IMAGE:
        kw["stem_stride"] = 2
    return kw


def in_chans_of(rec: dict) -> int:
    """Input channels of a recipe: ``in_chans`` when given, 1 for the grey-scale data sets, else 3."""
    if rec.get("in_chans"):
        return int(rec["in_chans"])
    return 1 if rec.get("data") in ("fashion-mnist", "digits") else 3


def geometry(rec: dict) -> dict[str, Any]:
    """Stage-1 token grid, landmark count and attention head dim of the recipe's model (default attention).

    ``rec``: a dict with ``model``, ``img_size`` and optionally ``model_kwargs``, ``in_chans``, ``data``.
    One forward of a blank image at ``img_size``; the first attention layer's input gives the stage-1
    tokens ((img_size / stem_stride)² for the micro model)."""
    import torch

    from ..layers import LaplacianAttention
    from ..models import create_model

    chans = in_chans_of(rec)
    model = create_model(rec["model"], num_classes=10, in_chans=chans,
                         **model_kwargs_for(rec.get("model_kwargs"), rec["img_size"]))
    layers = [m for m in model.modules() if isinstance(m, LaplacianAttention)]
    if not layers:
        raise ValueError(f"protocol: model {rec['model']!r} has no Laplacian attention layer")
    seen: list[tuple[int, Any, Any]] = []
    hook = layers[0].register_forward_pre_hook(
        lambda mod, args: seen.append((args[0].shape[1], tuple(args[1]), mod.landmarks)))
    try:
        with torch.no_grad():
            model.eval()(torch.zeros(1, chans, rec["img_size"], rec["img_size"]))
    except ValueError as exc:
        raise ValueError(f"protocol: the model does not accept img_size {rec['img_size']} ({exc})") from exc
    finally:
        hook.remove()
    tokens, grid, marks = seen[0]
    m = marks if isinstance(marks, int) else math.prod(marks)
    dims = {layer.head_dim for layer in layers}
    return {"stage1_tokens": int(tokens), "stage1_grid": [int(g) for g in grid], "landmarks": int(m),
            "head_dim": dims.pop() if len(dims) == 1 else None}


def check_geometry(geom: dict, rec: dict) -> None:
    """ValueError when stage 1 has fewer than ``MIN_TOKENS_PER_LANDMARK`` tokens per landmark."""
    n, m = geom["stage1_tokens"], geom["landmarks"]
    if n < MIN_TOKENS_PER_LANDMARK * m:
        stride = model_kwargs_for(rec.get("model_kwargs"), rec["img_size"]).get("stem_stride", "the model's")
        raise ValueError(
            f"protocol: stage 1 has {n} tokens (img_size {rec['img_size']}, stem stride {stride}) for m = {m} "
            f"landmarks, fewer than {MIN_TOKENS_PER_LANDMARK} × m = {MIN_TOKENS_PER_LANDMARK * m}: the Nyström "
            "approximation would barely be exercised (with m close to N it is nearly the exact kernel, and "
            "later stages are exact); use a larger img_size or a smaller stem_stride"
        )

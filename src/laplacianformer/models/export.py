"""ONNX export of LaplacianFormer models through the plain-PyTorch (composite) path.

While exporting, the kernel primitives run on their composite backend (``ops/kernel/composite.py``; the
fast paths refuse ONNX export in the op's registry, docs/DESIGN.md §6.3), whose L1 distance is
``torch.cdist(p=1)``. The ONNX exporter has no translation for ``aten._cdist_forward``, so
``onnx_translation_table`` supplies one written with standard ONNX ops: |x_i - y_j| summed over the last
axis (the broadcast (..., N, M, d) tensor exists only inside the ONNX graph). Newton–Schulz, the
normalisation and the rest of the model are plain matmuls and element-wise ops.

Dynamic dimensions: the batch is dynamic by default. H and W are dynamic where the model's graph does not
depend on the input size: ``static_hw_reason`` names the first layer whose computation changes with the
token grid (a landmark grid clamped to the token grid or replaced by the exact kernel, docs/DESIGN.md
§2.2; a spatial-reduction conv padded on small grids; a Nyströmformer switching to exact softmax). Such a
model exports with static H and W, and says so (a warning, or an error when dynamic H/W was demanded).
"""

from __future__ import annotations

import os
import warnings

import torch
from torch import nn

__all__ = ["onnx_translation_table", "export_onnx", "static_hw_reason"]


def _onnx_cdist(x1, x2, p: float = 2.0, compute_mode=None):
    """aten._cdist_forward in ONNX ops: (..., N, d), (..., M, d) -> (..., N, M) Minkowski-p distances."""
    from onnxscript import opset18 as op

    diff = op.Abs(op.Sub(op.Unsqueeze(x1, [-2]), op.Unsqueeze(x2, [-3])))
    if p == 1.0:
        return op.ReduceSum(diff, [-1], keepdims=0)
    if p == 2.0:
        return op.Sqrt(op.ReduceSum(op.Mul(diff, diff), [-1], keepdims=0))
    raise ValueError(f"p: ONNX translation supports p = 1 or 2, got {p}")


def onnx_translation_table() -> dict:
    """``custom_translation_table`` for ``torch.onnx.export(..., dynamo=True)`` covering ``torch.cdist``."""
    return {torch.ops.aten._cdist_forward.default: _onnx_cdist}


def static_hw_reason(model: nn.Module) -> str | None:
    """Why ``model``'s ONNX graph must fix H and W, or None when they can be dynamic.

    A layer whose computation depends on the token grid's size (so one graph cannot serve all sizes):
    a ``LaplacianAttention`` / ``SoftAttention`` with landmarks (clamped to the grid, exact kernel once
    they cover it; docs/DESIGN.md §2.2), a ``NystromAttention`` (exact softmax when m >= N), a
    ``SpatialReductionAttention`` with ``sr_ratio`` > 1 (pads grids smaller than the reduction cell)."""
    from ..baselines import NystromAttention, SoftAttention
    from ..layers import LaplacianAttention
    from ..layers.spatial_reduction_attention import SpatialReductionAttention

    for name, module in model.named_modules():
        if isinstance(module, (LaplacianAttention, SoftAttention)) and module.landmarks is not None:
            return (f"{name}: landmarks={module.landmarks} are clamped to the token grid and replaced by the exact "
                    "kernel when they cover it (docs/DESIGN.md §2.2), a choice made per input size; "
                    "attn_kwargs=dict(landmarks=None) (exact kernel) exports with dynamic H and W")
        if isinstance(module, NystromAttention):
            return f"{name}: Nyströmformer uses exact softmax when num_landmarks >= N, a choice made per input size"
        if isinstance(module, SpatialReductionAttention) and module.sr_ratio > 1:
            return (f"{name}: the sr_ratio={module.sr_ratio} reduction pads grids smaller than one reduction cell, "
                    "a choice made per input size")
    return None


def export_onnx(
    model: nn.Module,
    path: str | os.PathLike,
    example: torch.Tensor,
    *,
    dynamic_batch: bool = True,
    dynamic_hw: bool | None = None,
    **kwargs,
):
    """Export ``model`` (put in eval mode) with the example input ``example`` (B, C, H, W) to ``path``.

    dynamic_batch: the batch dimension is dynamic (default; any batch size runs, whatever ``example``'s;
        an example of batch 1 is traced as two copies, since torch.export specialises size-1 dimensions).
    dynamic_hw: None (default): H and W are dynamic when the model allows it (``static_hw_reason`` is
        None), else they are fixed to ``example``'s with a ``UserWarning`` giving the reason; True: dynamic,
        or ValueError with the reason; False: fixed. Channels are always fixed.
    Uses the dynamo exporter with ``onnx_translation_table()``; extra ``kwargs`` go to ``torch.onnx.export``
    (``dynamic_shapes`` there replaces these two options). Returns the ONNXProgram.
    """
    if not isinstance(example, torch.Tensor) or example.dim() != 4:
        raise ValueError(f"example: expected a (B, C, H, W) tensor, got {getattr(example, 'shape', type(example))}")
    model.eval()
    if "dynamic_shapes" not in kwargs:
        dims = {0: torch.export.Dim.DYNAMIC} if dynamic_batch else {}
        if dynamic_hw is not False:
            why = static_hw_reason(model)
            if why is None:
                dims.update({2: torch.export.Dim.DYNAMIC, 3: torch.export.Dim.DYNAMIC})
            elif dynamic_hw:
                raise ValueError(f"dynamic_hw: this model needs static H and W: {why}")
            else:
                warnings.warn(f"export_onnx: H and W are fixed to {tuple(example.shape[2:])}: {why}", UserWarning,
                              stacklevel=2)
        kwargs["dynamic_shapes"] = (dims,) if dims else None
        if dynamic_batch and example.shape[0] == 1:
            # torch.export specialises a dynamic dimension whose example size is 1 (the "0/1 specialisation"),
            # here silently in part of the graph: trace a batch of two copies instead.
            example = example.expand(2, *example.shape[1:]).clone()
    table = {**onnx_translation_table(), **kwargs.pop("custom_translation_table", {})}
    return torch.onnx.export(model, (example,), str(path), dynamo=True, custom_translation_table=table, **kwargs)

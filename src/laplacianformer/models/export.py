"""ONNX export of LaplacianFormer models through the plain-PyTorch (composite) path.

While exporting, the kernel primitives run on the composite backend (``ops/kernel/backend.py``), whose
L1 distance is ``torch.cdist(p=1)``. The ONNX exporter has no translation for ``aten._cdist_forward``, so
``onnx_translation_table`` supplies one written with standard ONNX ops: |x_i - y_j| summed over the last
axis (the broadcast (..., N, M, d) tensor exists only inside the ONNX graph). Newton–Schulz, the
normalisation and the rest of the model are plain matmuls and element-wise ops.
"""

from __future__ import annotations

import os

import torch

__all__ = ["onnx_translation_table", "export_onnx"]


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


def export_onnx(model: torch.nn.Module, path: str | os.PathLike, example: torch.Tensor, **kwargs):
    """Export ``model`` (put in eval mode) with the example input ``example`` (B, C, H, W) to ``path``.

    Uses the dynamo exporter with ``onnx_translation_table()``; extra ``kwargs`` go to ``torch.onnx.export``.
    Returns the ONNXProgram.
    """
    if not isinstance(example, torch.Tensor) or example.dim() != 4:
        raise ValueError(f"example: expected a (B, C, H, W) tensor, got {getattr(example, 'shape', type(example))}")
    model.eval()
    table = {**onnx_translation_table(), **kwargs.pop("custom_translation_table", {})}
    return torch.onnx.export(model, (example,), str(path), dynamo=True, custom_translation_table=table, **kwargs)

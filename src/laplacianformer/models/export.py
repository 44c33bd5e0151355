"""Export of LaplacianFormer models to ONNX and ``torch.export`` programs whose input size is free.

While exporting, the kernel primitives run on their composite backend (``ops/kernel/composite.py``; the
fast paths refuse ONNX export in the op's registry, docs/DESIGN.md §6.3), whose L1 and L2 distances are then
``composite.export_distance``: the features in static steps of 8, each an (..., 8, M, N) broadcast reduced
into an (..., M, N) sum, so the graph holds no (..., N, M, d) tensor (issue 42: with it, one Tiny forward at
1024² raised onnxruntime's peak RSS by 1,874 MiB, now 330 MiB, eager mode 239 MiB; ``bench/onnx_deploy.py``,
docs/DEPLOY.md). Only with
``composite.EXPORT_CHUNK = 0`` (the form before, for comparisons) is ``torch.cdist`` recorded; neither
exporter translates it as we need (the TorchScript exporter's ``aten::cdist`` adds 1e-6 to every difference
and returned NaN in onnxruntime here; the dynamo exporter has no function for ``aten._cdist_forward``), so
both get one written with standard ONNX ops: |x_i - y_j| summed over the last axis (a broadcast
(..., N, M, d) tensor inside the graph).

One graph for every input size, from any exporter call (``torch.export.export`` with ``Dim``s too): the
landmark grid is cut to the token grid with shape arithmetic (``ops/validation.landmark_grid``), the
pooling bins come from the graph's sizes (``ops/pooling.adaptive_pool_matrix``), and the rule "landmarks
covering every token use the exact kernel" (docs/DESIGN.md §2.2), a choice between two computations, is
made inside the graph by the operator itself while it is exported (``ops/graph_rule.py``): the exact
kernel on the first min(N, lh·lw) tokens and the Nyström path are both computed and ``torch.where`` keeps
the one eager mode takes for that size (the exact branch costs at most (lh·lw)² per head).

Accuracy (docs/MODELS.md, "Export and compile"): onnxruntime's ReduceMean accumulates one float at a time
(a mean of 5120 values in [0.3, 0.8] measured 2.7e-6 relative error against torch's 1.8e-7), and the
injective normalisation (§4.1) centres the N×m kernel factors by their column means and divides by column
standard deviations that come down to norm_eps, which multiplies that error by ~100: the 1e-3 relative
differences of earlier exports (measured: stage-1 attention output of laplacianformer_micro at 320×256,
4.6e-5 against float64 in onnxruntime, 6.3e-6 in eager float32). ``accurate_reductions`` rewrites each
mean as x_0 + mean(x - x_0), after which onnxruntime is within eager float32's own distance to float64.
"""

from __future__ import annotations

import contextlib
import os
import warnings

import torch
from torch import nn

__all__ = ["ONNX_EXTRA", "accurate_reductions", "export_onnx", "export_program",
           "onnx_translation_table", "static_hw_reason"]

ONNX_EXTRA = "pip install laplacianformer[onnx]"
"""What installs the ONNX exporter's and checker's packages (onnx, onnxscript, onnxruntime)."""

OPSET = 18


def require(*modules: str) -> None:
    """ImportError naming the extra when one of ``modules`` (e.g. "onnx", "onnxruntime") is missing."""
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ImportError(f"{', '.join(missing)}: not installed; ONNX export and its checks need them "
                          f"({ONNX_EXTRA})")


def _onnx_cdist(x1, x2, p: float = 2.0, compute_mode=None):
    """aten._cdist_forward in ONNX ops (dynamo exporter): (..., N, d), (..., M, d) -> (..., N, M)."""
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


def _cdist_symbolic(g, x1, x2, p, compute_mode):
    """aten::cdist for the TorchScript exporter: sum |x1_i - x2_j| (p = 1) or its square root (p = 2)."""
    from torch.onnx import symbolic_helper

    p = symbolic_helper._maybe_get_const(p, "f")
    const = lambda values: g.op("Constant", value_t=torch.tensor(values, dtype=torch.int64))  # noqa: E731
    diff = g.op("Abs", g.op("Sub", g.op("Unsqueeze", x1, const([-2])), g.op("Unsqueeze", x2, const([-3]))))
    if p == 1.0:
        return g.op("ReduceSum", diff, const([-1]), keepdims_i=0)
    if p == 2.0:
        return g.op("Sqrt", g.op("ReduceSum", g.op("Mul", diff, diff), const([-1]), keepdims_i=0))
    raise ValueError(f"p: ONNX translation supports p = 1 or 2, got {p}")


@contextlib.contextmanager
def _cdist_translation(opset: int):
    torch.onnx.register_custom_op_symbolic("aten::cdist", _cdist_symbolic, opset)
    try:
        yield
    finally:
        torch.onnx.unregister_custom_op_symbolic("aten::cdist", opset)


def static_hw_reason(model: nn.Module) -> str | None:
    """Why ``model``'s exported graph must fix H and W, or None when they can be dynamic.

    ``LaplacianAttention`` layers are no reason (both sides of the landmark rule are in the graph:
    ``ops/graph_rule.py``). Reasons: a ``SoftAttention`` with landmarks (the same rule, not in its graph), a
    ``NystromAttention`` (exact softmax when m >= N), a ``SpatialReductionAttention`` with ``sr_ratio`` > 1
    (pads grids smaller than the reduction cell), a ``LaplacianAttention`` with prefix tokens."""
    from ..baselines import NystromAttention, SoftAttention
    from ..layers import LaplacianAttention
    from ..layers.spatial_reduction_attention import SpatialReductionAttention

    for name, module in model.named_modules():
        if isinstance(module, LaplacianAttention) and getattr(module, "num_prefix_tokens", 0):
            return f"{name}: num_prefix_tokens={module.num_prefix_tokens}: the landmark rule is exported for grids only"
        if isinstance(module, SoftAttention) and module.landmarks is not None:
            return (f"{name}: SOFT's landmarks={module.landmarks} are clamped to the token grid and replaced by the "
                    "exact kernel when they cover it (docs/DESIGN.md §2.2), a choice made per input size")
        if isinstance(module, NystromAttention):
            return f"{name}: Nyströmformer uses exact softmax when num_landmarks >= N, a choice made per input size"
        if isinstance(module, SpatialReductionAttention) and module.sr_ratio > 1:
            return (f"{name}: the sr_ratio={module.sr_ratio} reduction pads grids smaller than one reduction cell, "
                    "a choice made per input size")
    return None


def accurate_reductions(onnx_model) -> int:
    """Rewrites each ReduceMean over one axis as the mean of the differences to the first slice along it,
    plus that slice: mean(x) = x_0 + mean(x - x_0) (same value; onnxruntime's accumulation error then scales
    with the spread of x rather than its size; module docstring). Returns the number of nodes rewritten."""
    import onnx
    from onnx import helper, numpy_helper

    consts = {i.name: numpy_helper.to_array(i) for i in onnx_model.graph.initializer}
    for node in onnx_model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            consts[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    nodes, done = [], 0

    def const(name: str, values) -> str:
        nodes.append(helper.make_node("Constant", [], [name], value=helper.make_tensor(
            name, onnx.TensorProto.INT64, [len(values)], values)))
        return name

    for node in onnx_model.graph.node:
        axes = consts.get(node.input[1]) if node.op_type == "ReduceMean" and len(node.input) > 1 else None
        if axes is None or axes.size != 1:
            nodes.append(node)
            continue
        axis = int(axes.reshape(-1)[0])
        keep = next((a.i for a in node.attribute if a.name == "keepdims"), 1)
        x, out, base = node.input[0], node.output[0], f"{node.output[0]}_shifted"
        nodes.append(helper.make_node("Slice", [x, const(f"{base}_0", [0]), const(f"{base}_1", [1]),
                                                const(f"{base}_axis", [axis])], [f"{base}_first"]))
        nodes.append(helper.make_node("Sub", [x, f"{base}_first"], [f"{base}_diff"]))
        nodes.append(helper.make_node("ReduceMean", [f"{base}_diff", node.input[1]], [f"{base}_mean"], keepdims=1))
        total = out if keep else f"{base}_sum"
        nodes.append(helper.make_node("Add", [f"{base}_first", f"{base}_mean"], [total]))
        if not keep:
            nodes.append(helper.make_node("Squeeze", [total, node.input[1]], [out]))
        done += 1
    del onnx_model.graph.node[:]
    onnx_model.graph.node.extend(nodes)
    return done


def _dims(example: torch.Tensor, dynamic_batch: bool, dynamic_hw: bool | None, model: nn.Module) -> tuple[bool, bool]:
    """(batch dynamic, H and W dynamic) after ``static_hw_reason`` (ValueError when demanded and impossible)."""
    if not isinstance(example, torch.Tensor) or example.dim() != 4:
        raise ValueError(f"example: expected a (B, C, H, W) tensor, got {getattr(example, 'shape', type(example))}")
    hw = dynamic_hw is not False
    if hw:
        why = static_hw_reason(model)
        if why is not None:
            if dynamic_hw:
                raise ValueError(f"dynamic_hw: this model needs static H and W: {why}")
            warnings.warn(f"export: H and W are fixed to {tuple(example.shape[2:])}: {why}", UserWarning, stacklevel=3)
            hw = False
    return dynamic_batch, hw


def export_onnx(
    model: nn.Module,
    path: str | os.PathLike,
    example: torch.Tensor,
    *,
    dynamic_batch: bool = True,
    dynamic_hw: bool | None = None,
    dynamo: bool = False,
    opset: int = OPSET,
    **kwargs,
):
    """Export ``model`` (put in eval mode) with the example input ``example`` (B, C, H, W) to ``path``.

    dynamic_batch: the batch dimension is dynamic (default).
    dynamic_hw: None (default): H and W are dynamic unless ``static_hw_reason`` names a layer that needs
        them fixed (then fixed to ``example``'s with a ``UserWarning`` giving the reason); True: dynamic, or
        ValueError with the reason; False: fixed. Channels are always fixed. The default models export with
        dynamic batch, H and W: both sides of the landmark rule are in the graph (``ops/graph_rule.py``).
    dynamo: False (default): the TorchScript exporter, with an ``aten::cdist`` translation;
        True: the dynamo exporter with ``onnx_translation_table()``
        (``torch.export``-based; extra ``kwargs`` go to ``torch.onnx.export`` in either case).
    Either way the file gets ``accurate_reductions``. Returns ``path``.
    """
    require("onnx", "onnxscript") if dynamo else require("onnx")
    model.eval()
    batch, hw = _dims(example, dynamic_batch, dynamic_hw, model)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)  # the argument checks' comparisons
        warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export.*")
        if dynamo:
            _export_dynamo(model, path, example, batch, hw, opset, kwargs)
        else:
            _export_torchscript(model, path, example, batch, hw, opset, kwargs)
    import onnx

    onnx_model = onnx.load(str(path))
    accurate_reductions(onnx_model)
    onnx.save(onnx_model, str(path))
    return path


def _export_torchscript(model, path, example, batch: bool, hw: bool, opset: int, kwargs: dict) -> None:
    dims = {**({0: "batch"} if batch else {}), **({2: "height", 3: "width"} if hw else {})}
    # with autograd on and an input that requires grad: under no_grad the layers add the attention heads into
    # the DWConv(V) output in place through a view (layers/token_attention.py), which the TorchScript
    # exporter records wrongly (onnxruntime then differs by ~100 %)
    with _cdist_translation(opset), torch.enable_grad():
        example = example.detach().clone().requires_grad_(True)
        torch.onnx.export(model, (example,), str(path), dynamo=False, opset_version=opset, input_names=["image"],
                          dynamic_axes={"image": dims} if dims else None, **kwargs)


def _export_dynamo(model, path, example, batch: bool, hw: bool, opset: int, kwargs: dict):
    if "dynamic_shapes" not in kwargs:
        dims = {**({0: torch.export.Dim.DYNAMIC} if batch else {}),
                **({2: torch.export.Dim.DYNAMIC, 3: torch.export.Dim.DYNAMIC} if hw else {})}
        kwargs["dynamic_shapes"] = (dims,) if dims else None
        if batch and example.shape[0] == 1:
            # torch.export specialises a dynamic dimension whose example size is 1 (the "0/1 specialisation"):
            # trace a batch of two copies instead
            example = example.expand(2, *example.shape[1:]).clone()
    table = {**onnx_translation_table(), **kwargs.pop("custom_translation_table", {})}
    torch.onnx.export(model, (example,), str(path), dynamo=True, opset_version=opset, custom_translation_table=table,
                      **kwargs)


def _total_stride(model: nn.Module) -> int:
    """The input pixels per token of the last stage: ``model.stride``, or the largest reduction of timm's
    ``feature_info`` (a features_only backbone); 1 when neither is known."""
    stride = getattr(model, "stride", None)
    if isinstance(stride, int):
        return stride
    info = getattr(model, "feature_info", None)
    reduction = getattr(info, "reduction", None)
    return max(reduction()) if callable(reduction) else 1


def export_program(model: nn.Module, example: torch.Tensor, *, dynamic_batch: bool = True,
                   dynamic_hw: bool | None = None, hw_range: tuple[int, int] | None = None,
                   **kwargs) -> torch.export.ExportedProgram:
    """``torch.export.export`` of ``model`` (eval mode) at ``example`` (B, C, H, W) with ``torch.export.Dim``s for
    the batch and H, W (the same options as ``export_onnx``): the program runs any size with eager mode's
    landmark rule (``ops/graph_rule.py``; a plain ``torch.export.export`` with such ``Dim``s does the same).

    hw_range: (min, max) of H and W; default: from the total stride + 1, no maximum. A min <= the total stride
        is refused (ValueError): the last stage would have a side of 1 token, a size torch.export cannot keep
        dynamic. Extra ``kwargs`` go to ``torch.export.export``."""
    model.eval()
    batch, hw = _dims(example, dynamic_batch, dynamic_hw, model)
    stride = _total_stride(model)
    low, high = (stride + 1, None) if hw_range is None else _check_hw_range(hw_range, stride)
    dims = {**({0: torch.export.Dim("batch")} if batch else {}),
            **({2: torch.export.Dim("height", min=low, max=high), 3: torch.export.Dim("width", min=low, max=high)}
               if hw else {})}
    if batch and example.shape[0] == 1:
        example = example.expand(2, *example.shape[1:]).clone()
    return torch.export.export(model, (example,), dynamic_shapes=(dims,) if dims else None, **kwargs)


def _check_hw_range(hw_range, stride: int) -> tuple[int, int]:
    """``hw_range`` as (min, max) with stride < min <= max; ValueError naming it otherwise."""
    if (not isinstance(hw_range, (tuple, list)) or len(hw_range) != 2
            or not all(isinstance(s, int) and not isinstance(s, bool) for s in hw_range)):
        raise ValueError(f"hw_range: expected (min, max) ints, got {hw_range!r}")
    low, high = hw_range
    if not stride < low <= high:
        raise ValueError(f"hw_range: expected {stride} < min <= max (at a side <= the total stride {stride} the last "
                         f"stage has 1 token, a size torch.export cannot keep dynamic), got {tuple(hw_range)}")
    return low, high

"""Parameter and MAC counts of a model (DESIGN.md §5: "FLOPs are multiply-accumulates at 224²").

Convention (the one of fvcore and of the vision papers whose tables we compare with): one MAC per
multiply-accumulate of every matmul / linear / convolution / scaled-dot-product attention, counted by
``torch.utils.flop_counter.FlopCounterMode`` (which reports 2 FLOPs per MAC; we halve it), plus the
L1-distance work of the Laplacian kernel, N·M·d per (N×M) kernel matrix over d dims (``aten._cdist_forward``,
which FlopCounterMode does not know; we register that formula). Scaled-dot-product attention counts its two
products, Nq·Nk·(d + d_v) MACs per head: FlopCounterMode knows the CUDA kernels but not the CPU one
(``aten._scaled_dot_product_flash_attention_for_cpu``), so we register it too. Element-wise work (exp, LayerNorm, GELU,
additions, pooling) is not counted, as in fvcore. The Gaussian kernel's distances are matmuls and are
counted by the default rules.
"""

from __future__ import annotations

import torch
from torch import nn

from ..ops import use
from .laplacianformer import LaplacianFormer, create_model
from .registry import PAPER

__all__ = ["VECTOR_OPS_PER_L1_TRIPLE", "count_macs", "count_vector_ops", "model_info", "format_model_info"]

# The backends the count runs on (``ops.use``): the composite kernel (every L1 distance one
# ``aten._cdist_forward``), the torch Newton–Schulz loop, the plain normalisation composite, and
# ``adaptive_avg_pool`` landmarks (pooling is not counted; its matrix-product form would be).
COUNTING_BACKENDS = dict(kernel="composite", kernel_matmul="composite", newton_schulz="torch",
                         newton_schulz_grad="torch", normalization="composite", pooling="adaptive_avg_pool")


def _cdist_flops(x_shape, y_shape, *args, **kwargs) -> int:
    """FLOPs (2 per MAC) of an L1 distance matrix: x (..., N, d), y (..., M, d) -> N·M·d MACs per batch."""
    batch = 1
    for s in x_shape[:-2]:
        batch *= s
    return 2 * batch * x_shape[-2] * y_shape[-2] * x_shape[-1]


VECTOR_OPS_PER_L1_TRIPLE = 3
"""Vector operations per (n, m, k) term of an L1 distance in the CPU's C loop (subtract, absolute value as a
mask, add: ``ops/kernel/csrc/pairwise.c``), where a multiply-add of a matmul is one FMA. The L1 terms' share of
``count_macs`` weighted by it gives the vector-op count of ``count_vector_ops``: the arithmetic a CPU runs, for
reading a time ratio against SR-softmax's GEMMs (docs/DEPLOY.md, "Where the time goes")."""


def _count(model: nn.Module, x: torch.Tensor) -> "torch.utils.flop_counter.FlopCounterMode":
    """The FLOP counter after ``model(x)`` (no gradient) on ``COUNTING_BACKENDS``."""
    from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count  # imports triton: not at our import

    mapping = {
        torch.ops.aten._cdist_forward: lambda x_shape, y_shape, *a, out_shape=None, **k: _cdist_flops(x_shape, y_shape),
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: (
            lambda q_shape, k_shape, v_shape, *a, out_shape=None, **k: sdpa_flop_count(q_shape, k_shape, v_shape)),
    }
    counter = FlopCounterMode(display=False, custom_mapping=mapping)
    with torch.no_grad(), use(**COUNTING_BACKENDS), counter:
        model(x)
    return counter


def count_macs(model: nn.Module, x: torch.Tensor) -> tuple[int, dict[str, int]]:
    """MACs of ``model(x)`` (no gradient) under the convention above, and MACs per top-level submodule.

    The kernel primitives run on the "composite" backend during the count, so that every L1 distance
    is one ``aten._cdist_forward`` call the counter sees (the fused backends compute the same products),
    and the normalisation runs as its plain composite, whose matmuls the counter sees (the fused
    blockwise version computes the same products with in-place ops it does not count). The landmark
    pooling runs as ``adaptive_avg_pool2d`` (not counted), not as its pooling-matrix products.
    Per-module keys are dotted paths below the model ("patch_embed", "stages.0", "head", ...).
    """
    counter = _count(model, x)
    per_module = {}
    for name, counts in counter.get_flop_counts().items():
        if name != "Global" and "." in name:
            per_module[name.split(".", 1)[1]] = sum(counts.values()) // 2
    return counter.get_total_flops() // 2, per_module


def count_vector_ops(model: nn.Module, x: torch.Tensor) -> tuple[int, int]:
    """(MACs, vector-op count) of ``model(x)``: ``count_macs``'s total, and the same with each L1-distance term
    counted ``VECTOR_OPS_PER_L1_TRIPLE`` times (every other MAC one FMA)."""
    counter = _count(model, x)
    macs = counter.get_total_flops() // 2
    l1 = counter.get_flop_counts().get("Global", {}).get(torch.ops.aten._cdist_forward, 0) // 2
    return macs, macs + (VECTOR_OPS_PER_L1_TRIPLE - 1) * l1


def model_info(name_or_model, img_size=224, *, batch: int = 1) -> dict:
    """Params, MACs at ``img_size`` (int or (h, w)), per-stage output shapes and the paper's numbers.

    ``name_or_model``: a registered name (built with 1000 classes, laplacian attention) or a LaplacianFormer.
    MACs are per image. Returns a dict with keys name, params, params_m, macs, gmacs, flops (= 2·MACs),
    img_size, stages (list of dict(index, channels, reduction, shape, macs)), stem_macs, head_macs, paper.
    """
    if isinstance(name_or_model, str):
        name = name_or_model
        model = create_model(name)
    elif isinstance(name_or_model, LaplacianFormer):
        model = name_or_model
        name = getattr(model, "pretrained_cfg", {}).get("architecture", type(model).__name__)
    else:
        raise TypeError(f"name_or_model: expected a model name or a LaplacianFormer, got {type(name_or_model).__name__}")
    h, w = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
    was_training = model.training
    model.eval()
    ref = next(model.parameters())
    x = torch.zeros(batch, model.in_chans, h, w, device=ref.device, dtype=ref.dtype)
    macs, per_module = count_macs(model, x)
    shapes = [_out_shape(model, i, h, w) for i in range(len(model.stages))]
    model.train(was_training)
    stages = [
        dict(index=i, channels=info["num_chs"], reduction=info["reduction"], shape=shape,
             depth=len(model.stages[i].blocks), macs=per_module.get(f"stages.{i}", 0) // batch)
        for i, (info, shape) in enumerate(zip(model.feature_info, shapes))
    ]
    params = sum(p.numel() for p in model.parameters())
    return dict(
        name=name,
        attn=model.attn,
        img_size=(h, w),
        params=params,
        params_m=params / 1e6,
        macs=macs // batch,
        gmacs=macs / batch / 1e9,
        flops=2 * macs // batch,
        stem_macs=per_module.get("patch_embed", 0) // batch,
        head_macs=per_module.get("head", 0) // batch,
        stages=stages,
        paper=PAPER.get(name),
    )


def _out_shape(model: LaplacianFormer, i: int, h: int, w: int) -> tuple[int, int, int]:
    """(C, H, W) after stage i: the 7×7 stem (padding 3) then 3×3/s2 convs (padding 1) round up."""
    s = model.feature_info[0]["reduction"]
    h, w = (h - 1) // s + 1, (w - 1) // s + 1
    for _ in range(i):
        h, w = (h - 1) // 2 + 1, (w - 1) // 2 + 1
    return (model.feature_info[i]["num_chs"], h, w)


def format_model_info(name_or_model, img_size=224) -> str:
    """A human-readable table of ``model_info`` (what ``laplacianformer info MODEL`` prints)."""
    info = name_or_model if isinstance(name_or_model, dict) else model_info(name_or_model, img_size)
    h, w = info["img_size"]
    lines = [
        f"{info['name']}  (attention: {info['attn']}, input {h}x{w})",
        f"  params: {info['params_m']:.2f} M    MACs: {info['gmacs']:.3f} G    (FLOPs = 2 x MACs = {2 * info['gmacs']:.3f} G)",
    ]
    if info.get("paper"):
        p = info["paper"]
        lines.append(
            f"  paper:  {p['params_m']:.2f} M    MACs: {p['gmacs']:.3f} G    "
            f"(ours/paper: params {info['params_m'] / p['params_m']:.3f}, MACs {info['gmacs'] / p['gmacs']:.3f};"
            f" paper ImageNet top-1 {p['top1']})"
        )
    lines.append(f"  stem: {info['stem_macs'] / 1e6:.1f} M MACs   head: {info['head_macs'] / 1e6:.1f} M MACs")
    lines.append("  stage  depth  channels  stride  output (C, H, W)     MACs")
    for s in info["stages"]:
        lines.append(
            f"  {s['index']:>5}  {s['depth']:>5}  {s['channels']:>8}  {s['reduction']:>6}  {str(s['shape']):<19}"
            f"  {s['macs'] / 1e9:.3f} G"
        )
    lines.append("  MACs: matmul/linear/conv/SDPA multiply-accumulates + N*m*d per L1 kernel matrix; element-wise ops not counted.")
    return "\n".join(lines)

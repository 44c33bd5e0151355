"""What the streaming Nyström passes serve and how they split the rows, in pure Python (docs/KERNELS.md,
"The streaming passes"): the registry asks it without importing Triton, ``triton.py`` enumerates its
specialisations within it, and ``reference.py`` follows the same plan. The declarations (``ops/capabilities.py``)
of the three fused ops' backends: ``PASSES`` / ``TRITON_PASSES`` (op ``streaming``), ``SOLVE`` / ``TRITON_SOLVE``
(``landmark_solve``, ``landmarks.py``), ``TRAINING`` / ``TRITON_TRAINING`` (``fused_training``, ``training.py``);
``unfit`` and ``solve_unfit``: the same declarations asked by the Triton launchers for a norm and sizes;
``conv_unfit``: when the output pass cannot add the layer's DWConv(V) (``ops/value_conv.py``, docs/DESIGN.md §4.5)
to its tiles.

The passes serve the shipped norms (``validation.SHIPPED_NORMS``: "injective", "inline"), the shipped solver
and backward; the ablation variants run the step path (docs/DESIGN.md §4.4). Both norms centre the key factor
(k̃ = C_k − k̄, so the query pass, which gives c̄, S, k̄ and the valid count, always runs) and add v̄ (the 1/N
row); ``whitens(norm)`` ("injective") adds the variances s_j = k̃_j S' k̃_jᵀ (S the centred covariance of C_q,
S' = W⁺ᵀ S W⁺), the weights r_j = (max(s_j, 0) + eps)^-½ and the centred query factor c̃ = C_q − c̄ of the output.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..capabilities import Call, Serves, unserved
from ..kernel.limits import TRITON_KERNEL_IDS, kernel_unserved
from ..kernel_families import KERNEL_FAMILIES
from ..validation import NORM_SCALE_POWERS, SHIPPED_NORMS, SHIPPED_NS_BACKWARDS, SHIPPED_SOLVERS, WHITENED_NORMS

MAX_M = 64
"""Largest landmark count m of the passes (their (rows, m) and (m, m) register tiles)."""
MAX_D = 128
"""Largest head dim d (q, k and landmarks are read in chunks of d) and value dim e (held whole)."""
LOAD_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
"""The dtypes the Triton passes read q, k, v (and the gradient) in, as they are: every sum and product runs in
float32 and the landmarks, W⁺ and all statistics are float32 whatever the input (docs/DESIGN.md §1.3); the
output (and dq, dk, dv) is written in the inputs' dtype."""

STREAMED_NORMS = SHIPPED_NORMS
"""The norms the streaming passes, the fused landmark solve's callers and the fused training passes serve."""


def whitens(norm: str) -> bool:
    """Whether the streamed ``norm`` whitens ("injective": variances, weights r_j, centred query factor);
    ValueError for a norm the passes have no form of."""
    if norm not in STREAMED_NORMS:
        raise ValueError(f"norm {norm!r} has no streaming form (only {list(STREAMED_NORMS)})")
    return norm in WHITENED_NORMS


_TRITON = dict(devices=("cuda",), interpreted=True, dtypes=LOAD_DTYPES, kernels=TRITON_KERNEL_IDS)
PASSES = Serves("the streaming passes", norms=STREAMED_NORMS, form="streaming", max_m=MAX_M, max_d=MAX_D,
                max_e=MAX_D, limit_note="; register tiles", grad=False)
"""The op ``streaming``'s pass backends: ``torch`` (any device and dtype, every family), forward only."""
TRITON_PASSES = replace(PASSES, **_TRITON)
"""``triton``: besides, CUDA tensors (CPU ones under TRITON_INTERPRET=1) of ``LOAD_DTYPES``, the Triton profiles."""
SOLVE = Serves("the fused landmark solve kernels", solvers=SHIPPED_SOLVERS, form="fused solve", max_m=MAX_M,
               max_d=MAX_D, limit_note="; one on-chip block per matrix", masks=False, grad=False)
"""The op ``landmark_solve``'s solve backends: Newton–Schulz, no mask, forward only."""
TRITON_SOLVE = replace(SOLVE, **_TRITON)
TRAINING = Serves("the fused training passes", norms=STREAMED_NORMS, solvers=SHIPPED_SOLVERS,
                  ns_backwards=SHIPPED_NS_BACKWARDS, form="fused training", max_m=MAX_M, max_d=MAX_D, max_e=MAX_D,
                  limit_note="; register tiles", masks=False)
"""The op ``fused_training``'s backends: the shipped norm, solver and backward, no mask."""
TRITON_TRAINING = replace(TRAINING, **_TRITON)


def scale_power(norm: str, norm_scale: str) -> float:
    """p of the output scale α = n^-p of docs/DESIGN.md §4.6 for ``norm_scale`` ("one" 0, "inv_sqrt_n" ½,
    "inv_n" 1); 0 for the norms without a whitened part."""
    return NORM_SCALE_POWERS[norm_scale] if whitens(norm) else 0.0


def output_alpha(norm: str, scale_power: float, n):
    """α = n^-p, the output scale of the whitened part (docs/DESIGN.md §4.6: Z_α V = v̄ + α (Z V − v̄)) for the
    whitened norms, 1 for the others; n the valid keys (a number, or a tensor of per-sequence counts),
    p = ``scale_power`` (0, ½, 1 for ``norm_scale`` "one", "inv_sqrt_n", "inv_n"). The passes apply it to
    M = W⁺ M' (the only product the whitened part reaches the output through), so v̄ stays unscaled."""
    if not whitens(norm) or scale_power == 0.0:
        return 1.0
    return n ** -scale_power if not isinstance(n, torch.Tensor) else n.pow(-scale_power)


BLOCK_ROWS = 32
"""Rows of one tile (queries or keys) in every pass."""
MAX_SPLITS = 16
"""Most row splits per (batch, head) group: the next pass's prologue sums this many partials."""
TARGET_PROGRAMS = 256
"""Splits are chosen so that splits × groups reaches about this many programs (two per SM on a
132-SM H100/H200), within MAX_SPLITS and one tile per split."""


def splits_for(n: int, groups: int) -> tuple[int, int]:
    """(splits, rows per split) of the N rows of each group: a multiple of ``BLOCK_ROWS`` rows per split,
    every split non-empty. Fixed by (n, groups) alone, so the summation order (and every bit of the
    result) does not depend on the device."""
    tiles = max(1, -(-n // BLOCK_ROWS))
    want = max(1, min(MAX_SPLITS, tiles, -(-TARGET_PROGRAMS // max(groups, 1))))
    rows = -(-tiles // want) * BLOCK_ROWS
    return max(1, -(-n // rows)), rows


def _dtype_unfit(who: str, dtype: torch.dtype | None) -> str | None:
    if dtype is not None and dtype not in LOAD_DTYPES:
        return f"dtype {dtype}: {who} read float32, float16 or bfloat16 (float64 runs the step path)"
    return None


def unfit(norm: str | None, m: int, d: int, e: int, dtype: torch.dtype | None = None) -> str | None:
    """Why the streaming passes have no form for this norm (None: any streamed one) and these sizes (and, given
    ``dtype``, for the Triton kernels' dtype), or None: the declaration ``PASSES`` asked by a launcher."""
    return unserved(PASSES, Call((), norm=norm, m=m, d=d, e=e)) or _dtype_unfit("the streaming passes", dtype)


def solve_unfit(m: int, d: int, dtype: torch.dtype | None = None) -> str | None:
    """Why the fused landmark solve (``landmarks.py``) has no form for m landmarks of head dim d (and, given
    ``dtype``, for its Triton kernel's dtype), or None: the declaration ``SOLVE`` asked by its launcher."""
    return unserved(SOLVE, Call((), m=m, d=d)) or _dtype_unfit("the fused landmark solve kernels", dtype)


def triton_kernel_id(who: str, kernel: str) -> int:
    """The id (``KernelSpec.id``) a Triton launcher passes its kernels as the constexpr ``KID`` for the family named
    ``kernel``: one of ``kernel.limits.TRITON_KERNEL_IDS``; ValueError starting with ``who`` for an unknown family or
    one without a Triton profile."""
    spec = KERNEL_FAMILIES.get(kernel) if isinstance(kernel, str) else None
    if spec is None:
        raise ValueError(f"{who}: kernel {kernel!r}: expected one of {list(KERNEL_FAMILIES)}")
    why = kernel_unserved(spec)
    if why is not None:
        raise ValueError(f"{who}: {why}")
    return spec.id


def conv_unfit(conv, vv: torch.Tensor, mask: torch.Tensor | None, dtype: torch.dtype | None = None) -> str | None:
    """Why the output pass cannot fuse the DWConv(V) term ``conv`` (an ``ops.value_conv.ValueConv``) into the
    output of the passes over vv (B, H, N, e) (and, given ``dtype``, in the Triton kernel's dtype), or None.

    The pass reads the 9 grid neighbours of each row from vv through its row stride, so vv must be the head
    view of ``conv.tokens`` (no copy: tokens read in their dtype, no padding); a 1-D sequence is the (1, N) grid (its conv
    along N is the middle row of the 3×3 weight: the other rows meet the zero padding only)."""
    b, h, n, e = vv.shape
    if mask is not None:
        return "a key_padding_mask: DWConv(V) is added after the core (the layer's padded rows)"
    hw = conv.hw
    if hw is not None and not (all(type(s) is int for s in hw) and hw[0] * hw[1] == n):
        return f"hw={hw} is not a grid of the N={n} tokens as Python ints"
    tokens = conv.tokens
    if tuple(tokens.shape) != (b, n, h * e) or tokens.stride(-1) != 1 or tokens.data_ptr() != vv.data_ptr() \
            or vv.stride() != (tokens.stride(0), e * tokens.stride(2), tokens.stride(1), tokens.stride(2)):
        return ("V of the passes is not the head view of the conv's tokens (a copy: padded or cast tokens): "
                "DWConv(V) is added after the core")
    if tuple(conv.weight.shape) != (h * e, 1, 3, 3) or (conv.bias is not None and tuple(conv.bias.shape) != (h * e,)):
        return f"the conv is not a 3×3 depthwise conv of the H·e = {h * e} value channels"
    tensors = [conv.weight] + ([] if conv.bias is None else [conv.bias])
    if any(t.device != vv.device for t in tensors):
        return "the conv's weight is on another device than V"
    if dtype is not None and any(not t.dtype.is_floating_point or t.dtype == torch.float64 for t in tensors):
        return f"the conv's weight is {conv.weight.dtype}: the fused DWConv reads a float32, float16 or bfloat16 weight"
    return None

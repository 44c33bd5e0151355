"""What the Triton kernel backend serves, in pure Python (the registry asks without importing Triton;
``triton.py`` enumerates its specialisations within it): the range ``benchmarks/triton_aot.py --strict``
compiles and checks for register spills on sm_80 and sm_90 (docs/KERNELS.md)."""

from __future__ import annotations

import torch

TRITON_MAX_D = 128
TRITON_MAX_E = 128


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def triton_unfit(l1: bool, d: int, e: int | None, dtype: torch.dtype) -> str | None:
    """Why no configuration of the Triton backward with V compiles without spills on both sm_80 and sm_90
    for these inputs, or None (pure Python: the registry asks it without importing Triton). The cases
    benchmarks/triton_aot.py found, all in the squared-L2 dY kernel with V: d, e in (64, 128] with
    float16/bfloat16 inputs (sm_80 spills 12 bytes at 16 warps and 44 at 8, sm_90 spills at 4), and d in
    (32, 64], e in (64, 128] (sm_90 spills at 4, 8 and 16 warps). The registry refuses them when a gradient
    may be needed (the forward alone fits); ``triton.aot_specialisations`` leaves them out."""
    if l1 or e is None:
        return None
    pd, pe = _pow2(max(d, 16)), _pow2(max(e, 16))
    if (pd, pe) == (64, 128) or ((pd, pe) == (128, 128) and dtype in (torch.float16, torch.bfloat16)):
        return (f"gaussian kernel_matmul backward at d={d}, e={e} in {str(dtype).removeprefix('torch.')}: no "
                "launch configuration compiles without register spills on both sm_80 and sm_90")
    return None

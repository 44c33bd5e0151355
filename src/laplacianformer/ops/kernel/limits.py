"""What the Triton kernel backend serves, in pure Python (the registry asks without importing Triton;
``triton.py`` enumerates its specialisations within it): the kernel families the Triton code has a profile
for, and the range ``benchmarks/triton_aot.py --strict`` compiles and checks for register spills on sm_80 and
sm_90 (docs/KERNELS.md)."""

from __future__ import annotations

import torch

TRITON_KERNEL_IDS = frozenset({0, 1, 2, 3, 4})
"""The kernel families (``KernelSpec.id``) the Triton kernels have a profile for: the ids of
``_triton_common.PROFILES`` (which imports Triton; tests/ops/test_kernel_triton.py holds the two equal and each
id's distance its registry spec's)."""
TRITON_MAX_D = 128
TRITON_MAX_E = 128


def kernel_unserved(spec) -> str | None:
    """Why the Triton kernels cannot compute the family ``spec`` (a ``KernelSpec``: no profile for its id), or
    None."""
    if spec.id not in TRITON_KERNEL_IDS:
        return f"kernel {spec.name!r}: the Triton kernels have no profile for its id {spec.id}"
    return None


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def triton_unfit(l1: bool, d: int, e: int | None, dtype: torch.dtype) -> str | None:
    """Why no configuration of the Triton backward with V compiles without spills on both sm_80 and sm_90
    for these inputs, or None (pure Python: the registry asks it without importing Triton); ``l1``: the family
    accumulates |x − y| (``KernelSpec.l1``). The cases benchmarks/triton_aot.py found: the dY kernel with V of the
    squared-L2 accumulation (every family but the Laplacian) at d in (32, 64], e in (64, 128] (sm_90 spills at 4,
    8 and 16 warps; the backward runs in float32 for every input dtype). The registry refuses it when a gradient
    may be needed (the forward alone fits); ``triton.aot_specialisations`` leaves it out."""
    if l1 or e is None:
        return None
    if (_pow2(max(d, 16)), _pow2(max(e, 16))) == (64, 128):
        return (f"kernel_matmul backward of a squared-L2 kernel family at d={d}, e={e}: no "
                "launch configuration compiles without register spills on both sm_80 and sm_90")
    return None

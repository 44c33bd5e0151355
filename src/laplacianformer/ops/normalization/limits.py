"""What the Triton backend of the fused normalisation serves, in pure Python (the registry asks without
importing Triton; ``triton.py`` enumerates its specialisations within it): the range
``benchmarks/triton_aot.py --strict`` compiles and checks for register spills and shared memory on sm_80
and sm_90 (docs/KERNELS.md, "The fused normalisation")."""

from __future__ import annotations

import torch

TRITON_MAX_DIM = 64
"""Largest m (landmarks) and e (value features) of the Triton passes."""


def triton_unfit(dtype: torch.dtype, m: int, e: int) -> str | None:
    """Why the Triton passes have no specialisation for these m, e and input dtype that compiles without
    register spills within a block's shared memory on both sm_80 and sm_90, or None."""
    if max(m, e) > TRITON_MAX_DIM:
        return (f"m={m}, e={e}: the Triton passes take m, e <= {TRITON_MAX_DIM} "
                "(register tiles and shared memory)")
    return None

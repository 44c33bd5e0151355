"""Every C library of the CPU path, built now and described (``laplacianformer build``, ``info --dispatch``).

The libraries register themselves in ``_clib.LIBRARIES`` when their modules are imported; this module
imports those modules (so ``_clib`` itself imports none of them) and builds each (docs/KERNELS.md).
"""

from __future__ import annotations

from . import _clib, grid_cpu as _grid  # noqa: F401  (registers grid.c)
from .kernel import native as _kernel  # noqa: F401  (registers pairwise.c)
from .newton_schulz import native as _newton_schulz  # noqa: F401  (registers newton_schulz.c)
from .normalization import cpu as _normalization  # noqa: F401  (registers normalization.c)


def statuses() -> dict[str, str]:
    """Source file name -> ``CLibrary.status()`` of every library (building those not built yet)."""
    return {lib.src.name: lib.status() for lib in _clib.LIBRARIES}


def build_all() -> tuple[dict[str, str], bool]:
    """Builds every library now: (statuses, True when all are built)."""
    status = statuses()
    return status, all(s.startswith("built") for s in status.values())

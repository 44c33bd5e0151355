"""The CPU allocator setting of a timing run.

By default glibc returns freed large blocks to the kernel (``munmap``, heap trimming), so a later tensor of
that size starts on fresh pages and pays one page fault per 4 KiB on first touch (the repository's
``benchmarks/cpu_pitfalls.py`` measures the cost per page). Which tensors pay depends on the order of every
allocation in the process, so the same model's time moves between runs and between neighbouring variants.
``RETAINED_HEAP_ENV`` (``laplacianformer.heap``; the ``--retain-heap`` option of the timing benchmarks, which
restart the process with it) sets glibc's tunables so that freed memory stays mapped and is reused: times are
then steady-state compute. Both are worth reporting; ``allocator`` in the JSON settings says which one a file
holds.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from ..heap import RETAINED_HEAP_ENV, retaining
from .process import package_env


def allocator_setting() -> str:
    """'glibc-retain' when freed memory stays mapped in this process (``heap.retaining``), else 'default'."""
    return "glibc-retain" if retaining() else "default"


def reexec_with_retained_heap(module: str, argv: Sequence[str] | None = None) -> None:
    """Restarts this process as ``python -m module *argv`` (default: this process's arguments) with
    ``RETAINED_HEAP_ENV`` set, unless it is set already (glibc reads it only at start-up). Returns only in
    the already-set case."""
    if allocator_setting() == "glibc-retain":
        return
    args = list(sys.argv[1:] if argv is None else argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", module, *args], package_env(**RETAINED_HEAP_ENV))

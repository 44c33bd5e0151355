"""The CPU allocator setting of a timing run.

By default glibc returns freed large blocks to the kernel (``munmap``, heap trimming), so a later tensor of
that size starts on fresh pages and pays one page fault per 4 KiB on first touch (the repository's
``benchmarks/cpu_pitfalls.py`` measures the cost per page). Which tensors pay depends on the order of every
allocation in the process, so the same model's time moves between runs and between neighbouring variants.
``RETAINED_HEAP_ENV`` (the ``--retain-heap`` option of the timing benchmarks) sets glibc's tunables so that
freed memory stays mapped and is reused: times are then steady-state compute. Both are worth reporting;
``allocator`` in the JSON settings says which one a file holds.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from .process import package_env

RETAINED_HEAP_ENV = {
    "MALLOC_MMAP_THRESHOLD_": str(2**31 - 1),  # large blocks from the heap, not per-call mmap/munmap
    "MALLOC_TRIM_THRESHOLD_": str(2**31 - 1),  # never give the top of the heap back
    "MALLOC_TOP_PAD_": str(256 * 2**20),  # grow the heap in large steps
}
"""glibc tunables (read at process start) that keep freed memory mapped for reuse."""


def allocator_setting() -> str:
    """'glibc-retain' when ``RETAINED_HEAP_ENV`` is in effect for this process, else 'default'."""
    return "glibc-retain" if all(os.environ.get(k) == v for k, v in RETAINED_HEAP_ENV.items()) else "default"


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

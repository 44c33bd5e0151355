"""Keep freed memory mapped for reuse: the CPU allocator setting for inference (docs/DEPLOY.md, "The allocator").

With glibc's default settings every large block freed during a forward (a tensor over 128 KiB, and the top of
the heap past 128 KiB) goes back to the kernel, and the next tensor of its size starts on fresh pages: one page
fault per 4 KiB on first touch (``python -m benchmarks.allocator_ab`` counts them and times Tiny with each
setting). Two ways to keep the memory instead, for the whole process:

- before Python starts, glibc's tunables ``RETAINED_HEAP_ENV`` (what ``--retain-heap`` of the benchmarks sets);
- at run time, ``retain_freed_memory()`` (``mallopt``: large blocks from the heap, no trimming, 256 MiB of
  growth at a time), before the first forward.

Either way the process keeps its peak heap mapped until it exits, which for an inference process is the memory
it needed anyway. Neither changes any result.

    import laplacianformer
    laplacianformer.retain_freed_memory()      # True on glibc (Linux); False elsewhere, nothing changed
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

__all__ = ["RETAINED_HEAP_ENV", "retain_freed_memory", "retaining"]

_NEVER = 2**31 - 1  # a threshold no block reaches
_TOP_PAD = 256 * 2**20  # the heap grows in steps this large

RETAINED_HEAP_ENV = {
    "MALLOC_MMAP_THRESHOLD_": str(_NEVER),  # large blocks from the heap, not per-call mmap/munmap
    "MALLOC_TRIM_THRESHOLD_": str(_NEVER),  # never give the top of the heap back
    "MALLOC_TOP_PAD_": str(_TOP_PAD),  # grow the heap in large steps
}
"""glibc tunables (read at process start) that keep freed memory mapped for reuse."""

# mallopt parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_MAX = -1, -2, -4
_SETTINGS = ((_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, _NEVER), (_M_TOP_PAD, _TOP_PAD))
"""What ``retain_freed_memory`` sets: no block served by its own mmap (rather than a high mmap threshold: mallopt(3)
documents 32 MiB as its upper limit on 64-bit systems, and Tiny's activations at 1024² reach 128 MiB), no
trimming of the heap's top, growth in 256 MiB steps."""

_retained = False


def _glibc() -> bool:
    return sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


def retain_freed_memory() -> bool:
    """Sets this process's allocator (glibc) to keep freed memory mapped, from now on; see the module docstring.

    Returns True when every setting took, False where the C library is not glibc or refused one (then the
    settings already made stay, and the allocator still works: only the reuse is partial). Idempotent."""
    global _retained
    if _retained:
        return True
    if not _glibc():
        return False
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _retained = all(mallopt(param, value) == 1 for param, value in _SETTINGS)
    return _retained


def retaining() -> bool:
    """Whether freed memory stays mapped in this process: ``retain_freed_memory`` took, or ``RETAINED_HEAP_ENV``
    was in the environment at start-up (glibc)."""
    return _retained or (_glibc() and all(os.environ.get(k) == v for k, v in RETAINED_HEAP_ENV.items()))

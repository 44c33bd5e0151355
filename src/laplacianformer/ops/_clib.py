"""Build-at-first-use loader of the plain C sources of the CPU paths (docs/DESIGN.md §6).

``CLibrary(src, signatures)`` serves ``ops/kernel/csrc/pairwise.c``, ``ops/newton_schulz/csrc/newton_schulz.c``,
``ops/csrc/normalization.c`` and ``ops/csrc/grid.c``; each module exports its ``load``, ``available`` and ``load_error``. The
sources have no Python or torch headers: ``cc -O3 -march=native -fopenmp`` builds one in a few seconds
into a per-user cache (``$LAPLACIANFORMER_CACHE``, else ``$XDG_CACHE_HOME/laplacianformer``, else
``~/.cache/laplacianformer``), keyed by the source and the local headers it includes
(``ops/csrc/lf_template.h``), the flags and the CPU's feature flags, and it is loaded with ctypes (the GIL
is released during calls). ``laplacianformer build`` (``ops/builds.py``) builds every library ahead of time
(``scripts/setup.sh`` calls it), so no first call stalls for the compiler, and says what each library is
(``laplacianformer info --dispatch`` prints it too).
When disabled (LAPLACIANFORMER_NO_NATIVE=1) or when no C compiler works, ``load()`` returns None with the
reason in ``error()`` and the callers run their PyTorch code instead; a build that fails (not one disabled
on purpose) says so once per process in a ``RuntimeWarning`` naming the reason and the cost.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
import threading
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from ._runtime import constant_result

FLAGS = ["-O3", "-march=native", "-ffp-contract=fast", "-fopenmp", "-shared", "-fPIC", "-std=c99"]
SERIAL_WORK = 1 << 18
"""Below this many multiply-adds a C call runs on one thread (an OpenMP fork costs more than it saves)."""


def threads_for_work(work: int) -> int:
    """One thread for small problems, else torch's thread count."""
    return 1 if work < SERIAL_WORK else torch.get_num_threads()


def _cpu_signature() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


FALLBACK_COST = ("the CPU attention then runs its PyTorch fallback, about 2x slower per call "
                 "(docs/KERNELS.md, the CPU path)")
LIBRARIES: list["CLibrary"] = []  # every library of the package, in the order their modules were imported
_warned = threading.Event()


def cache_dir() -> Path:
    """Where the libraries are built: ``$LAPLACIANFORMER_CACHE``, else ``$XDG_CACHE_HOME/laplacianformer``,
    else ``~/.cache/laplacianformer`` (the XDG base-directory default)."""
    root = os.environ.get("LAPLACIANFORMER_CACHE")
    if root:
        return Path(root).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg and os.path.isabs(os.path.expanduser(xdg)) else Path.home() / ".cache"
    return base / "laplacianformer"


_LOCAL_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"', re.MULTILINE)


def source_text(src: Path) -> bytes:
    """The C source ``src`` followed by the local headers it includes (``#include "..."``, relative to the
    including file, recursively, each once): what its build depends on besides the compiler and flags."""
    parts, seen, todo = [], set(), [src.resolve()]
    while todo:
        path = todo.pop(0)
        if path in seen:
            continue
        seen.add(path)
        data = path.read_bytes()
        parts.append(data)
        todo += [(path.parent / name.decode()).resolve() for name in _LOCAL_INCLUDE.findall(data)]
    return b"".join(parts)


def build(cc: str, src: Path) -> Path:
    """The shared library of the C source ``src``, built into the cache unless it is there already (named
    after the source's stem and a hash of the source with its local headers, flags and CPU)."""
    key = hashlib.sha256(
        source_text(src) + " ".join([cc, *FLAGS]).encode() + _cpu_signature().encode()
    ).hexdigest()[:16]
    target = cache_dir() / f"{src.stem}-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        # An absolute path: pairwise.c includes itself through __FILE__ (once per scalar type).
        path = str(src.resolve())
        proc = subprocess.run([cc, *FLAGS, "-o", tmp, path], capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"{cc} failed: {proc.stderr.strip()[:500]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


class CLibrary:
    """The C source ``src`` built and loaded once, with its ctypes signatures set by ``signatures(lib)``.

    ``available()`` is ``load() is not None``, a constant to torch.compile (which cannot trace the build);
    it is a plain function, not a method, so that torch.compile takes it as one."""

    def __init__(self, src: Path, signatures: Callable[[ctypes.CDLL], None]):
        self.src = src
        self.signatures = signatures
        self._lib: ctypes.CDLL | None = None
        self._error = ""
        self._tried = False
        self._lock = threading.Lock()
        self.path: Path | None = None
        LIBRARIES.append(self)
        self.available: Callable[[], bool] = constant_result(lambda: self.load() is not None)

    def load(self) -> ctypes.CDLL | None:
        """The compiled library, or None (see ``error()``); the first call builds it. Set
        LAPLACIANFORMER_NO_NATIVE=1 to disable."""
        if not self._tried:
            with self._lock:
                if not self._tried:
                    self._lib = self._load()
                    self._tried = True
        return self._lib

    def error(self) -> str:
        """Why ``load()`` returned None ('' when it did not)."""
        return self._error

    def _load(self) -> ctypes.CDLL | None:
        if os.environ.get("LAPLACIANFORMER_NO_NATIVE", "0") not in ("", "0"):
            self._error = "disabled by LAPLACIANFORMER_NO_NATIVE"
            return None
        cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
        if cc is None:
            self._error = "no C compiler (cc/gcc) on PATH"
            return None
        try:
            self.path = build(cc, self.src)
            lib = ctypes.CDLL(str(self.path))
            self.signatures(lib)
        except Exception as exc:
            self._error = f"{type(exc).__name__}: {exc}"
            self._warn()
            return None
        return lib

    def _warn(self) -> None:
        """One RuntimeWarning per process for a failed build: the library, the reason, the cost, the remedy."""
        if _warned.is_set():
            return
        _warned.set()
        warnings.warn(f"laplacianformer: the C kernels of {self.src.name} could not be built ({self._error[:300]}); "
                      f"{FALLBACK_COST}. Run `laplacianformer build` to see every library's status; set CC to a "
                      f"working C compiler or LAPLACIANFORMER_CACHE to a writable folder (now {cache_dir()}).",
                      RuntimeWarning, stacklevel=2)

    def status(self) -> str:
        """'built PATH', 'disabled (...)' or 'unavailable (reason)', after trying to load it."""
        if self.load() is not None:
            return f"built {self.path}"
        state = "disabled" if self._error.startswith("disabled") else "unavailable"
        return f"{state} ({self._error})"

"""Runtime state of the ops layer, in one place (docs/DESIGN.md §6): backend choices, graph capture, recording.

- Backend choices: every dispatched op (``ops/dispatch.py``) reads its choice here, ``"auto"`` unless
  forced. ``use(...)`` forces choices inside a ``with`` block (thread-local, nestable; the innermost
  block wins), ``configure(...)`` sets the process-wide defaults under the blocks.
  ``use(reference=True)`` forces every op to its reference backend (plain PyTorch).
- ``capture_reason()`` / ``capturing()``: torch.compile, torch.jit tracing or scripting, torch.onnx
  export, (``streams=True``) a CUDA graph capturing the current stream, or (``modes=True``) a Python
  dispatch or function mode such as FlopCounterMode, which must see the ops.
- ``graph_ops()``: whether the public ops call their custom ops (torch.compile / torch.export tracing).
- ``triton_available()`` / ``triton_interpreted()``: whether Triton imports, whether it runs in its
  CPU interpreter (TRITON_INTERPRET=1).
- ``constant_result(fn)``: torch.compile's ``assume_constant_result`` without importing dynamo.
- Recording (``recording()``) and the log-once memory of the dispatcher.

This module imports nothing from the package; every other ops module may import it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import threading

import torch

AUTO = "auto"

_ops: dict[str, tuple[tuple[str, ...], str]] = {}  # op -> (backend names, reference backend)
_defaults: dict[str, str] = {}  # process-wide choices (configure)
_local = threading.local()  # .frames: list of dicts, the merged choices of each open use() block
_recorder: list[list] = []  # the open recordings (innermost last); every thread's calls are recorded
_logged: set = set()


def register_op(name: str, backends: tuple[str, ...], reference: str) -> None:
    """Declares op ``name`` with its backend names (called by ``dispatch.Op``)."""
    _ops[name] = (tuple(backends), reference)


def ops() -> dict[str, tuple[tuple[str, ...], str]]:
    """{op name: (backend names, reference backend)} of every registered op."""
    return dict(_ops)


def _checked(reference: bool | None, choices: dict[str, str]) -> dict[str, str]:
    """The choices a ``use``/``configure`` call sets: reference expanded per op, ``kernel`` also applied
    to ``kernel_matmul`` unless that is given; names validated against the registered ops."""
    out: dict[str, str] = {}
    if reference is not None:
        for op, (_, ref) in _ops.items():
            out[op] = ref if reference else AUTO
    if "kernel" in choices and "kernel_matmul" not in choices and "kernel_matmul" in _ops:
        choices = {**choices, "kernel_matmul": choices["kernel"]}
    for op, name in choices.items():
        if op not in _ops:
            raise ValueError(f"{op}: expected an op among {sorted(_ops)}, got {op!r}")
        allowed = (AUTO, *_ops[op][0])
        if name not in allowed:
            raise ValueError(f"{op}: expected one of {list(allowed)}, got {name!r}")
        out[op] = name
    return out


def _frames() -> list[dict[str, str]]:
    frames = getattr(_local, "frames", None)
    if frames is None:
        frames = _local.frames = []
    return frames


@contextlib.contextmanager
def use(reference: bool | None = None, **choices: str):
    """``with use(kernel="composite", newton_schulz="torch"): ...`` forces those ops' backends in this
    thread for the block; ``use(reference=True)`` forces every op to its reference backend, and
    ``use(reference=False)`` every op back to ``"auto"`` (explicit choices in the same call win).
    ``kernel=`` also sets ``kernel_matmul=`` unless that is given. Blocks nest; the innermost wins."""
    frames = _frames()
    merged = {**(frames[-1] if frames else {}), **_checked(reference, choices)}
    frames.append(merged)
    try:
        yield merged
    finally:
        frames.pop()


def configure(reference: bool | None = None, **choices: str) -> None:
    """Process-wide defaults under every ``use`` block (same arguments as ``use``)."""
    _defaults.update(_checked(reference, choices))


def choice(op: str) -> str:
    """The backend name forced for ``op`` (innermost ``use`` block, else ``configure``), or ``"auto"``."""
    frames = getattr(_local, "frames", None)
    if frames:
        name = frames[-1].get(op)
        if name is not None:
            return name
    return _defaults.get(op, AUTO)


def choices_token() -> tuple:
    """The backend choices in force in this thread (the innermost ``use`` block over ``configure``) as a
    hashable value: what a plan cached per call signature keys on besides the inputs (``ops/lean.py``)."""
    frames = getattr(_local, "frames", None)
    return (tuple(sorted(frames[-1].items())) if frames else (), tuple(sorted(_defaults.items())))


def onnx_exporting() -> bool:
    try:
        return bool(torch.onnx.is_in_onnx_export())
    except Exception:  # pragma: no cover
        return False


def stream_capturing() -> bool:
    """True while a CUDA graph captures the current stream (``torch.cuda.graph``, ``make_graphed_callables``,
    ``torch.compile(mode="reduce-overhead")``'s replay recording): the kernels are recorded, not run, so no
    host synchronisation (``.item()``, ``bool(tensor)``) may happen and no tensor made now may be cached
    for later eager calls (its contents exist only in the replays). Asks nothing of CUDA before it is
    initialised (no capture can be open then)."""
    return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


def capture_reason(*, modes: bool = True, streams: bool = True) -> str | None:
    """Why the ops are being captured rather than run eagerly, or None.

    torch.compile (asked first: dynamo folds it and traces none of the later checks), torch.jit tracing
    or scripting, torch.onnx export; with ``streams`` a CUDA graph capturing the current stream (the
    data-dependent checks are then skipped, caches not filled; ``streams=False`` for callers that only
    refuse graph *tracing*: an eager backend runs as it is under stream capture); with ``modes`` also an
    active Python dispatch or function mode (FlopCounterMode, FakeTensorMode, ...)."""
    if torch.compiler.is_compiling():
        return "torch.compile is tracing"
    if torch.jit.is_tracing() or torch.jit.is_scripting():
        return "torch.jit is tracing or scripting"
    if onnx_exporting():
        return "torch.onnx export in progress"
    if streams and stream_capturing():
        return "a CUDA graph is capturing the stream (no host synchronisation, no caching)"
    if modes and (torch._C._len_torch_dispatch_stack() or torch._C._is_torch_function_mode_enabled()):
        return "a dispatch or function mode (e.g. FlopCounterMode) is active and must see the ops"
    return None


def graph_ops() -> bool:
    """True while torch.compile or torch.export traces (not ONNX export): the public kernel and solver
    functions then call their ``torch.library`` custom ops (``laplacianformer::laplace_kernel`` ...), so
    the graph holds one op per call and the registry runs inside the op's real implementation. Eager
    calls go to the registry directly (docs/DESIGN.md §6.5)."""
    return torch.compiler.is_compiling() and not onnx_exporting()


def capturing(*, modes: bool = True, streams: bool = True) -> bool:
    """``capture_reason(modes=modes, streams=streams) is not None``."""
    return capture_reason(modes=modes, streams=streams) is not None


def constant_result(fn):
    """``torch.compiler.assume_constant_result(fn)`` without importing ``torch._dynamo`` (1 s of
    ``import laplacianformer``): the decorator only marks ``fn`` with the attribute dynamo reads when it
    traces a call (tests/test_startup.py checks that both mark alike); once dynamo is loaded its own
    decorator runs."""
    if "torch._dynamo" in sys.modules:
        return torch.compiler.assume_constant_result(fn)
    fn._dynamo_marked_constant = True
    return fn


_triton_probe: list[tuple[bool, str]] = []


@constant_result
def triton_available() -> tuple[bool, str]:
    """(True, "") when ``import triton`` works, else (False, reason); probed once (a constant to
    torch.compile)."""
    if not _triton_probe:
        _triton_probe.append(_probe_triton())
    return _triton_probe[0]


def _probe_triton() -> tuple[bool, str]:
    if importlib.util.find_spec("triton") is None:
        return False, "the triton package is not installed"
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception as exc:  # pragma: no cover - depends on the installation
        return False, f"import triton failed ({type(exc).__name__}: {exc})"
    return True, ""


def triton_interpreted() -> bool:
    """True when Triton runs in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@contextlib.contextmanager
def recording():
    """``with recording() as calls:`` collects one entry per dispatched call made meanwhile, from any
    thread (the autograd engine runs CUDA backward passes on its own threads)."""
    calls: list = []
    _recorder.append(calls)
    try:
        yield calls
    finally:
        del _recorder[next(i for i, c in enumerate(_recorder) if c is calls)]  # by identity: lists compare equal


def record(entry) -> None:
    for calls in _recorder:
        calls.append(entry)


def is_recording() -> bool:
    return bool(_recorder)


def first_time(key) -> bool:
    """True the first time ``key`` is seen in this process (log-once memory of the dispatcher)."""
    if key in _logged:
        return False
    _logged.add(key)
    return True


def forget_logged() -> None:
    """Clears the log-once memory (tests)."""
    _logged.clear()

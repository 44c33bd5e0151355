"""Backend selection for the kernel primitives (DESIGN.md §6).

Backends:
- ``"composite"``: torch.cdist (L1) or matmul (squared L2) then exp; portable, ONNX-exportable.
- ``"naive"``: the broadcasting reference of ``naive.py``; materialises (..., N, M, d), tests only.
- ``"cpu"``: the fast CPU path of ``cpu.py`` (float32/float64 CPU tensors).
- ``"triton"``: the fused Triton kernels of ``triton.py`` (CUDA tensors, or any device under
  ``TRITON_INTERPRET=1``).
- ``"auto"`` (default): triton on CUDA when Triton imports, cpu on CPU, composite otherwise and while
  exporting to ONNX.

``set_backend(name)`` sets the process-wide choice, ``backend(name)`` sets it inside a ``with`` block
(thread-local), and ``explain_dispatch(x, y, ...)`` says which backend a call runs and why each other
one was refused. A forced backend that cannot run raises a ValueError listing the reasons.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import os
import threading

import torch

BACKENDS = ("auto", "composite", "naive", "cpu", "triton")
_FAST = ("triton", "cpu")

_log = logging.getLogger("laplacianformer.ops.kernel")
_state = threading.local()
_global = {"name": "auto"}
_warned: set = set()


def _check_name(name: str) -> str:
    if name not in BACKENDS:
        raise ValueError(f"name: expected one of {list(BACKENDS)}, got {name!r}")
    return name


def set_backend(name: str) -> None:
    """Selects the backend for every later call in this process (one of ``BACKENDS``)."""
    _global["name"] = _check_name(name)


def get_backend() -> str:
    """The backend in force: the innermost ``backend(...)`` block, else the ``set_backend`` value."""
    stack = getattr(_state, "stack", None)
    return stack[-1] if stack else _global["name"]


@contextlib.contextmanager
def backend(name: str):
    """``with backend("composite"): ...`` runs the kernel primitives on that backend (thread-local)."""
    _check_name(name)
    stack = getattr(_state, "stack", None)
    if stack is None:
        stack = _state.stack = []
    stack.append(name)
    try:
        yield name
    finally:
        stack.pop()


@functools.lru_cache(maxsize=1)
def triton_available() -> tuple[bool, str]:
    """(True, "") when ``import triton`` works, else (False, reason)."""
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


def _onnx_exporting() -> bool:
    try:
        return bool(torch.onnx.is_in_onnx_export())
    except Exception:  # pragma: no cover
        return False


def _refusal(name: str, tensors, kind: str, op: str) -> str | None:
    """None when backend ``name`` can run this call, else the reason it cannot."""
    devices = {t.device.type for t in tensors}
    dtypes = {t.dtype for t in tensors}
    if name in ("composite", "naive"):
        return None
    if _onnx_exporting():
        return "torch.onnx export in progress (custom kernels are not exportable)"
    if len(dtypes) != 1:
        return f"mixed dtypes {sorted(str(d) for d in dtypes)}"
    dtype = dtypes.pop()
    if name == "cpu":
        if devices != {"cpu"}:
            return f"tensors on {sorted(devices)}, not cpu"
        if dtype not in (torch.float32, torch.float64):
            return f"dtype {dtype} (the CPU path takes float32/float64)"
        return None
    ok, why = triton_available()
    if not ok:
        return why
    if devices != {"cuda"} and not triton_interpreted():
        return f"tensors on {sorted(devices)}, not cuda (set TRITON_INTERPRET=1 to run Triton on the CPU)"
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return f"dtype {dtype} (the Triton kernels take float32/float16/bfloat16)"
    d = tensors[0].shape[-1]
    if d > 128:
        return f"feature dim d={d} > 128 (the (N, M, d) register tile would not fit)"
    if op == "matmul" and tensors[2].shape[-1] > 256:
        return f"value dim e={tensors[2].shape[-1]} > 256"
    return None


def _choose(tensors, kind: str, op: str) -> tuple[str, dict[str, str]]:
    """(backend that runs, {refused backend: reason})."""
    wanted = get_backend()
    refused: dict[str, str] = {}
    if wanted != "auto":
        why = _refusal(wanted, tensors, kind, op)
        if why is not None:
            refused[wanted] = why
            raise ValueError(f"backend: {wanted!r} cannot run this call: {why}")
        return wanted, refused
    for name in _FAST:
        why = _refusal(name, tensors, kind, op)
        if why is None:
            if name == "triton" and tensors[0].device.type == "cpu":
                refused[name] = "only chosen automatically for CUDA tensors (the interpreter is for tests)"
                continue
            if name == "cpu":
                from . import native

                if native.load() is None:
                    refused[name] = (
                        f"C loops unavailable ({native.load_error()}); its PyTorch fallback is slower than the composite"
                    )
                    continue
            return name, refused
        refused[name] = why
    return "composite", refused


def select(tensors, kind: str, op: str) -> str:
    """The backend a call runs on; logs once per reason when "auto" falls back to the composite."""
    name, refused = _choose(tensors, kind, op)
    if name == "composite" and get_backend() == "auto":
        key = tuple(sorted(refused.items()))
        if key not in _warned and not _onnx_exporting():
            _warned.add(key)
            _log.info(
                "laplace kernel (%s): falling back to the torch.cdist composite; %s",
                op,
                "; ".join(f"{k}: {v}" for k, v in refused.items()),
            )
    return name


def explain_dispatch(
    x: torch.Tensor, y: torch.Tensor, v: torch.Tensor | None = None, kind: str = "laplacian"
) -> str:
    """Which backend ``laplace_kernel`` (v=None) or ``laplace_kernel_matmul`` (v given) runs for these
    inputs under the current selection, and why each other backend was refused."""
    tensors = (x, y) if v is None else (x, y, v)
    op = "kernel" if v is None else "matmul"
    wanted = get_backend()
    try:
        name, refused = _choose(tensors, kind, op)
    except ValueError as exc:
        return f"selection {wanted!r}: refused: {exc}"
    lines = [f"selection {wanted!r}: runs {name!r} for {op} on {x.device.type} {x.dtype}, kind={kind}"]
    for other in BACKENDS[1:]:
        if other == name:
            continue
        why = refused.get(other) or _refusal(other, tensors, kind, op)
        if why is None:
            why = "available, not preferred" if wanted == "auto" else f"not selected (selection is {wanted!r})"
        lines.append(f"  {other}: {why}")
    return "\n".join(lines)


def flatten_batch(t: torch.Tensor) -> torch.Tensor:
    """(..., R, C) -> contiguous (B, R, C) with B the product of the leading dimensions (the fast paths' layout)."""
    return t.reshape(-1, t.shape[-2], t.shape[-1]).contiguous()

"""The kernel primitives' selection API of earlier releases, kept as thin wrappers over the runtime
(``ops/_runtime.py``) and the registry (``ops/dispatch.py``); docs/DESIGN.md §6.

- ``backend(name)``: ``with backend("composite"): ...`` forces the kernel primitives (``laplace_kernel``
  and ``laplace_kernel_matmul``) to ``name`` in this thread; "composite" and "naive" also force the
  Newton–Schulz solve and its implicit backward to their torch reference, as before. Equivalent to
  ``_runtime.use(kernel=name, ...)``.
- ``set_backend(name)``: the same, process-wide (``_runtime.configure``).
- ``get_backend()``: the kernel selection in force.
- ``explain_dispatch(x, y, v=None)``: ``dispatch.explain("kernel", x, y)`` or
  ``explain("kernel_matmul", x, y, v)``.
"""

from __future__ import annotations

import contextlib

import torch

from .. import _runtime
from ..dispatch import explain

BACKENDS = ("auto", "composite", "naive", "cpu", "triton")


def _choices(name: str) -> dict[str, str]:
    if name not in BACKENDS:
        raise ValueError(f"name: expected one of {list(BACKENDS)}, got {name!r}")
    choices = {"kernel": name, "kernel_matmul": name}
    if name in ("auto", "composite", "naive"):
        solver = "auto" if name == "auto" else "torch"
        choices.update(newton_schulz=solver, newton_schulz_grad=solver)
    return choices


def set_backend(name: str) -> None:
    """Selects the kernel backend for every later call in this process (one of ``BACKENDS``)."""
    _runtime.configure(**_choices(name))


def get_backend() -> str:
    """The kernel backend in force: the innermost ``backend``/``use`` block, else the process default."""
    return _runtime.choice("kernel")


@contextlib.contextmanager
def backend(name: str):
    """``with backend("composite"): ...`` runs the kernel primitives on that backend (thread-local)."""
    with _runtime.use(**_choices(name)):
        yield name


def explain_dispatch(
    x: torch.Tensor, y: torch.Tensor, v: torch.Tensor | None = None, kind: str = "laplacian"
) -> str:
    """Which backend ``laplace_kernel`` (v=None) or ``laplace_kernel_matmul`` (v given) runs for these
    inputs under the current selection, and why each other backend does not."""
    if v is None:
        return explain("kernel", x, y, 4.0, kind)
    return explain("kernel_matmul", x, y, v, 4.0, kind)

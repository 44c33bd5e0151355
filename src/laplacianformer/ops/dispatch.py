"""One backend registry for every op of the ops layer (docs/DESIGN.md §6).

An op is an ordered table of ``Backend`` records: a name, the callable, and ``refusal(*inputs)``, which
gives in words why the backend cannot serve these inputs (None when it can). ``auto_refusal`` gives why
automatic selection passes over a backend that could serve (e.g. the Triton interpreter on the CPU).
The rule, the same for every op:

- automatic selection (choice ``"auto"``) runs the first backend that serves and is not passed over;
- a forced backend (``_runtime.use(op=name)`` or ``configure``) runs if it serves, else the call
  raises ``BackendRefused`` (a ``ValueError``) with the reason.

The last backend of a table is the op's reference and must serve every input. Adding a backend is one
entry in the op's table. ``explain(op, *inputs)`` says which backend serves and why each other one does
not; ``attention.explain_all`` does it for every call of the attention operator.

Ops: ``kernel`` and ``kernel_matmul`` (``ops/kernel``), ``newton_schulz`` and ``newton_schulz_grad``
(``ops/newton_schulz``), ``normalization`` (``ops/normalization``), ``pooling`` (``ops/pooling.py``),
``recompute`` (``ops/recompute.py``: the lean recompute of the attention core or activation checkpointing),
``streaming`` and ``landmark_solve`` (``ops/streaming``: the fused inference passes and landmark solve).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import _runtime

__all__ = ["Backend", "BackendRefused", "Op", "get_op", "op_names", "explain", "describe_inputs", "selections"]

_OPS: dict[str, "Op"] = {}
_trace = threading.local()  # .selections: the list an open ``selections()`` block fills, or None


@contextlib.contextmanager
def selections():
    """``with selections() as trace:`` collects (op, backend) of every selection this thread makes inside the
    block, in order: what a call signature's plan is made from (``ops/lean.py``). Blocks do not nest."""
    trace: list[tuple[str, str]] = []
    _trace.selections = trace
    try:
        yield trace
    finally:
        _trace.selections = None


class BackendRefused(ValueError):
    """A forced backend cannot serve the call; the message ends with the reason."""


def _serves(*_inputs) -> str | None:
    return None


@dataclass(frozen=True)
class Backend:
    """One implementation of an op: ``run(*inputs)``; ``refusal(*inputs)`` -> reason it cannot, or None;
    ``auto_refusal(*inputs)`` -> reason automatic selection skips it although it serves, or None;
    ``grad``: where an op has a custom-op form for torch.compile (docs/DESIGN.md §6.5) or a saving form, the
    backend's backward as a function without autograd (its arguments are documented by the op);
    ``saving``: where a caller runs the backward itself (the lean recompute, docs/DESIGN.md §5.5), the
    forward without autograd returning the output and the tensors ``grad`` needs besides the inputs;
    ``scaled``: where a backend applies an op's output scale in its own pass (the normalisation's §4.6 scale),
    the forward without autograd with that scale as one more argument."""

    name: str
    run: Callable
    refusal: Callable[..., str | None] = _serves
    auto_refusal: Callable[..., str | None] = _serves
    grad: Callable | None = None
    saving: Callable | None = None
    scaled: Callable | None = None


class Op:
    """An ordered table of backends under one name; ``op(*inputs)`` runs the selected backend.

    ``log``: a logger name; when given, automatic selection falling back to the reference backend logs
    the other backends' reasons once per distinct set of reasons (INFO). ``signature``: the inputs every
    backend takes, in words (shown by ``repr``)."""

    def __init__(self, name: str, backends: list[Backend], *, log: str | None = None, signature: str = ""):
        self.name = name
        self.backends = tuple(backends)
        self.by_name = {b.name: b for b in self.backends}
        self.reference = self.backends[-1].name
        self.log = log
        self.signature = signature
        _OPS[name] = self
        _runtime.register_op(name, tuple(self.by_name), self.reference)

    def __repr__(self) -> str:
        return f"Op({self.name!r}: {' > '.join(self.by_name)}; {self.signature})"

    def _choose(self, inputs) -> Backend:
        wanted = _runtime.choice(self.name)
        if wanted != _runtime.AUTO:
            chosen = self.by_name[wanted]
            why = chosen.refusal(*inputs)
            if why is not None:
                raise BackendRefused(f"backend: {wanted!r} cannot run this {self.name} call: {why}")
            return chosen
        for b in self.backends:
            if b.refusal(*inputs) is None and b.auto_refusal(*inputs) is None:
                return b
        return self.backends[-1]

    def select(self, *inputs) -> Backend:
        """The backend that runs ``inputs`` under the current choice (see the module docstring); logs an
        automatic fallback (``log``) and reports the decision to an open ``_runtime.recording()``."""
        chosen = self._choose(inputs)
        trace = getattr(_trace, "selections", None)
        if trace is not None:
            trace.append((self.name, chosen.name))
        if (
            self.log is not None
            and chosen.name == self.reference
            and _runtime.choice(self.name) == _runtime.AUTO
            and not _runtime.capturing(modes=False)
        ):
            refused = tuple((b.name, self._why(b, inputs)) for b in self.backends[:-1])
            if refused and _runtime.first_time((self.name, refused)):
                logging.getLogger(self.log).info(
                    "%s: falling back to the %s backend; %s",
                    self.name, self.reference, "; ".join(f"{k}: {v}" for k, v in refused),
                )
        if _runtime.is_recording():
            _runtime.record((self.name, describe_inputs(inputs), self.explain(*inputs)))
        return chosen

    def __call__(self, *inputs):
        return self.select(*inputs).run(*inputs)

    def reasons(self, *inputs) -> dict[str, str | None]:
        """{backend: why automatic selection would not run it, or None where it would serve}."""
        return {b.name: self._why(b, inputs) for b in self.backends}

    @staticmethod
    def _why(b: Backend, inputs) -> str | None:
        why = b.refusal(*inputs)
        if why is None:
            why = b.auto_refusal(*inputs)
            if why is not None:
                why = f"not chosen automatically: {why}"
        return why

    def explain(self, *inputs) -> str:
        """Which backend runs ``inputs`` under the current choice, and why each other one does not."""
        wanted = _runtime.choice(self.name)
        head = f"{self.name}: selection {wanted!r}"
        try:
            chosen = self._choose(inputs)
        except BackendRefused as exc:
            return f"{head} refused: {exc}"
        lines = [f"{head} runs {chosen.name!r}"]
        for b in self.backends:
            if b is chosen:
                continue
            if wanted == _runtime.AUTO:
                why = self._why(b, inputs) or "serves, lower in the order"
            else:
                why = b.refusal(*inputs) or f"serves, not selected (selection is {wanted!r})"
            lines.append(f"  {b.name}: {why}")
        return "\n".join(lines)


def get_op(name: str) -> Op:
    if name not in _OPS:
        raise ValueError(f"op: expected one of {sorted(_OPS)}, got {name!r}")
    return _OPS[name]


def op_names() -> tuple[str, ...]:
    return tuple(_OPS)


def explain(op: str, *inputs) -> str:
    """Which backend of ``op`` serves ``inputs`` (the op's own arguments, e.g. ``explain("kernel", x, y)``
    or ``explain("newton_schulz", p)``) under the current choices, and why each other backend does not."""
    return get_op(op).explain(*inputs)


def describe_inputs(inputs) -> str:
    """Short text of the tensors among ``inputs``: shape, dtype and device of each."""
    parts = []
    for t in inputs:
        if isinstance(t, torch.Tensor):
            parts.append(f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')} {t.device.type}")
    return ", ".join(parts)

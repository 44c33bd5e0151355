"""SIGINT/SIGTERM as a flag that the training loops (``train``, ``detection``) check at step boundaries, so an
interrupted run checkpoints a consistent state before it returns."""

from __future__ import annotations

import signal
import threading

from .distributed import DistInfo, broadcast_object


class StopFlag:
    """``with StopFlag() as stop:`` records SIGINT/SIGTERM in ``stop.signum`` instead of raising (main thread
    only; the previous handlers come back on exit)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict[int, object] = {}

    def __enter__(self) -> "StopFlag":
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                self._old[s] = signal.signal(s, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.signum = signum

    def __exit__(self, *exc) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)

    def received(self, info: DistInfo) -> str | None:
        """The name of the signal rank 0 has received, or None: every rank stops at the same step."""
        signum = broadcast_object(self.signum, info)
        return None if signum is None else signal.Signals(signum).name

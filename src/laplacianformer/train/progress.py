"""Progress of long loops: tqdm bars on a terminal, else a short line at least every 30 s.

    mode = progress_mode(progress)                # "bars", "lines" or "off"
    line = ProgressLine("train", total=437, unit="step")
    line.update(images=64, loss=2.31, note="epoch 1/3")   # prints when 30 s have passed since the last line
    # -> "train  step 120/437  epoch 1/3  31.2 img/s  loss 2.3100  ETA 2:51"

Used by ``train``, ``eval``, ``predict`` and ``detect train``. The interval is ``EVERY`` seconds (30), or
``$LAPLACIANFORMER_PROGRESS_SECONDS``; the clock is injectable (tests need no sleeping).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

EVERY = 30.0
ENV_EVERY = "LAPLACIANFORMER_PROGRESS_SECONDS"


def interval() -> float:
    """Seconds between two lines: ``$LAPLACIANFORMER_PROGRESS_SECONDS`` when set (> 0), else ``EVERY``."""
    text = os.environ.get(ENV_EVERY)
    if not text:
        return EVERY
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"{ENV_EVERY}: expected a number of seconds > 0, got {text!r}")
    return value


def is_terminal(stream=None) -> bool:
    """Whether ``stream`` (default stderr) is a terminal."""
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty is not None and isatty())
    except ValueError:  # a closed stream
        return False


def progress_mode(progress: bool | str, stream=None) -> str:
    """``"bars"``, ``"lines"`` or ``"off"`` for a ``progress`` setting: True -> tqdm bars when ``stream``
    (default stderr) is a terminal, else lines; ``"lines"`` -> lines; False / None / ``"off"`` -> nothing."""
    if progress is True:
        return "bars" if is_terminal(stream) else "lines"
    if progress in (False, None, "off"):
        return "off"
    if progress in ("bars", "lines"):
        return progress
    raise ValueError(f"progress: expected True, False, 'bars', 'lines' or 'off', got {progress!r}")


def format_duration(seconds: float) -> str:
    """``M:SS``, or ``H:MM:SS`` from an hour on."""
    s = max(0, int(round(seconds)))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class ProgressLine:
    """Counts ``total`` units (steps, batches, images) from ``start`` and writes one line when ``every``
    seconds have passed since the last one (or since the start): units done, images per second over that
    window, the window's mean of each value given to ``update`` (e.g. the loss), ETA at the rate since the
    start. ``enabled=False`` counts nothing and writes nothing."""

    def __init__(self, label: str, total: int, *, unit: str = "step", start: int = 0, every: float | None = None,
                 clock: Callable[[], float] = time.monotonic, write: Callable[[str], None] = _stderr,
                 enabled: bool = True) -> None:
        self.label, self.total, self.unit = label, int(total), unit
        self.every = interval() if every is None else float(every)
        self.clock, self.write, self.enabled = clock, write, enabled
        self.done = self.start = int(start)
        self.t_start = self.t_last = clock()
        self._images = 0
        self._sums: dict[str, float] = {}
        self._counts: dict[str, int] = {}

    def update(self, n: int = 1, *, images: int = 0, note: str = "", **values: float) -> str | None:
        """Count ``n`` units and ``images`` images; ``values`` (floats) are averaged over the window, ``note``
        is shown as it is. Returns the line written, or None."""
        if not self.enabled:
            return None
        self.done += n
        self._images += images
        for key, v in values.items():
            if v is not None:
                self._sums[key] = self._sums.get(key, 0.0) + float(v)
                self._counts[key] = self._counts.get(key, 0) + 1
        now = self.clock()
        if now - self.t_last < self.every:
            return None
        line = self._line(now, note)
        self.t_last, self._images, self._sums, self._counts = now, 0, {}, {}
        self.write(line)
        return line

    def _line(self, now: float, note: str) -> str:
        parts = [self.label, f"{self.unit} {self.done}/{self.total}"]
        if note:
            parts.append(note)
        window = max(now - self.t_last, 1e-9)
        if self._images:
            parts.append(f"{self._images / window:.1f} img/s")
        parts += [f"{k} {self._sums[k] / self._counts[k]:.4f}" for k in self._sums]
        done = self.done - self.start
        if 0 < done and self.done < self.total:
            parts.append("ETA " + format_duration((self.total - self.done) * (now - self.t_start) / done))
        return "  ".join(parts)

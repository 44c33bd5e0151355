"""Checks of an exported ONNX file against the eager model: error and onnxruntime time per input size.

``check_onnx(model, path, sizes)`` runs the same random batch through the eager model (float32, no grad)
and onnxruntime (CPU) at each (H, W) of ``sizes`` and reports, per size and over every output (the logits,
or each feature map of a ``features_only`` backbone):

    max_abs = max |ort - eager|,   relative = max |ort - eager| / max |eager|

and the median wall times of ``runs`` onnxruntime and eager calls, made in turn after the calls that gave
the error (their warm-up), onnxruntime with as many intra-op threads as torch has. ``ExportMismatch`` (a
ValueError naming the size) when a relative error exceeds the tolerance; the ``laplacianformer export``
command prints the table. Time and peak memory of whole models: ``laplacianformer bench onnx_deploy``.
"""

from __future__ import annotations

import os
import statistics
import time

import torch
from torch import nn

from .export import require

__all__ = ["ExportMismatch", "check_onnx", "format_checks", "relative_error"]


class ExportMismatch(ValueError):
    """onnxruntime differs from eager mode by more than the tolerance at some input size."""


def relative_error(out, ref) -> tuple[float, float]:
    """(max |out - ref|, max |out - ref| / max |ref|) of two arrays (the second 0/0 -> 0)."""
    import numpy as np

    out, ref = np.asarray(out, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    if out.shape != ref.shape:
        raise ExportMismatch(f"output shape {out.shape} differs from eager mode's {ref.shape}")
    diff = float(np.abs(out - ref).max(initial=0.0))
    scale = float(np.abs(ref).max(initial=0.0))
    return diff, (diff / scale if scale > 0 else diff)


def _outputs(y) -> list[torch.Tensor]:
    return list(y) if isinstance(y, (list, tuple)) else [y]


def check_onnx(model: nn.Module, path: str | os.PathLike, sizes, *, batch: int = 1, in_chans: int = 3,
               runs: int = 3, tolerance: float | None = 1e-4, seed: int = 0) -> list[dict]:
    """One row per (H, W) of ``sizes``: {"size", "max_abs", "relative", "ort_ms", "eager_ms"} (module docstring).

    model: the eager model (put in eval mode); path: its ONNX export; batch, in_chans: the input's (B, C);
    runs: onnxruntime and eager calls timed per size, in turn (medians); tolerance: ExportMismatch when a
    relative error exceeds it, after every size was measured (None: no check). Inputs are ``torch.randn`` with
    ``seed``."""
    require("onnxruntime")
    import onnxruntime as ort

    model.eval()
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for h, w in sizes:
        x = torch.randn(batch, in_chans, h, w, generator=gen)
        with torch.no_grad():
            refs = [t.numpy() for t in _outputs(model(x))]
            outs = session.run(None, {name: x.numpy()})
            if len(outs) != len(refs):
                raise ExportMismatch(f"size {h}x{w}: {len(outs)} outputs, eager mode has {len(refs)}")
            times = {"ort": [], "eager": []}
            for _ in range(max(1, runs)):
                for key, call in (("ort", lambda: session.run(None, {name: x.numpy()})), ("eager", lambda: model(x))):
                    start = time.perf_counter()
                    call()
                    times[key].append(1e3 * (time.perf_counter() - start))
        errors = [relative_error(o, r) for o, r in zip(outs, refs)]
        rows.append(dict(size=(h, w), max_abs=max(e[0] for e in errors), relative=max(e[1] for e in errors),
                         ort_ms=statistics.median(times["ort"]), eager_ms=statistics.median(times["eager"])))
    bad = [r for r in rows if tolerance is not None and not r["relative"] <= tolerance]
    if bad:
        worst = max(bad, key=lambda r: r["relative"])
        raise ExportMismatch(
            f"onnxruntime differs from eager mode above the tolerance {tolerance:g} (relative: max|ort - eager| / "
            f"max|eager|) at {', '.join('%dx%d' % r['size'] for r in bad)}; worst {worst['relative']:.3g} at "
            f"{worst['size'][0]}x{worst['size'][1]}\n{format_checks(rows)}")
    return rows


def format_checks(rows: list[dict]) -> str:
    """The rows of ``check_onnx`` as a text table."""
    lines = [f"{'size':>11}  {'max abs':>9}  {'relative':>9}  {'ort ms':>9}  {'eager ms':>9}"]
    for r in rows:
        lines.append(f"{r['size'][0]:>5}x{r['size'][1]:<5}  {r['max_abs']:9.2e}  {r['relative']:9.2e}  "
                     f"{r['ort_ms']:9.1f}  {r['eager_ms']:9.1f}")
    return "\n".join(lines)

"""Two onnxruntime measurements of docs/DEPLOY.md that the onnx_deploy benchmark does not make (issue 42).

    python -m benchmarks.onnx_forms profile [--size 1024] [--threads 1]   # node time per op type, one forward
    python -m benchmarks.onnx_forms mlp [--threads 1]                     # the MLP's token form vs grid form

Repository only (not in the wheel): run from the checkout's root. ``profile`` exports Tiny (random weights,
seed 0) and runs onnxruntime's profiler on two forwards, reporting the second's node time per op type. ``mlp``
exports Tiny twice, with the MLP in its token form (forced) and in the export's grid form
(``models.laplacianformer.Mlp._forward_grid``), and times both beside eager mode in turn (medians), with each
export's relative error to eager.
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from laplacianformer import create_model
from laplacianformer.layers.grid_conv import grid_to_tokens, tokens_to_grid
from laplacianformer.models import laplacianformer as lf
from laplacianformer.models.export import export_onnx


def _session(path: Path, threads: int, profile_prefix: str | None = None):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    if profile_prefix:
        options.enable_profiling, options.profile_file_prefix = True, profile_prefix
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def profile(size: int, threads: int, tmp: Path) -> None:
    torch.manual_seed(0)
    export_onnx(create_model("laplacianformer_tiny").eval(), tmp / "tiny.onnx", torch.randn(1, 3, 224, 224))
    session = _session(tmp / "tiny.onnx", threads, str(tmp / "ort"))
    x = np.random.default_rng(0).standard_normal((1, 3, size, size), dtype=np.float32)
    for _ in range(2):
        session.run(None, {"image": x})
    events = json.loads(Path(session.end_profiling()).read_text())
    last = [e for e in events if e.get("name") == "model_run"][-1]
    by_op, total = collections.Counter(), 0
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and last["ts"] <= e["ts"] <= last["ts"] + last["dur"]:
            by_op[e["args"]["op_name"]] += e["dur"]
            total += e["dur"]
    print(f"{size}², {threads} thread(s): run {last['dur'] / 1e3:.0f} ms, nodes {total / 1e3:.0f} ms")
    for op, us in by_op.most_common(10):
        print(f"  {op:<12} {us / 1e3:7.0f} ms  {100 * us / total:4.0f}%")


def _token_form(self, x, hw):
    """Mlp's eager token form, recorded as such (what an export recorded before the grid form)."""
    x = grid_to_tokens(self.dwconv(tokens_to_grid(self.fc1(x), hw)))
    return self.drop(self.fc2(self.drop(self.act(x))))


def mlp(threads: int, tmp: Path) -> None:
    torch.manual_seed(0)
    model = create_model("laplacianformer_tiny").eval()
    export_onnx(model, tmp / "grid.onnx", torch.randn(1, 3, 224, 224))
    grid_forward, lf.Mlp.forward = lf.Mlp.forward, _token_form
    try:
        export_onnx(model, tmp / "token.onnx", torch.randn(1, 3, 224, 224))
    finally:
        lf.Mlp.forward = grid_forward
    runs = {k: _session(tmp / f"{k}.onnx", threads).run for k in ("token", "grid")}
    torch.set_num_threads(threads)
    for size, rounds in ((512, 4), (1024, 3)):
        x = np.random.default_rng(0).standard_normal((1, 3, size, size), dtype=np.float32)
        with torch.no_grad():
            ref = model(torch.from_numpy(x)).numpy()
        times = {k: [] for k in (*runs, "eager")}
        for _ in range(rounds):
            for k, run in runs.items():
                t = time.perf_counter()
                out = run(None, {"image": x})[0]
                times[k].append(time.perf_counter() - t)
                err = np.abs(out - ref).max() / np.abs(ref).max()
            t = time.perf_counter()
            with torch.no_grad():
                model(torch.from_numpy(x))
            times["eager"].append(time.perf_counter() - t)
        print(f"{size}²: " + ", ".join(f"{k} {1e3 * sorted(v)[len(v) // 2]:.0f} ms" for k, v in times.items())
              + f" (relative error of the last export {err:.1e})")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("what", choices=["profile", "mlp"])
    p.add_argument("--size", type=int, default=1024, help="profile: the input side")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        profile(args.size, args.threads, Path(tmp)) if args.what == "profile" else mlp(args.threads, Path(tmp))


if __name__ == "__main__":
    main()

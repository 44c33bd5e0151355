"""The one timing and memory harness of the benchmarks and the demo's cost panel.

Time:
- ``timed(fn)``: wall and process-CPU milliseconds of one call, bracketed by ``torch.cuda.synchronize`` on
  CUDA. Every measurement below is made of these calls.
- ``time_call``: warm-up calls, then timed repeats of one callable (fewer when one warm-up call alone
  exceeds ``max_seconds``); ``round_robin``: several callables in turn, one call each per round, so load
  changes on a shared machine hit them alike. Both return a ``Timing`` (median, quartiles, min of the wall
  times, median CPU time, the warm-up times).

Memory:
- ``peak_memory`` (peak RSS): CUDA: ``max_memory_allocated`` during the call minus ``memory_allocated``
  before it, after ``reset_peak_memory_stats``. CPU: the case runs in a fresh subprocess; the child imports
  the factory's module, optionally runs a small warm-up case (``warmup_kwargs``) so one-time initialisation
  is not counted, builds the callable and its inputs, records its resident set size (/proc/self/statm),
  resets the kernel's high-water mark (writing 5 to /proc/self/clear_refs, so transient import peaks do
  not count), runs the call once and reads the new high-water mark (VmHWM). Where the reset is not allowed
  it reads ``ru_maxrss``, which can include an earlier import peak (an upper bound). Reported: peak RSS
  minus the RSS after imports and input creation, in MiB; memory the process touched, not live tensors.
- ``peak_heap_mib`` (CPU, glibc): live allocations: the C heap in use (``mallinfo2``: arenas + mmapped
  blocks), sampled after every aten op of one call, minus the level before it. Under the sampling mode the
  Newton–Schulz solve runs its torch loop instead of the C loop (``ops/_runtime.py``: a dispatch mode must
  see the ops); its temporaries are m×m matrices.
- ``saved_activation_mib``: bytes of the distinct storages autograd keeps for the backward of one
  forward, parameters excluded (deterministic, unlike any allocator peak).
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

import torch

from .process import package_env

MIB = 2**20


def synchronize(device: str | torch.device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def timed_result(fn: Callable[..., object], *args, device: str | torch.device = "cpu") -> tuple[object, float, float]:
    """(``fn(*args)``, wall ms, process CPU ms) of one call."""
    synchronize(device)
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn(*args)
    synchronize(device)
    return out, (time.perf_counter() - t0) * 1e3, (time.process_time() - c0) * 1e3


def timed(fn: Callable[[], object], device: str | torch.device = "cpu") -> tuple[float, float]:
    """(wall ms, process CPU ms) of one call of ``fn``."""
    return timed_result(fn, device=device)[1:]


@dataclass
class Timing:
    """Statistics in milliseconds over ``repeats`` timed calls (after the warm-up calls in ``warmup_ms``)."""

    median_ms: float
    q1_ms: float
    q3_ms: float
    iqr_ms: float
    min_ms: float
    cpu_ms: float
    repeats: int
    warmup_ms: list

    def as_dict(self) -> dict:
        return asdict(self)


def summarise(wall: Sequence[float], cpu: Sequence[float], warmup: Sequence[float] = ()) -> Timing:
    """The ``Timing`` of timed calls: wall median and inclusive quartiles, median CPU time."""
    if len(wall) == 1:
        q1 = med = q3 = wall[0]
    else:
        q1, med, q3 = statistics.quantiles(wall, n=4, method="inclusive")
    return Timing(med, q1, q3, q3 - q1, min(wall), statistics.median(cpu), len(wall), list(warmup))


def inference_call(net: torch.nn.Module, *inputs) -> Callable[[], object]:
    """A call of ``net(*inputs)`` in eval mode without autograd: the "infer" mode of the model benchmarks."""
    net.eval()

    def infer():
        with torch.no_grad():
            return net(*inputs)

    return infer


def op_call(fn: Callable[..., torch.Tensor], inputs: Sequence[torch.Tensor],
            backward: bool) -> Callable[[], torch.Tensor]:
    """The zero-argument call ``fn(*inputs)`` of an op benchmark; with ``backward``, the inputs require
    gradients and each call also runs the backward of a gradient of ones and clears the inputs' gradients."""
    inputs = [t.requires_grad_(backward) for t in inputs]

    def call():
        out = fn(*inputs)
        if backward:
            out.backward(torch.ones_like(out))
            for t in inputs:
                t.grad = None
        return out

    return call


def time_call(fn: Callable[[], object], *, device: str | torch.device = "cpu", warmup: int = 1, repeats: int = 5,
              max_seconds: float | None = None) -> Timing:
    """``warmup`` untimed-for-statistics calls, then ``repeats`` timed calls of ``fn``; when ``max_seconds``
    is given and the last warm-up call alone took longer, fewer repeats (at least one)."""
    warm = [timed(fn, device)[0] for _ in range(warmup)]
    if max_seconds is not None and warm:
        repeats = max(1, min(repeats, int(max_seconds / max(warm[-1] / 1e3, 1e-9))))
    calls = [timed(fn, device) for _ in range(repeats)]
    return summarise([w for w, _ in calls], [c for _, c in calls], warm)


def round_robin(fns: Mapping[str, Callable[[], object]], *, repeats: int, max_seconds: float | None = None,
                device: str | torch.device = "cpu", warmup: bool = True, primed: bool = False) -> dict[str, Timing]:
    """A ``Timing`` per callable, timed round-robin (one call of each per round). One untimed warm-up call
    each when ``warmup``; rounds stop early once ``max_seconds`` of timed calls are spent (at least one).
    ``primed``: each timed call follows an untimed call of the same callable, so it finds its code and data in
    cache (a lower bound on its time inside a longer computation)."""
    warm = {name: [timed(fn, device)[0]] for name, fn in fns.items()} if warmup else {}
    calls: dict[str, list[tuple[float, float]]] = {name: [] for name in fns}
    spent = 0.0
    for _ in range(repeats):
        for name, fn in fns.items():
            if primed:
                fn()
            calls[name].append(timed(fn, device))
            spent += calls[name][-1][0] / 1e3
        if max_seconds is not None and spent > max_seconds:
            break
    return {name: summarise([w for w, _ in xs], [c for _, c in xs], warm.get(name, ())) for name, xs in calls.items()}


def cuda_event_times(fn: Callable[[], object], repeats: int) -> list[float]:
    """Milliseconds of ``repeats`` calls of ``fn`` between CUDA events, after one warm-up call (for kernels of
    microseconds, where the host clock would measure the launch)."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return times


# --- peak resident memory of one call (a fresh subprocess on CPU) ---------------------------------------

def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss_bytes(reset_ok: bool) -> int:
    if reset_ok:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def resolve_factory(spec: str) -> Callable[..., Callable[[], object]]:
    """'package.module:function' -> the function (a factory returning a zero-argument callable)."""
    module, _, name = spec.partition(":")
    if not name:
        raise ValueError(f"factory: expected 'module:function', got {spec!r}")
    return getattr(importlib.import_module(module), name)


def _built(spec: str, kwargs: dict, warmup_kwargs: dict | None) -> Callable[[], object]:
    """The callable of ``factory(**kwargs)``, after one call of the warm-up case when one is given."""
    factory = resolve_factory(spec)
    if warmup_kwargs is not None:
        factory(**{**kwargs, **warmup_kwargs})()
    return factory(**kwargs)


def _peak_memory_child(spec: str, kwargs: dict, warmup_kwargs: dict | None, threads: int | None) -> dict:
    if threads is not None:
        torch.set_num_threads(threads)
    fn = _built(spec, kwargs, warmup_kwargs)
    before = _rss_bytes()
    reset_ok = _reset_peak_rss()
    fn()
    peak = _peak_rss_bytes(reset_ok)
    method = "VmHWM after clear_refs reset" if reset_ok else "ru_maxrss"
    return {"peak_mb": max(peak - before, 0) / MIB, "baseline_mb": before / MIB, "method": method}


def peak_memory(factory: str, kwargs: Mapping | None = None, *, device: str | torch.device = "cpu",
                timeout: float | None = None, warmup_kwargs: Mapping | None = None, threads: int | None = None) -> dict:
    """Peak memory of one call of ``factory(**kwargs)()`` beyond its inputs, in MiB (see the module docstring).

    ``factory`` is 'module:function' (importable by a child process started in the current directory);
    ``kwargs`` must be JSON-serialisable. ``threads``: torch threads of the CPU subprocess.
    Returns {"peak_mb", "baseline_mb", "method"}."""
    kwargs = dict(kwargs or {})
    warmup_kwargs = None if warmup_kwargs is None else dict(warmup_kwargs)
    if torch.device(device).type == "cuda":
        fn = _built(factory, kwargs, warmup_kwargs)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        return {"peak_mb": (peak - before) / MIB, "baseline_mb": before / MIB, "method": "cuda max_memory_allocated"}
    child = json.dumps({"kwargs": kwargs, "warmup_kwargs": warmup_kwargs, "threads": threads})
    cmd = [sys.executable, "-m", __name__, "--peak-memory-child", factory, child]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=package_env())
    if proc.returncode != 0:
        raise RuntimeError(f"peak-memory subprocess failed ({factory} {kwargs}):\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --- live C heap and saved activations (in process) ---------------------------------------------------

class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
    )]


@functools.lru_cache(maxsize=1)
def _mallinfo2():
    """glibc's ``mallinfo2`` (2.33+) via ctypes, or None (other C libraries, other systems)."""
    try:
        fn = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    return fn


def heap_in_use() -> int | None:
    """Bytes the C heap has handed out and not freed (glibc: arena + mmapped blocks in use), or None."""
    fn = _mallinfo2()
    if fn is None:
        return None
    info = fn()
    return info.uordblks + info.hblkhd


def peak_heap_mib(fn: Callable[[], object]) -> float | None:
    """Peak C-heap MiB in use during ``fn()`` above the level before it, sampled after every aten op (a
    ``TorchDispatchMode``; on CPU the autograd backward runs its ops in the calling thread, so they are seen
    too). Temporaries freed inside one op are not seen. None where ``mallinfo2`` is missing."""
    if heap_in_use() is None:
        return None
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Sampler(TorchDispatchMode):
        peak = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            self.peak = max(self.peak, heap_in_use())
            return out

    before = heap_in_use()
    with _Sampler() as sampler:
        fn()
    return max(sampler.peak - before, 0) / MIB


def saved_activation_mib(forward: Callable[[], object], exclude: Sequence[torch.Tensor] = ()) -> float:
    """MiB of the distinct storages autograd keeps for the backward of ``forward()`` (its output is
    dropped, so nothing is backpropagated), storages of ``exclude`` (the parameters) left out."""
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    storages: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in skip:
            storages[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        forward()
    return sum(storages.values()) / MIB


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--peak-memory-child":
        child = json.loads(sys.argv[3])
        print(json.dumps(_peak_memory_child(sys.argv[2], child["kwargs"], child["warmup_kwargs"], child["threads"])))
    else:
        sys.exit("usage: python -m laplacianformer.bench.harness --peak-memory-child MODULE:FACTORY JSON")

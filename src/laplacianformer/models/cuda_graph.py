"""``cuda_graphed(model, example_input)``: a model's inference forward captured once in a CUDA graph and
replayed (docs/KERNELS.md, "CUDA graphs").

An eager forward of a backbone is hundreds of small launches, each with host work around it; a replay is
one launch of the whole recorded sequence. The attention ops make no host synchronisation in a CUDA call
and skip their data-dependent checks while a graph captures (``ops._runtime.capture_reason``), so the
whole backbone can be captured.

Limits (the graph holds fixed buffers):

- one input shape, dtype and device: the one of ``example_input`` (another shape raises ``ValueError``;
  capture one graph per size, e.g. per detection resolution);
- inference only: the model must be in eval mode (dropout masks and batch-norm statistics would be frozen
  into the recording) and the forward runs without autograd;
- the first call pays for the warm-up (``warmup`` eager forwards on a side stream: Triton compilation,
  cuBLAS workspaces) and the capture;
- the returned outputs are the graph's own buffers, overwritten by the next call, unless ``clone_outputs``
  (the default) copies them;
- the model's weights are read from their memory at every replay: update them in place
  (``param.copy_``), never by reassigning a parameter.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

__all__ = ["CudaGraphedForward", "cuda_graphed"]


def _map_tensors(fn: Callable[[torch.Tensor], Any], out: Any) -> Any:
    """``fn`` on every tensor of a tensor / list / tuple / dict output (the shapes models return)."""
    if isinstance(out, torch.Tensor):
        return fn(out)
    if isinstance(out, (list, tuple)):
        return type(out)(_map_tensors(fn, o) for o in out)
    if isinstance(out, dict):
        return {k: _map_tensors(fn, v) for k, v in out.items()}
    raise TypeError(f"model output: expected tensors in lists, tuples or dicts, got {type(out).__name__}")


class CudaGraphedForward:
    """Callable replaying ``model(x)`` from a CUDA graph captured for ``example_input``'s shape
    (module docstring). ``graphed(x)`` -> the model's output for x (same structure)."""

    def __init__(self, model: nn.Module, example_input: torch.Tensor, *, warmup: int = 3,
                 clone_outputs: bool = True):
        if not isinstance(model, nn.Module):
            raise TypeError(f"model: expected an nn.Module, got {type(model).__name__}")
        if not isinstance(example_input, torch.Tensor):
            raise TypeError(f"example_input: expected a tensor, got {type(example_input).__name__}")
        if example_input.device.type != "cuda":
            raise ValueError(f"example_input: expected a CUDA tensor (a CUDA graph needs a GPU), got device "
                             f"{example_input.device}")
        if model.training:
            raise ValueError("model: call model.eval() first (a captured forward would freeze dropout and "
                             "batch-norm updates into the graph)")
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
            raise ValueError(f"warmup: expected an int >= 1 (eager forwards before the capture), got {warmup!r}")
        self.model = model
        self.clone_outputs = clone_outputs
        self.static_input = example_input.detach().clone()
        self.graph = torch.cuda.CUDAGraph()
        with torch.no_grad():
            side = torch.cuda.Stream(device=example_input.device)
            side.wait_stream(torch.cuda.current_stream(example_input.device))
            with torch.cuda.stream(side):
                for _ in range(warmup):
                    model(self.static_input)
            torch.cuda.current_stream(example_input.device).wait_stream(side)
            with torch.cuda.graph(self.graph):
                self.static_output = model(self.static_input)
        _map_tensors(lambda t: t, self.static_output)  # refuses outputs that are not tensors, now

    def __call__(self, x: torch.Tensor) -> Any:
        s = self.static_input
        if not isinstance(x, torch.Tensor) or x.shape != s.shape or x.dtype != s.dtype or x.device != s.device:
            got = (f"{tuple(x.shape)} {x.dtype} on {x.device}" if isinstance(x, torch.Tensor)
                   else type(x).__name__)
            raise ValueError(f"x: the graph was captured for {tuple(s.shape)} {s.dtype} on {s.device}, got {got}; "
                             "capture another graph for this input (cuda_graphed(model, x))")
        s.copy_(x)
        self.graph.replay()
        return _map_tensors(torch.clone, self.static_output) if self.clone_outputs else self.static_output


def cuda_graphed(model: nn.Module, example_input: torch.Tensor, *, warmup: int = 3,
                 clone_outputs: bool = True) -> CudaGraphedForward:
    """``model``'s inference forward for inputs shaped like ``example_input`` (a CUDA tensor), captured in a
    CUDA graph after ``warmup`` eager forwards; returns a callable that replays it (module docstring:
    limits). ``clone_outputs=False`` returns the graph's output buffers (no copy; overwritten by the next
    call)."""
    return CudaGraphedForward(model, example_input, warmup=warmup, clone_outputs=clone_outputs)

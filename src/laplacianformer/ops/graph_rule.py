"""The landmark rule inside an exported graph: one graph that serves every input size (docs/DESIGN.md §2.2).

Eager mode picks one computation per size: landmarks that cover every token use the exact kernel, fewer
landmarks the Nyström path (``validation.resolve_landmarks``). Asked at a graph size, that choice would fix
the branch of the example size: torch.export turns it into a guard on the dynamic dims (a ``Dim`` range
that crosses the rule fails to export) and torch.jit.trace, the TorchScript ONNX exporter's, records one
branch. While a graph is exported (``exporting``), ``attention_both_sides`` computes both and keeps, in the
graph, the one eager mode takes for that size:

    few   = min(N, lh·lw)                              (lh, lw: the uncut landmark grid)
    exact = attention over the first ``few`` tokens    (its cost: at most (lh·lw)² per head)
    out   = where(h <= lh and w <= lw, exact rows spread over N, Nyström with the grid cut to (h, w))

torch.compile is not exporting: it guards on the size and recompiles, so it runs one side only.
"""

from __future__ import annotations

import torch

from .nystrom import attention_core
from .validation import landmark_grid, traced_size

__all__ = ["attention_both_sides", "exporting", "rule_in_graph"]


def exporting() -> bool:
    """Whether a graph meant for every input size is being recorded: ``torch.export`` (also under the dynamo
    ONNX exporter) or ``torch.jit.trace`` (the TorchScript ONNX exporter)."""
    return torch.jit.is_tracing() or torch.compiler.is_exporting()


def rule_in_graph(landmarks, hw, n, num_prefix_tokens: int, key_padding_mask) -> bool:
    """Whether a call decides the landmark rule in the graph (``attention_both_sides``): an export with a
    graph size among the grid sides and N, a landmark grid, no prefix tokens (the rule is exported for grids
    only) and no padding mask."""
    return (landmarks is not None and hw is not None and not num_prefix_tokens and key_padding_mask is None
            and exporting() and any(traced_size(s) for s in (*hw, n)))


def _size_min(a, b: int):
    """min(a, b) kept in the graph for a SymInt or a traced size tensor."""
    if isinstance(a, torch.SymInt):
        return torch.sym_min(a, b)
    if isinstance(a, torch.Tensor):
        return torch.clamp(a, max=b)
    return min(a, b)


def _covered(h, w, lh: int, lw: int, device) -> torch.Tensor:
    """0-dim bool tensor h <= lh and w <= lw (the landmarks cover the grid), from graph sizes."""
    if isinstance(h, torch.Tensor) and isinstance(w, torch.Tensor):  # torch.jit tracing
        return ((h <= lh) & (w <= lw)).to(device)
    size = torch.stack([torch.scalar_tensor(h, dtype=torch.int64, device=device),
                        torch.scalar_tensor(w, dtype=torch.int64, device=device)])
    return (size <= torch.tensor([lh, lw], device=device)).all()


def attention_both_sides(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, settings, hw, norm_gain=None) -> torch.Tensor:
    """q, k (B, H, N, d), v (B, H, N, e), hw (h, w) graph sizes with h·w = N -> (B, H, N, e): the operator's
    output with the landmark rule decided in the graph (module docstring)."""
    lh, lw = landmark_grid(settings.landmarks, (1 << 30, 1 << 30))
    nystrom = attention_core(q, k, v, settings, hw, landmark_grid(settings.landmarks, hw), None, norm_gain)
    few = _size_min(q.shape[2], lh * lw)
    exact = attention_core(q[:, :, :few], k[:, :, :few], v[:, :, :few], settings, None, None, None, norm_gain)
    # exact's rows spread over the N rows (row i reads row min(i, few - 1)): all of them, in order, where the
    # landmarks cover the grid (few = N); no empty tensor at any size (torch.export would specialise on it)
    rows = torch.clamp(torch.arange(q.shape[2], device=q.device), max=few - 1)
    return torch.where(_covered(hw[0], hw[1], lh, lw, q.device), exact.index_select(2, rows), nystrom)

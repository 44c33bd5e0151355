"""Landmark pooling of docs/DESIGN.md §2.1, §2.3 and §2.5: the dispatched op ``pooling`` and its masked form.

- ``pool_landmarks(x, hw, landmarks)``: x (B, H, N, d) -> (B, H, m, d), adaptive average pooling of the token
  map to the landmark grid (2-D) or count (1-D). Backends: ``matmul`` (products with the averaging matrices,
  §2.3) and the reference ``adaptive_avg_pool`` (``F.adaptive_avg_pool2d`` / ``1d``; the MAC counter forces
  it with ``ops.use(pooling="adaptive_avg_pool")``). Same bins and values.
- ``pool_landmarks_masked``: the same over the valid tokens of each padded sequence (§2.5).
- ``landmarks_of``: whichever of the two a call needs.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from . import _runtime, grid_cpu
from .capabilities import Call, Serves, unserved
from .dispatch import Backend, Op

__all__ = ["POOLING", "adaptive_pool_matrix", "landmarks_of", "masked_pool_matrix", "pool_landmarks",
           "pool_landmarks_masked"]


def adaptive_pool_matrix(n, out, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(out, n) averaging matrix of adaptive average pooling: row i averages inputs
    floor(i·n/out) .. ceil((i+1)·n/out) - 1 (the bins of ``F.adaptive_avg_pool1d``).

    n, out: Python ints, or graph sizes (SymInts of torch.export, the 0-dim size tensors of torch.jit
    tracing): the bin edges are then computed in the graph from them, not fixed at the example size."""
    i = torch.arange(out, device=device)
    lo = torch.div(i * n, out, rounding_mode="floor")
    hi = torch.div((i + 1) * n + out - 1, out, rounding_mode="floor")
    j = torch.arange(n, device=device)
    inside = (j[None, :] >= lo[:, None]) & (j[None, :] < hi[:, None])
    return inside.to(dtype) / (hi - lo).to(dtype)[:, None]


@functools.lru_cache(maxsize=64)
def _cached_pool_matrix(n: int, out: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    # built outside inference mode, so autograd may save it in later training calls
    with torch.inference_mode(False), torch.no_grad():
        return adaptive_pool_matrix(n, out, dtype, device)


def _pool_matrix(n: int, out: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``adaptive_pool_matrix``, cached in eager mode (building it is ~8 small ops); rebuilt from the
    (possibly symbolic) sizes while tracing, so a graph holds the shape arithmetic, not a constant."""
    if _runtime.capturing(modes=False) or not isinstance(n, int) or not isinstance(out, int):
        return adaptive_pool_matrix(n, out, dtype, device)
    return _cached_pool_matrix(n, out, dtype, device)


def pool_landmarks(x: torch.Tensor, hw: tuple[int, int] | None, landmarks) -> torch.Tensor:
    """Adaptive average pooling of the token map (docs/DESIGN.md §2).  x: (B, H, N, d) -> (B, H, m, d).

    2-D: x is read as a (height, width) grid and pooled to the (lh, lw) grid, m = lh·lw.
    1-D: x is pooled along the sequence to m = landmarks tokens.
    Op ``pooling``: backend ``matmul`` computes products with the pooling matrices (width, then
    height), which read x in its token layout (any row stride); the reference ``adaptive_avg_pool``
    calls ``F.adaptive_avg_pool2d`` / ``1d``. Same bins and values.
    """
    return POOLING(x, hw, landmarks)


def _pool_reference(x: torch.Tensor, hw, landmarks) -> torch.Tensor:
    b, h, n, d = x.shape
    flat = x.reshape(b * h, n, d).transpose(1, 2)
    if hw is None:
        pooled = F.adaptive_avg_pool1d(flat, landmarks)
    else:
        pooled = F.adaptive_avg_pool2d(flat.reshape(b * h, d, hw[0], hw[1]), landmarks).flatten(2)
    return pooled.transpose(1, 2).reshape(b, h, -1, d)


def _pool_matmul(x: torch.Tensor, hw, landmarks) -> torch.Tensor:
    b, h, n, d = x.shape
    if hw is None:
        return _pool_matrix(n, landmarks, x.dtype, x.device) @ x
    (gh, gw), (lh, lw) = hw, landmarks
    if not all(isinstance(s, int) for s in (gh, gw, lh, lw)):
        return _pool_matmul_graph(x, hw, landmarks)
    rows = x.reshape(b * h * gh, gw, d)
    pooled_w = _pool_matrix(gw, lw, x.dtype, x.device) @ rows
    pooled = _pool_matrix(gh, lh, x.dtype, x.device) @ pooled_w.reshape(b * h, gh, lw * d)
    return pooled.reshape(b, h, lh * lw, d)


def _pool_matmul_graph(x: torch.Tensor, hw, landmarks) -> torch.Tensor:
    """``_pool_matmul`` on graph sizes (torch.export SymInts, torch.jit's traced size tensors); same values. The
    tokens lead: x as (gh, gw, B·H·d), a ``bmm`` with the width's averaging matrix expanded over the gh rows,
    an ``mm`` with the height's. Merging fixed sizes into a graph size after them, (B, H, gh·gw, d) ->
    (B·H·gh, gw, d), makes torch's reshape test ``B·H % (B·H·gh) != 0``: true for gh >= 2, but a modulo that
    torch.export cannot prove, so with a fixed batch every ``Dim`` range failed (issue 43). No product
    broadcasts (no guard on a side of 1)."""
    b, h, n, d = x.shape
    (gh, gw), (lh, lw) = hw, landmarks
    t = x.permute(2, 0, 1, 3).reshape(gh, gw, b * h * d)
    p_w = adaptive_pool_matrix(gw, lw, x.dtype, x.device)
    t = torch.bmm(p_w.expand(gh, p_w.shape[0], p_w.shape[1]), t)  # (gh, lw, B·H·d)
    t = torch.mm(adaptive_pool_matrix(gh, lh, x.dtype, x.device), t.reshape(gh, lw * b * h * d))
    return t.reshape(lh * lw, b, h, d).permute(1, 2, 0, 3)


def masked_pool_matrix(key_padding_mask: torch.Tensor, out: int, dtype: torch.dtype) -> torch.Tensor:
    """(B, out, N) averaging matrices of adaptive average pooling over the valid tokens of each sequence
    (docs/DESIGN.md §2.5): token j with rank r among its sequence's L valid tokens falls in the bins of
    ``adaptive_pool_matrix(L, out)``, padded tokens in none. key_padding_mask: (B, N) bool, True = padding.
    A sequence with L < out repeats tokens across bins, as adaptive pooling does."""
    valid = ~key_padding_mask
    rank = valid.cumsum(-1) - 1
    length = valid.sum(-1, keepdim=True)
    i = torch.arange(out, device=valid.device)
    lo = torch.div(i * length, out, rounding_mode="floor")
    hi = torch.div((i + 1) * length + out - 1, out, rounding_mode="floor")
    inside = valid[:, None, :] & (rank[:, None, :] >= lo[..., None]) & (rank[:, None, :] < hi[..., None])
    return inside.to(dtype) / (hi - lo).clamp_min(1).to(dtype)[..., None]


def pool_landmarks_masked(x: torch.Tensor, landmarks: int, key_padding_mask: torch.Tensor) -> torch.Tensor:
    """Landmarks of a padded batch of 1-D sequences (docs/DESIGN.md §2.5): x (B, H, N, d) pooled over the
    valid tokens of each sequence to (B, H, m, d), m = landmarks; what ``pool_landmarks`` gives each
    sequence alone. Not a dispatched op: one product with ``masked_pool_matrix`` serves every device."""
    return masked_pool_matrix(key_padding_mask, landmarks, x.dtype)[:, None] @ x


CPU = Serves("the C grid loops", devices=("cpu",), dtypes=(torch.float32, torch.float64), grad=False)
"""What the ``cpu`` backend serves (``ops/capabilities.py``): CPU inference in float32 / float64."""


def _cpu_refusal(x: torch.Tensor, hw, landmarks) -> str | None:
    why = unserved(CPU, Call(tensors=(x,)))
    if why is None:
        why = _runtime.capture_reason()  # graphs and dispatch modes (the MAC counter) see the aten steps
    sizes = (landmarks,) if hw is None else (*hw, *landmarks)
    if why is None and not all(isinstance(s, int) for s in sizes):
        why = "graph sizes (the C loop takes fixed sizes)"
    if why is None and not grid_cpu.available():
        why = f"C loops unavailable ({grid_cpu.load_error()})"
    return why


POOLING = Op("pooling", [
    Backend("cpu", grid_cpu.pool_grid_cpu, refusal=_cpu_refusal),
    Backend("matmul", _pool_matmul),
    Backend("adaptive_avg_pool", _pool_reference),
], signature="pool_landmarks(x, hw, landmarks): x (B, H, N, d) -> (B, H, m, d)")


def landmarks_of(qs: torch.Tensor, hw, grid, mask: torch.Tensor | None) -> torch.Tensor:
    """The pooled landmarks of the (padded) queries: ``pool_landmarks``, or over valid tokens with a mask."""
    return pool_landmarks(qs, hw, grid) if mask is None else pool_landmarks_masked(qs, grid, mask)

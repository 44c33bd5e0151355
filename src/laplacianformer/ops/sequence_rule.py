"""The landmark rule per sequence of a padded batch (docs/DESIGN.md §2.2, §2.5).

Alone, a 1-D sequence takes the exact kernel when its m landmarks cover its L grid tokens (m >= L; the grid
tokens are those after any prefix tokens, §2.7) and the Nyström path otherwise. A padded batch resolves the
landmarks from the padded length, so each sequence is routed here by its own valid count instead:

    covered = L_b <= m                      (B,): the sequences that take the exact kernel
    exact   = the valid tokens of each such sequence gathered in order into min(N, m + P) slots, the exact
              kernel with the gathered mask (O((m + P)²) per head, whatever N), rows scattered back
    Nyström = the core on the other sequences as they are (pooling over their valid tokens, §2.5)

Eager calls split the batch (one host sync on the (B,) counts): a batch without a covered sequence is one
call on the whole batch, as before this rule; a batch of covered ones one exact call. While a graph is
captured (torch.compile, torch.export, torch.jit tracing, dispatch modes: no host sync) both sides run on the
whole batch and ``torch.where`` keeps each sequence's side.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from . import _runtime
from .nystrom import attention_core, compute_dtype
from .settings import AttentionSettings

__all__ = ["attention_padded", "batch_rows", "by_valid_count", "covered_sequences", "exact_compacted"]


def covered_sequences(mask: torch.Tensor, m: int, prefix: int = 0) -> torch.Tensor:
    """(B,) bool: whether the m landmarks cover the valid grid tokens of each sequence (mask (B, N), True =
    padding; the first ``prefix`` tokens are not grid tokens), i.e. the sequence alone takes the exact kernel."""
    return (~mask[:, prefix:]).sum(-1) <= m


def batch_rows(t: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """Rows ``rows`` of t's batch dim (None: all of t)."""
    return t if rows is None else t.index_select(0, rows)


def by_valid_count(mask: torch.Tensor, m: int, prefix: int, nystrom: Callable, exact: Callable) -> tuple:
    """The batch routed by ``covered_sequences``: ``exact(rows)`` for the covered sequences, ``nystrom(rows)``
    for the others, each returning a tuple of batch-first tensors for the batch rows ``rows`` (a LongTensor, or
    None for the whole batch); returns those tuples merged in batch order (module docstring)."""
    covered = covered_sequences(mask, m, prefix)
    if _runtime.capturing():
        ours, theirs = exact(None), nystrom(None)
        return tuple(torch.where(covered.view(-1, *(1,) * (a.dim() - 1)), a, b) for a, b in zip(ours, theirs))
    flags = covered.tolist()
    if not any(flags):
        return nystrom(None)
    if all(flags):
        return exact(None)
    rows_n, rows_e = (~covered).nonzero().flatten(), covered.nonzero().flatten()
    order = torch.argsort(torch.cat([rows_n, rows_e]))
    return tuple(torch.cat([a, b]).index_select(0, order) for a, b in zip(nystrom(rows_n), exact(rows_e)))


def exact_compacted(q, k, v, mask: torch.Tensor, *, s: AttentionSettings, norm_gain, slots: int) -> torch.Tensor:
    """The exact kernel of each padded sequence on its valid tokens only: q, k (B, H, N, d), v (B, H, N, e), mask
    (B, N) with at most ``slots`` valid tokens per sequence -> (B, H, N, e), padded rows 0. The valid tokens are
    gathered in order into min(N, slots) positions (a stable sort of the mask), so the kernel is slots² per head."""
    b, _, n, _ = q.shape
    # valid tokens first, in order; the slice keeps min(N, slots) (graph sizes too)
    order = torch.sort(mask.to(torch.uint8), dim=1, stable=True).indices[:, :slots]

    def index(t):
        return order[:, None, :, None].expand(b, t.shape[1], order.shape[1], t.shape[3])

    qc = q.gather(2, index(q))
    out = attention_core(qc, qc if k is q else k.gather(2, index(k)), v.gather(2, index(v)), s, None, None,
                         mask.gather(1, order), norm_gain)
    return out.new_zeros(b, out.shape[1], n, out.shape[3]).scatter(2, index(out), out)


def attention_padded(q, k, v, s: AttentionSettings, m: int, mask: torch.Tensor, norm_gain=None,
                     return_stats: bool = False, prefix: int = 0):
    """``attention_core`` of a padded batch of 1-D sequences with m pooled landmarks (resolved from the padded
    length), each sequence on the side of the landmark rule its valid count takes (module docstring): what each
    sequence gives alone. With ``return_stats`` the stats dict's residual is NaN for the exact sequences."""
    slots = m + prefix  # at most this many valid tokens in a covered sequence

    def rows_of(rows):
        qq, vv, mm = (batch_rows(t, rows) for t in (q, v, mask))
        return qq, qq if k is q else batch_rows(k, rows), vv, mm

    def nystrom(rows):
        qq, kk, vv, mm = rows_of(rows)
        res = attention_core(qq, kk, vv, s, None, m, mm, norm_gain, return_stats, prefix)
        return (res[0], res[1]["residual"]) if return_stats else (res,)

    def exact(rows):
        out = exact_compacted(*rows_of(rows), norm_gain=norm_gain, s=s, slots=slots)
        if not return_stats:
            return (out,)
        return out, out.new_full(out.shape[:2], float("nan"), dtype=compute_dtype(q.dtype))

    parts = by_valid_count(mask, m, prefix, nystrom, exact)
    return (parts[0], {"residual": parts[1], "landmarks": m}) if return_stats else parts[0]

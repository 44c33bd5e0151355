"""Argument checks shared by every public op.

Every check raises ``ValueError`` or ``TypeError`` whose message starts with the argument's name and
states what was expected, so bad input never reaches a kernel (docs/ARCHITECTURE.md, conventions).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

import torch

from . import _runtime
from .kernel_families import KernelSpec, kernel_spec

# The variants of the operator, each list defined here once (docs/DESIGN.md §4, §3); the others derive from them.
NORMS = ("injective", "inline", "rowsum", "none", "injective_nomean")
"""Every normalisation (docs/DESIGN.md §4.1, §4.4); the reference and step paths serve each."""
SHIPPED_NORMS = ("injective", "inline")
"""The norms of the shipped configurations (the default; ``attn_preset="tuned"``'s inline), which the fused
backends serve; "rowsum", "none" and "injective_nomean" are ablation variants of the reference path."""
WHITENED_NORMS = ("injective", "injective_nomean")
"""The variants that divide by √(s_j² + ε) (docs/DESIGN.md §4.1, §4.4): their ε must be > 0."""
NORM_SCALE_POWERS = {"one": 0.0, "inv_sqrt_n": 0.5, "inv_n": 1.0}
"""p of the output scale α = N^-p of the whitened part (docs/DESIGN.md §4.6), per ``norm_scale``."""
NORM_SCALES = tuple(NORM_SCALE_POWERS)  # the operator's; the module adds "learned" (docs/DESIGN.md §4.6)
SOLVERS = ("newton_schulz", "cg", "exact")
"""The regularised inverse (docs/DESIGN.md §3): Newton–Schulz; CG and the exact solve are ablations."""
SHIPPED_SOLVERS = SOLVERS[:1]
"""The solver of the shipped configurations, which the fused backends serve; "cg" and "exact" run the steps."""
NS_BACKWARDS = ("implicit", "unrolled")
"""The gradient of the Newton–Schulz inverse (docs/DESIGN.md §3): the implicit formula; unrolled is an ablation."""
SHIPPED_NS_BACKWARDS = NS_BACKWARDS[:1]
"""The backward of the shipped configurations, which the fused training passes serve; "unrolled" runs the steps."""


def check_choice(name: str, value: str, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ValueError(f"{name}: expected one of {list(choices)}, got {value!r}")
    return value


def check_kernel(kernel: str) -> KernelSpec:
    """The registered family ``kernel`` (``kernel_families``); ValueError naming ``kernel`` otherwise."""
    return kernel_spec(kernel)


def check_positive(name: str, value: float, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}: expected a real number, got {type(value).__name__}")
    ok = value >= 0 if allow_zero else value > 0
    if not ok or not math.isfinite(value):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name}: expected a finite number {bound}, got {value}")
    return float(value)


def check_positive_int(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name}: expected an int >= 1, got {value}")
    return value


def check_float_tensor(name: str, x: torch.Tensor, ndim: int | None = None) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor, got dtype {x.dtype}")
    if ndim is not None and x.dim() != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D tensor, got shape {tuple(x.shape)}")
    return x


def check_head_split(dim: int, num_heads: int) -> int:
    """Validates a (channels, heads) pair and returns the head dimension dim // num_heads."""
    check_positive_int("dim", dim)
    check_positive_int("num_heads", num_heads)
    if dim % num_heads:
        raise ValueError(f"dim: expected a multiple of num_heads = {num_heads}, got {dim}")
    return dim // num_heads


def check_finite(name: str, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> None:
    """ValueError naming ``name`` and the first batch index (dim 0) where x holds NaN or Inf. x: (B, ..., N, ·)
    tokens with ``key_padding_mask`` (B, N) (True = padding: those tokens may hold anything, docs/DESIGN.md
    §2.5), or any (B, ...) tensor without one."""
    finite = torch.isfinite(x)
    if key_padding_mask is not None:
        finite = finite | key_padding_mask.view(x.shape[0], *(1,) * (x.dim() - 3), x.shape[-2], 1)
    if not bool(finite.all()):
        rows = (~finite).flatten(1).any(1).nonzero().flatten().tolist()
        more = f" (and {len(rows) - 1} more of the {x.shape[0]})" if len(rows) > 1 else ""
        raise ValueError(f"{name}: contains NaN or Inf values at batch index {rows[0]}{more}")


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """q, k: (B, H, N, d); v: (B, H, N, d_v), same device and dtype."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_float_tensor(name, t, ndim=4)
    if k.shape != q.shape:
        raise ValueError(f"k: expected shape {tuple(q.shape)} (same as q), got {tuple(k.shape)}")
    if v.shape[:3] != q.shape[:3]:
        raise ValueError(
            f"v: expected shape (B, H, N, d_v) = {tuple(q.shape[:3])} + (d_v,), got {tuple(v.shape)}"
        )
    if q.shape[2] < 1 or q.shape[3] < 1:
        raise ValueError(f"q: expected N >= 1 and d >= 1, got shape {tuple(q.shape)}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v: expected one device, got {q.device}, {k.device}, {v.device}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v: expected one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")


def traced_size(s) -> bool:
    """Whether the size ``s`` is a graph value rather than a Python int: a torch.SymInt (torch.export /
    torch.compile with dynamic shapes) or, while torch.jit traces (the TorchScript ONNX exporter), the
    0-dim integer tensor that ``x.shape[i]`` gives there."""
    return isinstance(s, torch.SymInt) or (isinstance(s, torch.Tensor) and torch.jit.is_tracing()
                                           and s.dim() == 0 and not s.is_floating_point()
                                           and s.dtype != torch.bool)


def _grid_side(name: str, s):
    """One side of a grid: a Python int >= 1, or a graph size (``traced_size``: kept as it is so that
    torch.export, torch.compile and torch.jit.trace do not specialise it; a SymInt checked by ``torch._check``)."""
    if isinstance(s, torch.SymInt):
        torch._check(s >= 1, lambda: f"{name}: expected sides >= 1")
        return s
    if traced_size(s):
        return s
    if isinstance(s, bool) or isinstance(s, torch.Tensor):
        raise TypeError(f"{name}: expected (height, width) ints, got an element of type {type(s).__name__}")
    try:
        s = operator.index(s)
    except TypeError:
        raise TypeError(f"{name}: expected (height, width) ints, got an element of type {type(s).__name__}") from None
    return check_positive_int(name, s)


def check_hw(hw, n: int) -> tuple[int, int] | None:
    """Returns (height, width) with height * width == n, or None for a 1-D sequence.

    Errors name ``hw``: a bool tensor (a padding mask passed positionally into ``hw``; it goes in
    ``key_padding_mask``), a single int, a sequence of another length, sides < 1, a product != n.
    Symbolic sides (dynamic export) stay symbolic."""
    if hw is None:
        return None
    if isinstance(hw, torch.Tensor):
        if hw.dtype == torch.bool:
            raise TypeError(
                f"hw: got a bool tensor of shape {tuple(hw.shape)}; a padding mask goes in key_padding_mask=, "
                "hw is the (height, width) of a 2-D token grid or None"
            )
        raise TypeError(f"hw: expected (height, width) ints or None, got a tensor of shape {tuple(hw.shape)}")
    if isinstance(hw, (int, torch.SymInt)):
        raise ValueError(f"hw: expected a (height, width) pair, got the single int {hw} (hw=None for a 1-D sequence)")
    if not isinstance(hw, Sequence) or isinstance(hw, str) or len(hw) != 2:
        raise ValueError(f"hw: expected (height, width), got {hw!r}")
    h, w = (_grid_side("hw", s) for s in hw)
    if traced_size(h) and not isinstance(h, torch.SymInt) or traced_size(w) and not isinstance(w, torch.SymInt):
        return h, w  # sizes traced by torch.jit: a comparison here would be a constant of the trace
    if isinstance(h * w, torch.SymInt) or isinstance(n, torch.SymInt):
        torch._check(h * w == n, lambda: f"hw: expected height * width == N = {n}, got {h} x {w}")
    elif h * w != n:
        raise ValueError(f"hw: expected height * width == N = {n}, got {h} x {w} = {h * w}")
    return h, w


def check_landmarks(landmarks):
    """The form of ``landmarks`` before any token count is known (module constructors): None, an int
    >= 1, or a (rows, cols) pair of ints >= 1; ValueError/TypeError naming ``landmarks`` otherwise.
    Returns it (a pair as a tuple). Which layout it means is ``resolve_landmarks``' rule."""
    if landmarks is None:
        return None
    if isinstance(landmarks, Sequence) and not isinstance(landmarks, str):
        if len(landmarks) != 2:
            raise ValueError(f"landmarks: expected an int, a (rows, cols) grid or None, got {landmarks!r}")
        return tuple(check_positive_int("landmarks", s) for s in landmarks)
    return check_positive_int("landmarks", landmarks)


def check_key_padding_mask(mask, batch: int, n: int):
    """key_padding_mask: None or a (B, N) bool tensor, True = padding (``nn.MultiheadAttention``'s
    convention; docs/DESIGN.md §2.5), with a valid token in every sequence (checked in eager mode only:
    a data-dependent check). Returns it."""
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"key_padding_mask: expected a (B, N) bool tensor or None, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(f"key_padding_mask: expected dtype torch.bool (True = padding), got {mask.dtype}")
    if mask.dim() != 2 or mask.shape[0] != batch or mask.shape[1] != n:
        raise ValueError(f"key_padding_mask: expected shape (B, N) = ({batch}, {n}), got {tuple(mask.shape)}")
    if not _runtime.capturing() and bool(mask.all(-1).any()):
        raise ValueError("key_padding_mask: a sequence is all padding (every sequence needs a valid token)")
    return mask


def reject_attn_mask(attn_mask, is_causal) -> None:
    """Kernel attention with pooled landmarks takes no ``attn_mask`` / ``is_causal``: every landmark averages
    queries from all positions, so no query can be kept from attending to any position through them
    (docs/DESIGN.md §2.5). ValueError naming the argument when one is given."""
    why = ("the pooled landmarks mix all positions, so a per-query mask cannot be applied; "
           "only key_padding_mask (B, N) is supported (docs/DESIGN.md §2.5)")
    if attn_mask is not None:
        raise ValueError(f"attn_mask: not supported: {why}")
    if is_causal:
        raise ValueError(f"is_causal: not supported: {why}")


def landmark_grid(landmarks, hw: tuple[int, int] | None):
    """The landmark layout before the exact-kernel rule of ``resolve_landmarks``: None, an int m (1-D,
    not yet cut to N) or a grid (lh, lw) cut to the token grid per axis (docs/DESIGN.md §2.2).

    With graph sizes (``traced_size``) the cut is shape arithmetic the graph keeps: ``torch.sym_min`` of
    a SymInt, ``torch.clamp`` of a traced size tensor; never a Python ``min``, which would fix the
    branch taken at the example size."""
    if landmarks is None:
        return None
    if hw is None:
        if isinstance(landmarks, Sequence) and len(landmarks) == 1:
            landmarks = landmarks[0]
        landmarks = check_landmarks(landmarks)
        return math.prod(landmarks) if isinstance(landmarks, tuple) else landmarks
    if isinstance(landmarks, int) and not isinstance(landmarks, bool):
        side = math.isqrt(max(landmarks, 0))
        if landmarks < 1 or side * side != landmarks:
            raise ValueError(
                f"landmarks: with a 2-D grid an int must be a perfect square (e.g. 49 = 7x7), got {landmarks}"
            )
        landmarks = (side, side)
    if not isinstance(landmarks, Sequence) or len(landmarks) != 2:
        raise ValueError(f"landmarks: expected an int, a (rows, cols) grid or None, got {landmarks!r}")
    lh, lw = check_landmarks(landmarks)
    return _cut(lh, hw[0]), _cut(lw, hw[1])


def _cut(m: int, side):
    """min(m, side) for a Python int, a SymInt or a traced size tensor (``traced_size``)."""
    if isinstance(side, torch.SymInt):
        return torch.sym_min(m, side)
    if isinstance(side, torch.Tensor):
        return torch.clamp(side, max=m)
    return min(m, side)


def resolve_landmarks(landmarks, hw: tuple[int, int] | None, n: int):
    """The landmark layout to use: None (exact kernel), an int m (1-D) or a grid (lh, lw) (2-D) (docs/DESIGN.md §2).

    landmarks: None, an int, or a (rows, cols) grid; hw: the (h, w) token grid or None (1-D, n tokens).
    One rule for the operator and the modules: with a 2-D grid an int m must be a perfect square and means
    a sqrt(m) x sqrt(m) grid (ValueError naming ``landmarks`` otherwise). On a 1-D sequence (hw None) a (lh, lw) grid counts lh·lw landmarks, for the operator and the modules
    alike: the default (7, 7) means m = 49 on a sequence as on a grid. Landmarks beyond the tokens, for
    the operator and the modules alike (so both work at any resolution and give the same result for the
    same input): a grid is cut to the token grid per axis, a 1-D count to N, and when the landmarks then
    cover every token (m >= N) the exact kernel is used: None is returned.

    Graph sizes (``traced_size``): the cut stays shape arithmetic (``landmark_grid``); whether the
    landmarks cover every token is a choice between two computations, which this function, returning one
    of them, makes at the traced size (torch.export turns it into a guard on the dynamic dims; torch.jit
    fixes it). While a graph for every size is exported, ``graph_rule`` puts both in it.
    """
    grid = landmark_grid(landmarks, hw)
    if grid is None:
        return None
    m = grid if hw is None else grid[0] * grid[1]
    return None if m >= n else grid


def check_num_prefix_tokens(num_prefix_tokens, n: int | None = None) -> int:
    """num_prefix_tokens P: an int with 0 <= P < N (N tokens, None before a token count is known: module
    constructors; docs/DESIGN.md §2.7); TypeError / ValueError naming ``num_prefix_tokens`` otherwise. Returns it."""
    if isinstance(num_prefix_tokens, bool) or not isinstance(num_prefix_tokens, int):
        raise TypeError(f"num_prefix_tokens: expected an int >= 0, got {type(num_prefix_tokens).__name__}")
    if num_prefix_tokens < 0:
        raise ValueError(f"num_prefix_tokens: expected an int >= 0, got {num_prefix_tokens}")
    if num_prefix_tokens and type(n) is int and num_prefix_tokens >= n:  # graph sizes: checked by hw
        raise ValueError(f"num_prefix_tokens: expected fewer than the N = {n} tokens (the tokens after the prefix "
                         f"form the grid), got {num_prefix_tokens}")
    return num_prefix_tokens


def check_prefix_layout(hw, n: int, num_prefix_tokens) -> tuple[int, tuple[int, int] | None]:
    """(P, hw) of N tokens whose first P are prefix tokens (docs/DESIGN.md §2.7): P checked by
    ``check_num_prefix_tokens``, hw by ``check_hw`` against the N - P grid tokens (None: 1-D)."""
    prefix = check_num_prefix_tokens(num_prefix_tokens, n)
    if prefix == 0:
        return 0, check_hw(hw, n)
    if isinstance(hw, Sequence) and len(hw) == 2 and all(type(s) is int for s in hw) and min(hw) >= 1 \
            and isinstance(n, int) and hw[0] * hw[1] != n - prefix:
        raise ValueError(f"hw: expected height * width == N - num_prefix_tokens = {n} - {prefix} = {n - prefix} "
                         f"(the grid tokens after the prefix tokens), got {hw[0]} x {hw[1]} = {hw[0] * hw[1]}")
    return prefix, check_hw(hw, n - prefix)

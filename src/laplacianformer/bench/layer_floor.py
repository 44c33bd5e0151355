"""The arithmetic floor of one attention layer's CPU inference call: its compute steps, each timed alone.

    steps = floor_steps(layer, x, hw)     # [(name, fn)], in the layer's order; fn() -> that step's output
    out = steps[-1][1]()                  # equals layer(x, hw) (``check_floor_steps``)

A step is one call of the backend the layer's call runs (a GEMM, a C loop, one aten op) on the tensors the
previous steps made, with nothing between them: no settings checks, plan look-up, module calls or reshapes,
and the step's inputs hot in cache. The sum of the steps' medians is therefore a lower bound on the layer's
time, the part no host path around these steps can remove (fusing steps makes other steps); the layer's time
minus that sum is its host time (Python, checks, dispatch, small aten calls, cold caches). ``host_overhead``
reports both for Laplacian and SR-softmax.

Laplacian (``LaplacianAttention``, the lean host path of docs/DESIGN.md §6.6, ``ops/lean.py``): the q/k/v
projections as the layer makes them, pooling, W = k(L, L), the Newton–Schulz solve, C_k, C_q, the C
normalisation (with the §4.6 scale in its pass), DWConv(V) with the heads added into it, the output projection;
for the exact kernel (the landmarks would cover every token), k(Q, K), the dense normalisation, the scale, the
conv, the projection. SR-softmax (``SpatialReductionAttention``): q, the reduction conv, its LayerNorm, kv, SDPA, the
output projection.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..layers.laplacian_attention import LaplacianAttention
from ..layers.grid_conv import grid_to_tokens, tokens_to_grid
from ..layers.spatial_reduction_attention import SpatialReductionAttention, pad_to_cell
from ..ops.grid_cpu import pool_grid_cpu
from ..ops.lean import kernel_rows
from ..ops.newton_schulz import native as ns_native
from ..ops.newton_schulz.naive import CHECK_EVERY, regularise
from ..ops.normalization.cpu import normalize_cpu
from ..ops.normalization.reference import normalize_dense, plain_scale, scale_whitened
from ..ops.validation import WHITENED_NORMS, resolve_landmarks
from ..ops.value_conv import ValueConv, add_value_conv

Step = tuple[str, Callable[[], torch.Tensor]]


def _chain(steps: list[tuple[str, Callable]]) -> list[Step]:
    """Runs the steps once in order (each takes the previous outputs, a dict), then binds each to those outputs,
    so every step can be called alone, as often as a timer likes, on the inputs the layer's call would give it."""
    seen: dict[str, torch.Tensor] = {}
    bound = []
    for name, fn in steps:
        frozen = dict(seen)
        seen[name] = fn(seen)
        bound.append((name, lambda fn=fn, frozen=frozen: fn(frozen)))
    return bound


def _laplacian_steps(layer: LaplacianAttention, x: torch.Tensor, hw) -> list[Step]:
    s = layer.settings
    b, n, c = x.shape
    heads = layer.num_heads
    grid = resolve_landmarks(s.landmarks, hw, n)
    steps = []
    if layer.cpu_projects_in_one_product:
        steps.append(("q, k, v projection", lambda t: layer._project_qkv(x)))
        qkv = lambda t: t["q, k, v projection"]  # noqa: E731
    else:
        steps += [("q, k projections", lambda t: layer._project_qk(x)),
                  ("v projection", lambda t: layer._project_v(x))]
        qkv = lambda t: (*t["q, k projections"], t["v projection"])  # noqa: E731
    q = lambda t: qkv(t)[0]  # noqa: E731
    k = lambda t: qkv(t)[1]  # noqa: E731
    v_tok = lambda t: qkv(t)[2]  # noqa: E731
    v = lambda t: v_tok(t).reshape(b, n, heads, c // heads).transpose(1, 2)  # noqa: E731
    if grid is None:
        steps += [("k(Q, K)", lambda t: kernel_rows(q(t), k(t), s)),
                  ("dense normalisation", lambda t: normalize_dense(t["k(Q, K)"], v(t), s.norm, s.norm_eps))]
        core = "dense normalisation"
    else:
        m = grid if isinstance(grid, int) else grid[0] * grid[1]
        c_q = "C_k = k(K, L)" if layer.tie_qk else "C_q = k(Q, L)"  # K = Q: one kernel matrix, as the layer
        steps += [
            ("landmark pooling", lambda t: pool_grid_cpu(q(t), hw, grid)),
            ("W = k(L, L)", lambda t: kernel_rows(t["landmark pooling"], t["landmark pooling"], s)),
            ("Newton-Schulz solve", lambda t: ns_native.newton_schulz_native(
                regularise(t["W = k(L, L)"], s.ns_eps), s.iters, None, CHECK_EVERY)),
            ("C_k = k(K, L)", lambda t: kernel_rows(k(t), t["landmark pooling"], s)),
            *([] if layer.tie_qk else [("C_q = k(Q, L)", lambda t: kernel_rows(q(t), t["landmark pooling"], s))]),
            ("C normalisation", lambda t: normalize_cpu(  # with the §4.6 scale in its pass
                t[c_q].reshape(-1, n, m), t["C_k = k(K, L)"].reshape(-1, n, m),
                v(t).reshape(-1, n, c // heads), s.norm, s.norm_eps,
                t["Newton-Schulz solve"].reshape(-1, m, m), plain_scale(s.norm, s.norm_scale, n)
            ).reshape(b, heads, n, -1)),
        ]
        core = "C normalisation"
    if grid is None and s.norm in WHITENED_NORMS:  # out of place here, so that a repeated call scales the same tensor
        steps.append(("output scale (§4.6)",
                      lambda t, core=core: scale_whitened(t[core].clone(), v(t), s.norm_scale)))
        core = "output scale (§4.6)"
    conv = layer.dwconv
    merged = lambda t, core=core: add_value_conv(t[core], ValueConv(v_tok(t), hw, conv.weight, conv.bias))  # noqa: E731
    steps += [("DWConv(V) + heads", lambda t: merged(t).transpose(1, 2).reshape(b, n, c)),
              ("output projection", lambda t: layer.proj(t["DWConv(V) + heads"]))]
    return _chain(steps)


def _softmax_steps(layer: SpatialReductionAttention, x: torch.Tensor, hw) -> list[Step]:
    b, n, c = x.shape
    heads, d = layer.num_heads, layer.head_dim
    steps = [("q projection", lambda t: layer.q(x).reshape(b, n, heads, d).transpose(1, 2))]
    keys = lambda t: x  # noqa: E731
    if layer.sr is not None:
        steps += [("reduction conv", lambda t: layer.sr(pad_to_cell(tokens_to_grid(x, hw), layer.sr_ratio))),
                  ("reduction LayerNorm", lambda t: layer.norm(grid_to_tokens(t["reduction conv"])))]
        keys = lambda t: t["reduction LayerNorm"]  # noqa: E731
    steps += [("kv projection", lambda t: layer.kv(keys(t)).reshape(b, -1, 2, heads, d).permute(2, 0, 3, 1, 4)),
              ("SDPA", lambda t: torch.nn.functional.scaled_dot_product_attention(
                  t["q projection"], *t["kv projection"].unbind(0))),
              ("output projection", lambda t: layer.proj(t["SDPA"].transpose(1, 2).reshape(b, n, c)))]
    return _chain(steps)


def floor_steps(layer: torch.nn.Module, x: torch.Tensor, hw: tuple[int, int]) -> list[Step]:
    """The compute steps of ``layer(x, hw)`` in eval mode under no_grad (x (B, N, C) float32/float64 on the CPU),
    each a callable on the outputs of the steps before it; the last one's output is the layer's. TypeError
    naming ``layer`` for a layer other than ``LaplacianAttention`` (its default path: no mask, no prefix tokens,
    no ``qk_norm``, the C backends built) or ``SpatialReductionAttention``."""
    if isinstance(layer, LaplacianAttention):
        if layer.qk_norm or layer.num_prefix_tokens or layer.norm_gain is not None or layer.dwconv is None:
            raise TypeError("layer: floor_steps times LaplacianAttention's lean path: no qk_norm, prefix tokens, "
                            "learned gain or dwconv=False")
        return _laplacian_steps(layer, x, hw)
    if isinstance(layer, SpatialReductionAttention):
        return _softmax_steps(layer, x, hw)
    raise TypeError(f"layer: expected LaplacianAttention or SpatialReductionAttention, got {type(layer).__name__}")


def check_floor_steps(layer: torch.nn.Module, x: torch.Tensor, hw: tuple[int, int]) -> list[Step]:
    """``floor_steps`` after checking that the last step's output equals ``layer(x, hw)`` (the steps are the
    layer's own computation): AssertionError otherwise."""
    steps = floor_steps(layer, x, hw)
    torch.testing.assert_close(steps[-1][1](), layer(x, hw), rtol=1e-5, atol=1e-6)
    return steps

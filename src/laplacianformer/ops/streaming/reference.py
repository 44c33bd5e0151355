"""The streaming Nyström passes in plain PyTorch: the readable specification of ``triton.py``.

This is **not** a second forward formula. It restates the Nyström core of ``ops/nystrom.py`` (C_k, C_q and
the normalisation of docs/DESIGN.md §4.3–§4.4 on ĝ = C_q W⁺ C_kᵀ, with the masking of §2.5) in the pass
form the kernels run, so that the kernels can be tested against it step by step; tests hold it equal to
the core (``attention_core``) in float64 for every streamed norm (``limits.STREAMED_NORMS``: the shipped
ones; the ablation norms run the step path, docs/DESIGN.md §4.4), K = Q and K ≠ Q, with and without a mask. Runs on
any device and dtype (float64 included). The rows of each (batch, head) group are cut into the splits of
``limits.splits_for``, as in the kernels:

1. **query pass**: per split s, with C = k(Q, L) recomputed from q and
   the landmarks, the valid-row count n_s, a shift p_s (the mean of the split's first tile of valid rows),
   a_s = Σ (c − p_s), and with ``whiten`` (``limits.whitens``: "injective") G_s = Σ (c − p_s)ᵀ (c − p_s); for K ≠ Q also Σ C_k. Shifted sums
   keep the covariance centred in float32 (no E[ccᵀ] − c̄c̄ᵀ cancellation).
2. **key pass**: the prologue combines the query partials (``combine_queries``) into n, c̄, k̄ (= c̄ when
   K = Q) and S = Σ (c − c̄)ᵀ(c − c̄) / n = Σ_s [G_s + a_s δ_sᵀ + δ_s a_sᵀ + n_s δ_s δ_sᵀ] / n with
   δ_s = p_s − c̄ (an exact identity), then S' = W⁺ᵀ S W⁺. Per key row, C_k recomputed, k̃ = C_k − k̄,
   s_j = k̃_j S' k̃_jᵀ, r_j = (max(s_j, 0) + eps)^-½ (1 without ``whiten``); per split the partials of
   M' = Σ_j r_j k̃_jᵀ v_j and Σ v.
3. **output pass**: M = α W⁺ Σ_s M'_s (α = n^-p, the §4.6 output scale of the whitened norms, else 1),
   v̄ = Σ v / n; per query row, C_q recomputed, out_i = (c_i − c̄) M + v̄ (``whiten``; "inline": c_i M + v̄). Padded
   rows weigh 0 everywhere and their output is 0. With the layer's DWConv(V) (``conv``, docs/DESIGN.md §4.5)
   the pass adds, per row i and channel c of head h, bias_c + Σ_(dy, dx ∈ {−1, 0, 1}) w_c[dy, dx] ·
   v[i + dy·gw + dx, c] over the grid neighbours inside the (gh, gw) grid (zero padding; a 1-D sequence is the
   (1, N) grid): ``ops.value_conv.value_conv_heads`` of the V the passes read.
"""

from __future__ import annotations

import torch

from ..kernel_families import KernelSpec, kernel_spec
from ..value_conv import value_conv_heads
from .limits import BLOCK_ROWS, output_alpha, splits_for, whitens


def kernel_rows(x: torch.Tensor, marks: torch.Tensor, bandwidth: float, spec: KernelSpec) -> torch.Tensor:
    """k(X, L) = f(r / bandwidth) of the family ``spec`` by broadcasting: x (..., n, d), marks (..., m, d) ->
    (..., n, m); the distance summed as the spec's accumulation (docs/DESIGN.md §1, §1.2, §1.5)."""
    diff = x.unsqueeze(-2) - marks.unsqueeze(-3)
    acc = diff.abs().sum(-1) if spec.l1 else diff.square().sum(-1)
    if spec.exp_of_accumulation:
        return torch.exp(acc * (-1.0 / bandwidth))
    return spec.kernel_of(acc, 1.0 / bandwidth)


def _split_rows(n: int, groups: int) -> list[slice]:
    splits, rows = splits_for(n, groups)
    return [slice(s * rows, min((s + 1) * rows, n)) for s in range(splits)]


def query_pass(qs, ks, marks, valid, bandwidth, spec, whiten: bool):
    """Pass 1: per split, (n_s (B, H, S), p_s (B, H, S, m), a_s (B, H, S, m), G_s (B, H, S, m, m) or None,
    Σ C_k (B, H, S, m) or None). ``valid`` (B, 1, N, 1) weights (1 valid, 0 padded)."""
    b, h, n, _ = qs.shape
    counts, shifts, sums, grams, ksums = [], [], [], [], []
    for rows in _split_rows(n, b * h):
        w = valid[:, :, rows]
        c = kernel_rows(qs[:, :, rows], marks, bandwidth, spec) * w
        first = slice(0, min(BLOCK_ROWS, c.shape[2]))
        shift = c[:, :, first].sum(2) / w[:, :, first].sum(2).clamp_min(1.0)
        d = (c - shift.unsqueeze(2)) * w
        counts.append(w.sum((2, 3)).expand(b, h))
        shifts.append(shift)
        sums.append(d.sum(2))
        if whiten:
            grams.append(d.transpose(-1, -2) @ d)
        if ks is not qs:
            ksums.append((kernel_rows(ks[:, :, rows], marks, bandwidth, spec) * w).sum(2))
    stack = lambda xs: torch.stack(xs, 2) if xs else None  # noqa: E731
    return stack(counts), stack(shifts), stack(sums), stack(grams), stack(ksums)


def combine_queries(stats):
    """The key pass's prologue: (n (B, H, 1, 1), c̄ (B, H, m), k̄ (B, H, m), S (B, H, m, m) or None)."""
    counts, shifts, sums, grams, ksums = stats
    n = counts.sum(2)[..., None, None].clamp_min(1.0)
    c_mean = (counts.unsqueeze(-1) * shifts + sums).sum(2) / n[..., 0]
    k_mean = c_mean if ksums is None else ksums.sum(2) / n[..., 0]
    cov = None
    if grams is not None:
        delta = shifts - c_mean.unsqueeze(2)
        outer = sums.unsqueeze(-1) * delta.unsqueeze(-2)
        cov = (grams + outer + outer.transpose(-1, -2)
               + counts[..., None, None] * delta.unsqueeze(-1) * delta.unsqueeze(-2)).sum(2) / n
    return n, c_mean, k_mean, cov


def key_pass(ks, vv, marks, w_inv, valid, bandwidth, spec, eps, k_mean, cov):
    """Pass 2: per split, (M'_s (B, H, S, m, e), Σ v (B, H, S, e)); ``cov`` S (whiten) or None."""
    b, h, n, _ = ks.shape
    sp = None if cov is None else w_inv.transpose(-1, -2) @ cov @ w_inv
    parts, vsums = [], []
    for rows in _split_rows(n, b * h):
        w = valid[:, :, rows]
        k = kernel_rows(ks[:, :, rows], marks, bandwidth, spec) * w
        k_t = (k - k_mean.unsqueeze(2)) * w
        if sp is not None:
            s = ((k_t @ sp) * k_t).sum(-1, keepdim=True)
            k_t = k_t * torch.rsqrt(s.clamp_min(0.0) + eps)
        v = vv[:, :, rows] * w
        parts.append(k_t.transpose(-1, -2) @ v)
        vsums.append(v.sum(2))
    return torch.stack(parts, 2), torch.stack(vsums, 2)


def output_pass(qs, marks, w_inv, valid, bandwidth, spec, whiten: bool, n, c_mean, key_stats, vv=None, conv=None,
                alpha=1.0):
    """Pass 3: (B, H, N, e), padded rows 0; plus DWConv(vv) with ``conv`` (no padding then). ``alpha``: the
    §4.6 output scale of the whitened part (``limits.output_alpha``), a number or (B, H, 1, 1)."""
    parts, vsums = key_stats
    m_mat = alpha * (w_inv @ parts.sum(2))
    c = kernel_rows(qs, marks, bandwidth, spec)
    if whiten:
        c = c - c_mean.unsqueeze(2)
    out = c @ m_mat + vsums.sum(2).unsqueeze(2) / n
    out = out * valid
    return out if conv is None else out + value_conv_heads(vv, conv)


def streaming_nystrom_reference(qs, ks, vv, marks, w_inv, bandwidth: float, kernel: str, norm: str, eps: float,
                                mask: torch.Tensor | None = None, conv=None, scale_power: float = 0.0) -> torch.Tensor:
    """The Nyström output of the core in pass form (module docstring).

    qs (B, H, N, d), ks (B, H, N, d) (``ks is qs`` when K = Q), vv (B, H, N, e), padded rows 0 (as the core
    holds them); marks (B, H, m, d); w_inv (B, H, m, m); mask (B, N) bool, True = padding, or None; conv an
    ``ops.value_conv.ValueConv`` (its grid, weight and bias; the V it convolves is vv) or None; scale_power p:
    the whitened part scaled by α = n^-p, n each sequence's valid keys (docs/DESIGN.md §4.6; 0: unscaled).
    Returns (B, H, N, e). ``norm``: a streamed norm (ValueError for another)."""
    whiten = whitens(norm)
    spec = kernel_spec(kernel)
    b, _, n, _ = qs.shape
    valid = qs.new_ones(b, 1, n, 1) if mask is None else (~mask).to(qs.dtype)[:, None, :, None]
    n_valid, c_mean, k_mean, cov = combine_queries(query_pass(qs, ks, marks, valid, bandwidth, spec, whiten))
    key_stats = key_pass(ks, vv, marks, w_inv, valid, bandwidth, spec, eps, k_mean, cov)
    alpha = output_alpha(norm, scale_power, n_valid)
    return output_pass(qs, marks, w_inv, valid, bandwidth, spec, whiten, n_valid, c_mean, key_stats, vv, conv, alpha)

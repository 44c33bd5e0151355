"""Plain PyTorch normalisation Z(ĝ)·V of docs/DESIGN.md §4 (the reference the fused backends are tested against).

- ``normalize_dense(g, v, norm)``: the formula on a materialised (B, H, N, N) ĝ (§4.1, §4.4);
- ``normalize_nystrom_reference(c_q, b, v, norm)``: the same output from the Nyström factors ĝ = C_q Bᵀ in
  O(N·m² + N·m·d) (§4.3), the op's ``composite`` backend, double-differentiable;
- ``scale_whitened``: the output scale of the whitened part (§4.6), applied after any backend.
With a ``key_padding_mask`` (B, N) every statistic counts valid tokens only (§2.5).
"""

from __future__ import annotations

import torch

from ..validation import NORM_SCALE_POWERS, NORMS, WHITENED_NORMS, check_choice


def _valid(mask: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, N) padding mask -> valid tokens as (B, 1, N, 1) weights of ``dtype`` and their count (B, 1, 1, 1)
    (at least 1, so a sequence without valid tokens divides by 1, not 0)."""
    valid = (~mask).to(dtype)[:, None, :, None]
    return valid, valid.sum(-2, keepdim=True).clamp_min(1.0)


def normalize_dense(
    g: torch.Tensor, v: torch.Tensor, norm: str, eps: float = 1e-6, key_padding_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Z(ĝ) V for a materialised ĝ.  g: (B, H, N, N) queries × keys, v: (B, H, N, e) -> (B, H, N, e).

    key_padding_mask: (B, N) bool, True = padding (docs/DESIGN.md §2.5): padded keys weigh 0, the row
    means, column statistics and 1/N count valid tokens only, padded query rows of the output are 0."""
    if key_padding_mask is not None:
        return _normalize_dense_masked(g, v, norm, eps, key_padding_mask)
    n_keys = g.shape[-1]
    if norm == "none":
        z = g
    elif norm == "rowsum":
        z = g / g.sum(-1, keepdim=True)
    elif norm == "inline":
        z = g - g.mean(-1, keepdim=True) + 1.0 / n_keys
    elif norm in ("injective", "injective_nomean"):
        h = g - g.mean(-1, keepdim=True)
        centred = h - h.mean(-2, keepdim=True)
        var = centred.square().mean(-2, keepdim=True)  # the population variance (torch.var over -2: 10× the time)
        z = (centred if norm == "injective" else h) / torch.sqrt(var + eps) + 1.0 / n_keys
    else:
        check_choice("norm", norm, NORMS)
    return z @ v


def _normalize_dense_masked(g, v, norm, eps, mask):
    check_choice("norm", norm, NORMS)
    valid_q, count = _valid(mask, g.dtype)
    valid_k = valid_q.transpose(-1, -2)
    g_k = g * valid_k
    if norm == "none":
        z = g_k
    elif norm == "rowsum":
        z = g_k / g_k.sum(-1, keepdim=True)
    else:
        h = g - g_k.sum(-1, keepdim=True) / count
        if norm == "inline":
            z = (h + 1.0 / count) * valid_k
        else:
            mu = (h * valid_q).sum(-2, keepdim=True) / count
            var = ((h - mu).square() * valid_q).sum(-2, keepdim=True) / count
            shift = mu if norm == "injective" else 0.0
            z = ((h - shift) / torch.sqrt(var + eps) + 1.0 / count) * valid_k
    return (z @ (v * valid_q)).masked_fill(mask[:, None, :, None], 0.0)




def whitened_alpha(norm_scale: str, n: int) -> float:
    """α of the scaled injective map (docs/DESIGN.md §4.6, no gain) for N = n keys: n^(−p), p =
    ``NORM_SCALE_POWERS[norm_scale]``."""
    return float(n) ** -NORM_SCALE_POWERS[norm_scale]


def plain_scale(norm: str, norm_scale: str, n: int) -> float | None:
    """α of §4.6 for a call of n keys without a learned gain or a mask (``whitened_alpha``), or None where the
    output is not scaled: a norm outside ``WHITENED_NORMS``, or ``norm_scale`` "one"."""
    if norm not in WHITENED_NORMS or NORM_SCALE_POWERS[norm_scale] == 0.0:
        return None
    return whitened_alpha(norm_scale, n)


def scale_whitened(out: torch.Tensor, v: torch.Tensor, norm_scale: str = "one", gain: torch.Tensor | None = None,
                   key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The output of the scaled injective map (docs/DESIGN.md §4.6) from that of the unscaled one.

    With z_ij = w_ij + 1/N (w the whitened part of §4.1, rows of 1/N summing V to v̄), the scaled map is
    z_ij = α_h·w_ij + 1/N, so Z_α V = v̄ + α_h (Z V − v̄), with α_h = gain_h · N^(−p): p = 0, ½, 1 for
    ``norm_scale`` "one", "inv_sqrt_n", "inv_n"; N the valid keys of each sequence.
    out, v: (B, H, N, e) (v with padded rows 0, as the operator holds it); gain: (H,) or None;
    key_padding_mask: (B, N) bool or None. Padded rows of the result are 0. Any backend's Z V enters here,
    so one function scales them all (reference, C, Triton, fused, lean recompute). Without a mask or gain the
    scale is ``torch.lerp(v̄, out, α)`` (one pass), written into ``out`` (a backend's fresh output) where no
    gradient is needed."""
    power = NORM_SCALE_POWERS[norm_scale]
    if power == 0.0 and gain is None:
        return out
    if key_padding_mask is None:
        n = v.shape[-2]
        v_bar = v.mean(-2, keepdim=True)
        if torch.jit.is_tracing() or torch.onnx.is_in_onnx_export() or torch.compiler.is_compiling():  # N an op:
            # the graph serves every size
            alpha = v.new_ones(v.shape[:-1]).sum(-1, keepdim=True).unsqueeze(-1).pow(-power)
        else:
            alpha = whitened_alpha(norm_scale, n)
        valid = None
    else:
        valid, count = _valid(key_padding_mask, v.dtype)
        v_bar = (v * valid).sum(-2, keepdim=True) / count
        alpha = count.pow(-power)
    if gain is not None:
        alpha = gain.to(out.dtype).view(1, -1, 1, 1) * alpha
    elif valid is None and isinstance(alpha, float):  # the same formula, one pass: into the fresh output if it may
        if torch.compiler.is_compiling() or (torch.is_grad_enabled() and (out.requires_grad or v.requires_grad)):
            return torch.lerp(v_bar, out, alpha)
        return torch.lerp(v_bar, out, alpha, out=out)
    scaled = v_bar + alpha * (out - v_bar)
    return scaled if valid is None else scaled * valid


def _normalize_nystrom_masked(c_q, b, v, norm, eps, mask):
    valid, count = _valid(mask, b.dtype)
    b = b * valid
    v = v * valid
    if norm == "none":
        out = c_q @ (b.transpose(-1, -2) @ v)
    elif norm == "rowsum":
        out = (c_q @ (b.transpose(-1, -2) @ v)) / (c_q @ b.sum(-2).unsqueeze(-1))
    else:
        v_mean = v.sum(-2, keepdim=True) / count
        b_centred = (b - b.sum(-2, keepdim=True) / count) * valid
        if norm == "inline":
            out = c_q @ (b_centred.transpose(-1, -2) @ v) + v_mean
        else:
            c_centred = (c_q - (c_q * valid).sum(-2, keepdim=True) / count) * valid
            cov_q = c_centred.transpose(-1, -2) @ c_centred / count
            var = ((b_centred @ cov_q) * b_centred).sum(-1).clamp_min(0.0)
            m_mat = (b_centred * torch.rsqrt(var + eps).unsqueeze(-1)).transpose(-1, -2) @ v
            out = (c_centred if norm == "injective" else c_q * valid) @ m_mat + v_mean
    return out.masked_fill(mask[:, None, :, None], 0.0)


def normalize_nystrom_reference(
    c_q: torch.Tensor, b: torch.Tensor, v: torch.Tensor, norm: str, eps: float = 1e-6,
    key_padding_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Plain autograd composite of ``normalize_nystrom`` (same arguments and shapes; double-differentiable)."""
    check_choice("norm", norm, NORMS)
    if key_padding_mask is not None:
        return _normalize_nystrom_masked(c_q, b, v, norm, eps, key_padding_mask)
    if norm == "none":
        return c_q @ (b.transpose(-1, -2) @ v)
    if norm == "rowsum":
        num = c_q @ (b.transpose(-1, -2) @ v)
        den = c_q @ b.sum(-2).unsqueeze(-1)
        return num / den
    v_mean = v.mean(-2, keepdim=True)
    b_centred = b - b.mean(-2, keepdim=True)
    if norm == "inline":
        return c_q @ (b_centred.transpose(-1, -2) @ v) + v_mean
    c_centred = c_q - c_q.mean(-2, keepdim=True)  # injective, injective_nomean
    cov_q = c_centred.transpose(-1, -2) @ c_centred / c_q.shape[-2]
    var = ((b_centred @ cov_q) * b_centred).sum(-1).clamp_min(0.0)
    m_mat = (b_centred * torch.rsqrt(var + eps).unsqueeze(-1)).transpose(-1, -2) @ v
    # mu_j = c̄ · b̃_j: subtracting it is centring the query factor (docs/DESIGN.md §4.3)
    return (c_centred if norm == "injective" else c_q) @ m_mat + v_mean

"""The backward of the fused Nyström core in pass form, plain PyTorch: the specification of the fused training
kernels (``backward_triton.py``; docs/KERNELS.md, "The fused backward"). The forward it differentiates is
``reference.py``'s passes after the fused landmark solve (docs/DESIGN.md §2.1, §3, §4.3–§4.5): L = pool(Q),
W = k(L, L), W⁺ the Newton–Schulz inverse of W + εI with the implicit backward dW = −W⁺ᵀ dW⁺ W⁺ᵀ,
C_q = k(Q, L), C_k = k(K, L) (one matrix when K = Q), and for a streamed norm (``limits.STREAMED_NORMS``:
"injective" whitens, ``limits.whitens``; "inline" does not)

    c̄, k̄ the column means of C_q, C_k; S = (C_q − c̄)ᵀ(C_q − c̄) / n; S' = W⁺ᵀ S W⁺
    k̃_j = C_kj − k̄;  s_j = k̃_j S' k̃_jᵀ, r_j = (max(s_j, 0) + ε)^-½ (whiten) or 1
    M' = Σ_j r_j k̃_jᵀ v_j,  M = α W⁺ M',  c_i = C_qi − c̄ (whiten) or C_qi
    out_i = c_i M + v̄  [+ DWConv(V)_i]

with α = n^-p the output scale of §4.6 for the whitened norms (``limits.output_alpha``; 1 otherwise, and for
p = 0, the paper's unscaled map). No padding mask and no prefix tokens (the fused training path serves
neither; the steps do). n = N.

The backward for dL/dout = G (B, H, N, e), in the order the kernels run it (per (batch, head) group):

A. ``query_grad_pass`` (rows as queries): dM = α Σ_i c_iᵀ G_i (the gradient of W⁺M', which the state keeps
   unscaled); Σ_i G_i (v̄ and the conv bias);
   with the conv, dweight_c,t = Σ_i G_ic v_(i+off_t),c.
B. ``key_grad_pass`` (rows as keys; whiten only): with dM' = W⁺ᵀ dM and u_j = v_j dM'ᵀ,
   dr_j = k̃_j·u_j, ds_j = −½ r_j³ dr_j [s_j ≥ 0], dk̃_j = r_j u_j + ds_j k̃_j (S' + S'ᵀ);
   dS' = Σ_j ds_j k̃_jᵀ k̃_j and Σ_j dk̃_j.
C. ``landmark_grad`` (m×m algebra): dM', dW⁺ = dM M'ᵀ [+ S W⁺ dS'ᵀ + Sᵀ W⁺ dS'],
   dW = −W⁺ᵀ dW⁺ W⁺ᵀ and dL from W = k(L, L); the per-row constants of D: the query side's
   −(1/n) Σ_i dc_i and (dS + dSᵀ)/n with dS = W⁺ dS' W⁺ᵀ (whiten), the key side's
   −(1/n) Σ_j dk̃_j, and v̄'s Σ G / n.
D. ``row_grad_pass`` (every row as query and key): dC_q and dC_k per row, through the kernel derivative
   (∂k(x, l)/∂x = −k(x, l) sign(x − l) / λ; L2: −2 k(x, l)(x − l) / λ) to dq, dk and the rows' part of dL,
   and dv_j = r_j k̃_j dM' + Σ G / n + the conv's transpose applied to G.
E. ``pool_grad``: dq += Pᵀ (dL_W + dL_rows), P the pooling of §2.1.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..kernel_families import KernelSpec, kernel_spec
from ..pooling import pool_landmarks
from ..value_conv import value_conv_heads
from .limits import output_alpha, whitens
from .reference import kernel_rows


class ForwardState(NamedTuple):
    """What the forward leaves for the backward, per (batch, head) group (B, H, ·): the landmarks L (m, d), W and
    W⁺ (m, m), c̄ and k̄ (m), S and S' (m, m; zeros without whiten), Σ M' (m, e), Σ v (e)."""

    marks: torch.Tensor
    w: torch.Tensor
    w_inv: torch.Tensor
    c_mean: torch.Tensor
    k_mean: torch.Tensor
    cov: torch.Tensor
    sp: torch.Tensor
    m_prime: torch.Tensor
    v_sum: torch.Tensor


def _t(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(-1, -2)


def kernel_rows_grad(x: torch.Tensor, marks: torch.Tensor, c: torch.Tensor, dc: torch.Tensor, bandwidth: float,
                     spec: KernelSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """The vjp of C = k(X, L) (``reference.kernel_rows``): x (..., n, d), marks (..., m, d), c = k(X, L) and dc
    (..., n, m) -> (dx (..., n, d), dmarks (..., m, d)). sign(0) = 0, as autograd's |·|; the L2 distance's
    direction is 0 at r = 0 (``KernelSpec.slope_of``, docs/DESIGN.md §1.5)."""
    diff = x.unsqueeze(-2) - marks.unsqueeze(-3)
    if spec.exp_of_accumulation:
        dacc = dc * c * (-1.0 / bandwidth)
    else:
        acc = (diff.abs().sum(-1) if spec.l1 else diff.square().sum(-1)) if spec.slope_needs_distance else None
        dacc = dc * spec.slope_of(acc, c, 1.0 / bandwidth)
    slope = torch.sign(diff) if spec.l1 else 2.0 * diff
    g = dacc.unsqueeze(-1) * slope
    return g.sum(-2), -g.sum(-3)


def _whitening(k_t: torch.Tensor, sp: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(s (..., n, 1), r (..., n, 1)): s_j = k̃_j S' k̃_jᵀ and r_j = (max(s_j, 0) + ε)^-½."""
    s = ((k_t @ sp) * k_t).sum(-1, keepdim=True)
    return s, torch.rsqrt(s.clamp_min(0.0) + eps)


def forward_state(qs, ks, vv, marks, w, w_inv, bandwidth: float, kernel: str, norm: str, eps: float) -> ForwardState:
    """The state of the forward passes (``ForwardState``) from q, k (``ks is qs`` when K = Q), v (B, H, N, ·),
    the landmarks and (W, W⁺) of the landmark solve."""
    whiten, spec = whitens(norm), kernel_spec(kernel)
    c_q = kernel_rows(qs, marks, bandwidth, spec)
    c_k = c_q if ks is qs else kernel_rows(ks, marks, bandwidth, spec)
    c_mean, k_mean = c_q.mean(-2), c_k.mean(-2)
    zeros = w.new_zeros(w.shape)
    cov, sp = zeros, zeros
    k_t = c_k - k_mean.unsqueeze(-2)
    if whiten:
        centred = c_q - c_mean.unsqueeze(-2)
        cov = _t(centred) @ centred / c_q.shape[-2]
        sp = _t(w_inv) @ cov @ w_inv
        k_t = k_t * _whitening(k_t, sp, eps)[1]
    return ForwardState(marks, w, w_inv, c_mean, k_mean, cov, sp, _t(k_t) @ vv, vv.sum(-2))


def output_of(qs, st: ForwardState, bandwidth: float, kernel: str, norm: str, alpha: float = 1.0) -> torch.Tensor:
    """The Nyström output (B, H, N, e) from the state (no conv): the forward the backward differentiates;
    ``alpha`` the output scale α of the whitened part (``limits.output_alpha``)."""
    _, c = _query_factor(qs, st, bandwidth, kernel_spec(kernel), whitens(norm))
    return c @ _m_mat(st, alpha) + (st.v_sum / qs.shape[-2]).unsqueeze(-2)


def _m_mat(st: ForwardState, alpha: float) -> torch.Tensor:
    """M = α W⁺ M' (B, H, m, e): the product the output reads."""
    return alpha * (st.w_inv @ st.m_prime)


def _query_factor(qs, st: ForwardState, bandwidth, spec, whiten: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(C_q, c): the query kernel rows and the factor the output reads (centred with whiten)."""
    c_q = kernel_rows(qs, st.marks, bandwidth, spec)
    return c_q, (c_q - st.c_mean.unsqueeze(-2) if whiten else c_q)


def query_grad_pass(grad, qs, vv, st: ForwardState, bandwidth: float, kernel: str, norm: str, conv=None,
                    alpha: float = 1.0) -> dict:
    """Pass A: {"dm": dM = α cᵀ G (B, H, m, e), "g_sum": Σ G (B, H, e), "dweight": (C, 1, 3, 3), "dbias": (C,)
    (with ``conv``, else None)}. grad (B, H, N, e)."""
    _, c = _query_factor(qs, st, bandwidth, kernel_spec(kernel), whitens(norm))
    out = dict(dm=alpha * (_t(c) @ grad), g_sum=grad.sum(-2), dweight=None, dbias=None)
    if conv is not None:
        vv_ = vv.detach().requires_grad_(True)
        weight = conv.weight.detach().to(vv.dtype).requires_grad_(True)
        bias = None if conv.bias is None else conv.bias.detach().to(vv.dtype).requires_grad_(True)
        with torch.enable_grad():
            y = value_conv_heads(vv_, conv._replace(weight=weight, bias=bias))
            grads = torch.autograd.grad(y, [weight] + ([] if bias is None else [bias]), grad)
        out["dweight"] = grads[0]
        out["dbias"] = None if bias is None else grads[1]
    return out


def key_grad_pass(ks, vv, st: ForwardState, d_mprime, bandwidth: float, kernel: str, eps: float) -> dict:
    """Pass B (whiten norms): {"dsp": dS' (B, H, m, m), "dkt_sum": Σ_j dk̃_j (B, H, m)}; d_mprime = W⁺ᵀ dM."""
    c_k = kernel_rows(ks, st.marks, bandwidth, kernel_spec(kernel))
    k_t = c_k - st.k_mean.unsqueeze(-2)
    dkt, ds = _key_row_grad(k_t, vv, st, d_mprime, eps)
    return dict(dsp=_t(k_t * ds) @ k_t, dkt_sum=dkt.sum(-2))


def _key_row_grad(k_t, vv, st: ForwardState, d_mprime, eps: float):
    """Whiten: (dk̃ (.., N, m), ds (.., N, 1)) of each key row from u_j = v_j dM'ᵀ (module docstring, B)."""
    s, r = _whitening(k_t, st.sp, eps)
    u = vv @ _t(d_mprime)
    dr = (k_t * u).sum(-1, keepdim=True)
    ds = dr * (-0.5) * r ** 3 * (s >= 0).to(r.dtype)
    return r * u + ds * (k_t @ (st.sp + _t(st.sp))), ds


def landmark_grad(st: ForwardState, a: dict, b: dict | None, n: int, bandwidth: float, kernel: str,
                  norm: str, alpha: float = 1.0) -> dict:
    """Pass C: from pass A's ``a`` and pass B's ``b`` (whiten, else None) -> {"d_mprime" (B, H, m, e), "q_cov"
    (B, H, m, m) or None, "q_const" (B, H, m), "k_const" (B, H, m), "v_const" (B, H, e), "d_marks" (B, H, m, d):
    dL through W}. The row pass D adds q_const + (C_q − c̄) q_cov to dC_q, k_const to dC_k, v_const to dv."""
    whiten, spec = whitens(norm), kernel_spec(kernel)
    w_inv = st.w_inv
    d_mprime = _t(w_inv) @ a["dm"]
    dw_inv = a["dm"] @ _t(st.m_prime)
    q_const, q_cov = st.c_mean.new_zeros(st.c_mean.shape), None
    if whiten:
        dsp = b["dsp"]
        dw_inv = dw_inv + st.cov @ w_inv @ _t(dsp) + _t(st.cov) @ w_inv @ dsp
        d_cov = w_inv @ dsp @ _t(w_inv)
        q_cov = (d_cov + _t(d_cov)) / n
        q_const = -(a["g_sum"].unsqueeze(-2) @ _t(_m_mat(st, alpha))).squeeze(-2) / n
    dkt_sum = b["dkt_sum"] if whiten else (st.v_sum.unsqueeze(-2) @ _t(d_mprime)).squeeze(-2)
    k_const = -dkt_sum / n
    v_const = a["g_sum"] / n
    dw = -_t(w_inv) @ dw_inv @ _t(w_inv)
    dx, dl = kernel_rows_grad(st.marks, st.marks, st.w, dw, bandwidth, spec)
    return dict(d_mprime=d_mprime, q_cov=q_cov, q_const=q_const, k_const=k_const, v_const=v_const,
                d_marks=dx + dl)


def row_grad_pass(grad, qs, ks, vv, st: ForwardState, c: dict, bandwidth: float, kernel: str, norm: str,
                  eps: float, conv=None, alpha: float = 1.0) -> dict:
    """Pass D: {"dq" (B, H, N, d) (K = Q: the whole gradient of the one factor), "dk" (B, H, N, d) or None (K = Q),
    "dv" (B, H, N, e), "d_marks" (B, H, m, d): the rows' part of dL} from pass C's ``c``."""
    whiten, spec = whitens(norm), kernel_spec(kernel)
    c_q = kernel_rows(qs, st.marks, bandwidth, spec)
    dcq = grad @ _t(_m_mat(st, alpha)) + c["q_const"].unsqueeze(-2)
    if c["q_cov"] is not None:
        dcq = dcq + (c_q - st.c_mean.unsqueeze(-2)) @ c["q_cov"]
    c_k = c_q if ks is qs else kernel_rows(ks, st.marks, bandwidth, spec)
    k_t = c_k - st.k_mean.unsqueeze(-2)
    if whiten:
        dkt, _ = _key_row_grad(k_t, vv, st, c["d_mprime"], eps)
        k_w = k_t * _whitening(k_t, st.sp, eps)[1]
    else:
        dkt, k_w = vv @ _t(c["d_mprime"]), k_t
    dck = dkt + c["k_const"].unsqueeze(-2)
    dv = k_w @ c["d_mprime"] + c["v_const"].unsqueeze(-2)
    if conv is not None:
        dv = dv + value_conv_transpose_heads(grad, conv)
    dq, dl_q = kernel_rows_grad(qs, st.marks, c_q, dcq, bandwidth, spec)
    dk, dl_k = kernel_rows_grad(ks, st.marks, c_k, dck, bandwidth, spec)
    if ks is qs:
        return dict(dq=dq + dk, dk=None, dv=dv, d_marks=dl_q + dl_k)
    return dict(dq=dq, dk=dk, dv=dv, d_marks=dl_q + dl_k)


def value_conv_transpose_heads(grad: torch.Tensor, conv) -> torch.Tensor:
    """The vjp of ``value_conv_heads`` with respect to V: grad (B, H, N, e) -> (B, H, N, e), the 3×3 depthwise conv
    of G with the flipped weight, no bias: dv_i,c = Σ_t w_c,t G_(i−off_t),c."""
    b, h, n, e = grad.shape
    gh, gw = (1, n) if conv.hw is None else conv.hw
    grid = grad.permute(0, 1, 3, 2).reshape(b, h * e, gh, gw)
    y = F.conv2d(grid, conv.weight.to(grad.dtype).flip(-1, -2), None, padding=1, groups=h * e)
    return y.reshape(b, h, e, n).transpose(-1, -2)


def pool_grad(dq: torch.Tensor, d_marks: torch.Tensor, qs: torch.Tensor, hw, grid) -> torch.Tensor:
    """Pass E: dq + Pᵀ dL, P the adaptive average pooling of the (gh, gw) token grid to the landmark grid."""
    _, vjp = torch.func.vjp(lambda x: pool_landmarks(x, hw, grid), qs)
    return dq + vjp(d_marks)[0]


def streaming_backward_reference(grad, qs, ks, vv, st: ForwardState, hw, grid, bandwidth: float, kernel: str,
                                 norm: str, eps: float, conv=None, scale_power: float = 0.0) -> dict:
    """Passes A–E: {"dq", "dk" (None when ``ks is qs``), "dv", "dweight", "dbias"} for dL/dout ``grad``
    (B, H, N, e) of the fused core's output (plus DWConv(V) with ``conv``, an ``ops.value_conv.ValueConv``
    whose V is vv); scale_power p: the output scale α = N^-p of §4.6 (``limits.output_alpha``)."""
    n = qs.shape[-2]
    alpha = output_alpha(norm, scale_power, float(n))
    a = query_grad_pass(grad, qs, vv, st, bandwidth, kernel, norm, conv, alpha)
    b = None
    if whitens(norm):
        b = key_grad_pass(ks, vv, st, _t(st.w_inv) @ a["dm"], bandwidth, kernel, eps)
    c = landmark_grad(st, a, b, n, bandwidth, kernel, norm, alpha)
    d = row_grad_pass(grad, qs, ks, vv, st, c, bandwidth, kernel, norm, eps, conv, alpha)
    dq = pool_grad(d["dq"], c["d_marks"] + d["d_marks"], qs, hw, grid)
    return dict(dq=dq, dk=d["dk"], dv=d["dv"], dweight=a["dweight"], dbias=a["dbias"])

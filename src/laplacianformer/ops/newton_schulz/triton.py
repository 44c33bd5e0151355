"""Batched Newton–Schulz Triton kernels (docs/DESIGN.md §3, §6), one program per (batch, head) matrix, m <= 128.

- ``newton_schulz_fwd_kernel``: P = W + eps·I (done by the caller), alpha = 1.8 / (max_i sum_j |P_ij|)^2
  per matrix, V0 = alpha·P, then ``iters`` steps of V <- 2V - V (P V), all in registers with float32
  accumulation; the matrix is zero-padded to a power of two >= 16 (the padding stays zero).
- ``implicit_grad_kernel``: dL/dW = -Vᵀ G Vᵀ, the implicit backward of ``_ImplicitInverse``.
Inputs float32/float16/bfloat16; results in the input dtype.

Unlike the reference ``naive.newton_schulz_iterate_reference`` (and the C loop), this kernel measures no
residual: it has neither the ``tol`` stop nor the keep-best safeguard, and returns the last iterate. Where
the reference's residual keeps falling at every check (well-conditioned P, or eps > 0 as in the default
attention) that is the reference's result to rounding; where rounding takes over (e.g. float32,
cond(P) > 1e7, eps = 0) the reference keeps an earlier iterate and this kernel may return a diverged one.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

MAX_M = 128


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def newton_schulz_fwd_kernel(P, V, M, iters, IEEE: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    r = tl.arange(0, BLOCK)
    mask = (r[:, None] < M) & (r[None, :] < M)
    offs = b * M * M + r[:, None] * M + r[None, :]
    p = tl.load(P + offs, mask=mask, other=0.0).to(tl.float32)
    row = tl.max(tl.sum(tl.abs(p), axis=1), axis=0)
    v = p * (1.8 / (row * row))
    for _ in range(iters):
        v = 2.0 * v - _dot(v, _dot(p, v, IEEE), IEEE)
    tl.store(V + offs, v.to(V.dtype.element_ty), mask=mask)


@triton.jit
def implicit_grad_kernel(V, G, DW, M, IEEE: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    r = tl.arange(0, BLOCK)
    mask = (r[:, None] < M) & (r[None, :] < M)
    offs = b * M * M + r[:, None] * M + r[None, :]
    offs_t = b * M * M + r[None, :] * M + r[:, None]
    vt = tl.load(V + offs_t, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(G + offs, mask=mask, other=0.0).to(tl.float32)
    dw = -_dot(_dot(vt, g, IEEE), vt, IEEE)
    tl.store(DW + offs, dw.to(DW.dtype.element_ty), mask=mask)


def _block(m: int) -> int:
    return max(16, triton.next_power_of_2(m))


def aot_specialisations(d_max: int = 128, m_max: int = 128):
    """Every (kernel, signature, constexprs, num_warps, num_stages, label) the launchers can produce for
    m <= m_max (benchmarks/triton_aot.py)."""
    for tname in ("fp32", "fp16", "bf16"):
        for block in (16, 32, 64, 128):
            if block > max(16, triton.next_power_of_2(m_max)):
                continue
            warps = 4 if block <= 64 else 8
            yield (newton_schulz_fwd_kernel, {"P": f"*{tname}", "V": f"*{tname}", "M": "i32", "iters": "i32"},
                   dict(IEEE=tname == "fp32", BLOCK=block), warps, 3, f"ns_fwd dtype={tname} m={block}")
            yield (implicit_grad_kernel, {"V": f"*{tname}", "G": f"*{tname}", "DW": f"*{tname}", "M": "i32"},
                   dict(IEEE=tname == "fp32", BLOCK=block), warps, 3, f"ns_grad dtype={tname} m={block}")


@triton_op("laplacianformer::newton_schulz_fwd", mutates_args=())
def newton_schulz_fwd(p: torch.Tensor, iters: int) -> torch.Tensor:
    """V ≈ P^{-1} by ``iters`` Newton–Schulz steps.  p: (B, m, m) contiguous, symmetric, m <= 128."""
    b, m, _ = p.shape
    v = torch.empty_like(p)
    wrap_triton(newton_schulz_fwd_kernel)[(b,)](
        p, v, m, iters, IEEE=p.dtype == torch.float32, BLOCK=_block(m), num_warps=4 if m <= 64 else 8
    )
    return v


@triton_op("laplacianformer::newton_schulz_implicit_grad", mutates_args=())
def implicit_grad(v: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """-Vᵀ G Vᵀ.  v, grad: (B, m, m) contiguous -> (B, m, m)."""
    b, m, _ = v.shape
    dw = torch.empty_like(v)
    wrap_triton(implicit_grad_kernel)[(b,)](
        v, grad, dw, m, IEEE=v.dtype == torch.float32, BLOCK=_block(m), num_warps=4 if m <= 64 else 8
    )
    return dw


def newton_schulz_iterate_triton(p: torch.Tensor, iters: int) -> torch.Tensor:
    """``iters`` Newton–Schulz steps, last iterate (no keep-best safeguard, see the module docstring).
    p: (..., m, m) symmetric -> (..., m, m)."""
    m = p.shape[-1]
    return newton_schulz_fwd(p.reshape(-1, m, m).contiguous(), int(iters)).reshape(p.shape)


def implicit_grad_triton(v: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """-Vᵀ G Vᵀ per matrix.  v, grad: (..., m, m)."""
    m = v.shape[-1]
    return implicit_grad(v.reshape(-1, m, m).contiguous(), grad.reshape(-1, m, m).contiguous()).reshape(v.shape)

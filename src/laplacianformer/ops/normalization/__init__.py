"""The op ``normalization`` of docs/DESIGN.md §4: Z(ĝ)·V from the Nyström factors, and its registry (§6.3).

- ``normalize_nystrom(c_q, b, v, norm)``: Z(C_q Bᵀ) V with C_q (B, H, N, m) and B = C_k W⁺ᵀ (B, H, N, m), in
  O(N·m² + N·m·d) time and O(N·m) memory; ``normalize_nystrom(c_q, c_k, v, norm, w_inv=W⁺)`` takes C_k and
  W⁺ (B, H, m, m) instead of B (the attention's call: "injective" then never forms B). Backends, in the
  order "auto" tries them: ``triton`` (``triton.py``, CUDA), ``cpu`` (``cpu.py``: one C call per forward
  and per backward), ``fused`` (the PyTorch functions of ``fused.py``), all three "injective" and "inline"
  only, hand-written first-order backward, eager only; and ``composite`` (``reference.py``'s
  ``normalize_nystrom_reference``, the plain autograd composite they are tested against, every norm).
- ``normalize_nystrom_saving`` / ``normalize_nystrom_grad``: the same op split into a forward without
  autograd that returns small saved statistics and a backward from them and the (recomputed) factors,
  each backend's ``saving`` / ``grad``; the lean recompute (``ops/recompute.py``, docs/DESIGN.md §5.5)
  runs them.
- ``normalize_dense``, ``scale_whitened``, ``normalize_nystrom_reference``: ``reference.py``.
  ``limits.py``: what the Triton backend serves, without importing Triton.

Injective variant, per image and head (Eq. 4 and 6 of the paper, with our choices of docs/DESIGN.md §4):
  h_ij = ĝ_ij - mean_j ĝ_ij,  mu_j = mean_i h_ij,  s_j² = var_i h_ij (population variance),
  z_ij = (h_ij - mu_j) / sqrt(s_j² + eps) + 1/N,  out_i = sum_j z_ij v_j.
"injective_nomean" (ablation, docs/DESIGN.md §4.4): z_ij = h_ij / sqrt(s_j² + eps) + 1/N, the same s_j²;
in factor form out_i = c_i M + v̄ instead of (c_i - c̄) M + v̄.  Composite backend only.
"""

from __future__ import annotations

import importlib

import torch

from .. import _runtime
from ..dispatch import Backend, Op
from ..capabilities import Call, Serves, unserved
from ..validation import NORM_SCALE_POWERS, NORMS, SHIPPED_NORMS, check_choice
from .fused import InjectiveNormalization, InlineNormalization, injective_forward, inline_forward
from .limits import triton_unfit
from .reference import normalize_dense, normalize_nystrom_reference, scale_whitened

__all__ = ["NORMALIZATION", "FUSED_NORMS", "NORM_SCALE_POWERS", "normalize_dense", "normalize_nystrom",
           "normalize_nystrom_grad", "normalize_nystrom_reference", "normalize_nystrom_saving",
           "normalize_nystrom_scaled", "scale_whitened"]

FUSED_NORMS = SHIPPED_NORMS  # the fused backends serve the shipped norms (validation.SHIPPED_NORMS)


def normalize_nystrom(
    c_q: torch.Tensor,
    b: torch.Tensor,
    v: torch.Tensor,
    norm: str,
    eps: float = 1e-6,
    *,
    w_inv: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Z(C_q Bᵀ) V without forming the N×N matrix.

    c_q: (..., N, m) query–landmark kernel; b: (..., N, m) with row j = W⁺ c_kj (key side);
    v: (..., N, e); leading dimensions broadcast.  Returns (..., N, e).

    With ``w_inv`` = W⁺ (..., m, m) given, ``b`` is C_k (..., N, m) instead and the key factor is
    B = C_k W⁺ᵀ: the result of ``normalize_nystrom(c_q, b @ w_inv.transpose(-1, -2), v, norm, eps)``.
    "injective" then never forms B (one N·m² product less in the forward and two in the backward, no
    (N, m) tensor kept for the backward) and returns gradients for C_k and W⁺; the other variants and
    the composite form B.

    Op ``normalization``: "injective" and "inline" run a fused backend (``triton`` on CUDA, ``cpu``, the
    C loops, on float32/float64 CPU tensors, else ``fused``, PyTorch); their backward is first order only
    (double backward raises).  Under torch.compile, tracing or ONNX export, and for the other variants,
    this is ``normalize_nystrom_reference`` (backend ``composite``).

    key_padding_mask: (B, N) bool, True = padding, for factors (B, H, N, ·) (docs/DESIGN.md §2.5): padded
    keys weigh 0, b̄, c̄, Cov(C_q), v̄ and 1/N count valid tokens only, padded query rows of the output
    are 0. Only the composite serves it (the fused backends refuse).
    """
    check_choice("norm", norm, NORMS)
    if key_padding_mask is None:
        return NORMALIZATION(c_q, b, v, norm, eps, w_inv)
    return NORMALIZATION(c_q, b, v, norm, eps, w_inv, key_padding_mask)


def _call(c_q, b, v, norm="injective", eps=1e-6, w_inv=None, key_padding_mask=None) -> Call:
    """The op's arguments as the ``Call`` record its backends' declarations are checked against."""
    return Call((c_q, b, v) if w_inv is None else (c_q, b, v, w_inv), norm=norm, m=b.shape[-1], e=v.shape[-1],
                masked=key_padding_mask is not None)


_TRITON_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
FUSED = Serves("the fused path", norms=FUSED_NORMS, masks=False)
CPU = Serves("the fused path", devices=("cpu",), dtypes=(torch.float32, torch.float64), norms=FUSED_NORMS, masks=False)
TRITON = Serves("the fused path", devices=("cuda",), interpreted=True, dtypes=_TRITON_DTYPES, norms=FUSED_NORMS,
                masks=False)
"""What the fused, cpu and triton backends serve (``ops/capabilities.py``): the shipped norms, no mask."""


def _eager_only() -> str | None:
    why = _runtime.capture_reason(modes=False)
    return None if why is None else f"{why} (the fused functions are eager only)"


def _fused_refusal(*inputs) -> str | None:
    return unserved(FUSED, _call(*inputs)) or _eager_only()


def _cpu_refusal(*inputs) -> str | None:
    why = unserved(CPU, _call(*inputs)) or _eager_only()
    if why is not None:
        return why
    from . import cpu

    if not cpu.available():
        return f"C loops unavailable ({cpu.load_error()})"
    return None


def _triton_refusal(*inputs) -> str | None:
    call = _call(*inputs)
    why = unserved(TRITON, call) or _eager_only() or triton_unfit(call.tensors[0].dtype, call.m, call.e)
    if why is not None:
        return why
    ok, why = _runtime.triton_available()
    return None if ok else why


def _triton_auto_refusal(c_q, *_args) -> str | None:
    if c_q.device.type != "cuda":
        return "only chosen automatically for CUDA tensors (the interpreter is for tests)"
    return None


def _flatten(c_q, b, v, w_inv):
    """The factors broadcast to one batch shape and flattened to (G, ·, ·) (views where strides allow)."""
    factors = (c_q, b, v) if w_inv is None else (c_q, b, v, w_inv)
    batch = torch.broadcast_shapes(*(t.shape[:-2] for t in factors))
    flat = [t.expand(*batch, *t.shape[-2:]).reshape(-1, *t.shape[-2:]) for t in factors]
    return batch, flat[0], flat[1], flat[2], (flat[3] if w_inv is not None else None)


def _cpu(c_q, b, v, norm, eps, w_inv, alpha=None):
    """The C backend; with ``alpha`` (its ``scaled`` form, no gradient) the §4.6 scale applied in the C pass."""
    from .cpu import normalize_cpu

    batch, c3, k3, v3, w3 = _flatten(c_q, b, v, w_inv)
    out = normalize_cpu(c3, k3, v3, norm, eps, w3, alpha=alpha)
    return out.reshape(*batch, *out.shape[-2:])


def _triton(c_q, b, v, norm, eps, w_inv):
    from .triton import normalize_triton

    batch, c3, k3, v3, w3 = _flatten(c_q, b, v, w_inv)
    out = normalize_triton(c3, k3, v3, norm, eps, w3)
    return out.reshape(*batch, *out.shape[-2:])


def _fused(c_q, b, v, norm, eps, w_inv):
    if w_inv is not None and norm != "injective":
        b, w_inv = b @ w_inv.transpose(-1, -2), None
    factors = (c_q, b, v) if w_inv is None else (c_q, b, v, w_inv)
    batch = torch.broadcast_shapes(*(t.shape[:-2] for t in factors))
    c3, b3, v3, *w3 = (t.expand(*batch, *t.shape[-2:]).reshape(-1, *t.shape[-2:]) for t in factors)
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in factors)
    if norm == "injective":
        w3 = w3[0] if w3 else None
        out = (InjectiveNormalization.apply(c3, b3, w3, v3, float(eps)) if needs_grad
               else injective_forward(c3, b3, v3, eps, w3))
    else:
        out = InlineNormalization.apply(c3, b3, v3) if needs_grad else inline_forward(c3, b3, v3)
    return out.reshape(*batch, *out.shape[-2:])


def _composite(c_q, b, v, norm, eps, w_inv, key_padding_mask=None):
    if w_inv is not None:
        b = b @ w_inv.transpose(-1, -2)
    return normalize_nystrom_reference(c_q, b, v, norm, eps, key_padding_mask)


# Saving forms (``normalize_nystrom_saving`` / ``normalize_nystrom_grad``): each fused backend's module has
# forward_saving(c, k, w, v, eps, inj) -> (out, saved) and backward_saved(grad, c, k, w, v, inj, saved) on
# (G, ·, ·) factors; these wrap them for (..., ·, ·) factors of one batch shape.


def _flat_saving(module, c_q, b, v, norm, eps, w_inv):
    batch, c3, k3, v3, w3 = _flatten(c_q, b, v, w_inv)
    out, saved = module.forward_saving(c3, k3, w3, v3, float(eps), norm == "injective")
    return out.reshape(*batch, *out.shape[-2:]), tuple(saved)


def _flat_grad(module, grad_out, saved, c_q, b, v, norm, eps, w_inv):
    batch, c3, k3, v3, w3 = _flatten(c_q, b, v, w_inv)
    grads = module.backward_saved(grad_out.reshape(-1, *grad_out.shape[-2:]), c3, k3, w3, v3, norm == "injective",
                                  saved)
    return tuple(None if d is None else d.reshape(*batch, *d.shape[-2:]) for d in grads)


def _module(name: str):
    """The backend module ``name`` of this package, imported at first use (``triton`` needs Triton)."""
    return importlib.import_module(f"{__name__}.{name}")


def _saving_of(name: str):
    """A backend's ``saving`` form: ``_flat_saving`` with its module (imported when first called)."""
    return lambda *inputs: _flat_saving(_module(name), *inputs)


def _grad_of(name: str):
    """A backend's ``grad`` form: ``_flat_grad`` with its module (imported when first called)."""
    return lambda *inputs: _flat_grad(_module(name), *inputs)


def _composite_saving(c_q, b, v, norm, eps, w_inv, key_padding_mask=None):
    with torch.no_grad():
        return _composite(c_q, b, v, norm, eps, w_inv, key_padding_mask), ()


def _composite_grad(grad_out, saved, c_q, b, v, norm, eps, w_inv, key_padding_mask=None):
    """The composite keeps no statistics: its forward is recomputed under autograd."""
    leaves = [None if t is None else t.detach().requires_grad_(True) for t in (c_q, b, v, w_inv)]
    with torch.enable_grad():
        out = _composite(leaves[0], leaves[1], leaves[2], norm, eps, leaves[3], key_padding_mask)
    wanted = [t for t in leaves if t is not None]
    grads = iter(torch.autograd.grad(out, wanted, grad_out, allow_unused=True))
    d_c, d_b, d_v, d_w = (None if t is None else next(grads) for t in leaves)
    return d_c, d_b, d_w, d_v


# ``saving(c_q, b, v, norm, eps, w_inv[, key_padding_mask])`` -> (out, saved tensors), without autograd;
# ``grad(grad_out, saved, c_q, b, v, norm, eps, w_inv[, key_padding_mask])`` -> (dc_q, db, dw_inv, dv).
NORMALIZATION = Op("normalization", [
    Backend("triton", _triton, _triton_refusal, _triton_auto_refusal, grad=_grad_of("triton"),
            saving=_saving_of("triton")),
    Backend("cpu", _cpu, _cpu_refusal, grad=_grad_of("cpu"), saving=_saving_of("cpu"), scaled=_cpu),
    Backend("fused", _fused, _fused_refusal, grad=_grad_of("fused"), saving=_saving_of("fused")),
    Backend("composite", _composite, grad=_composite_grad, saving=_composite_saving),
], signature="normalize_nystrom(c_q, b, v, norm, eps, w_inv[, key_padding_mask]): c_q, b (..., N, m), v (..., N, e)")


def normalize_nystrom_scaled(c_q: torch.Tensor, b: torch.Tensor, v: torch.Tensor, norm: str, eps: float = 1e-6, *,
                             w_inv: torch.Tensor | None = None, alpha: float) -> tuple[torch.Tensor, bool]:
    """``normalize_nystrom`` without a mask for a call that needs no gradient, with the output scale of
    docs/DESIGN.md §4.6 where the selected backend applies it in its own pass (its ``scaled`` form: the C
    loops scale M): (v̄ + alpha (Z V − v̄), True); elsewhere (the unscaled Z V, False), for the caller's
    ``scale_whitened``."""
    inputs = (c_q, b, v, norm, eps, w_inv)
    backend = NORMALIZATION.select(*inputs)
    if backend.scaled is not None:
        return backend.scaled(*inputs, alpha), True
    return backend.run(*inputs), False


def normalize_nystrom_saving(
    c_q: torch.Tensor, b: torch.Tensor, v: torch.Tensor, norm: str, eps: float = 1e-6, *,
    w_inv: torch.Tensor | None = None, key_padding_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, str, tuple[torch.Tensor, ...]]:
    """``normalize_nystrom`` without autograd, for a caller that runs the backward itself (the lean
    recompute, docs/DESIGN.md §5.5): returns (out, backend name, saved).

    ``saved`` holds what ``normalize_nystrom_grad`` needs besides the factors, which the caller keeps or
    recomputes. The fused backends keep statistics of m×m and m×e size and one or two values per key
    (c̄, k̄, S W, S', s or its scale, r, M', M, Σ r v: docs/DESIGN.md §4.3), never an (N, m) tensor; the
    composite keeps nothing and its gradient recomputes its forward. Same backend and values as
    ``normalize_nystrom``; the factors must share one batch shape (no broadcasting)."""
    check_choice("norm", norm, NORMS)
    factors = [t for t in (c_q, b, v, w_inv) if t is not None]
    if len({t.shape[:-2] for t in factors}) != 1:
        raise ValueError(f"factors: expected one batch shape, got {[tuple(t.shape) for t in factors]}")
    inputs = (c_q, b, v, norm, eps, w_inv) + (() if key_padding_mask is None else (key_padding_mask,))
    backend = NORMALIZATION.select(*inputs)
    out, saved = backend.saving(*inputs)
    return out, backend.name, saved


def normalize_nystrom_grad(
    backend: str, grad: torch.Tensor, saved: tuple[torch.Tensor, ...], c_q: torch.Tensor, b: torch.Tensor,
    v: torch.Tensor, norm: str, eps: float = 1e-6, *, w_inv: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, ...]:
    """(dc_q, db, dw_inv, dv) for dL/dout ``grad`` of ``normalize_nystrom_saving``: ``backend`` and ``saved``
    are what it returned, the factors the same values (recomputed or kept). dw_inv is None without
    ``w_inv``; a factor the variant does not use gets None."""
    inputs = (c_q, b, v, norm, eps, w_inv) + (() if key_padding_mask is None else (key_padding_mask,))
    return NORMALIZATION.by_name[backend].grad(grad, saved, *inputs)

"""Kernel families of the attention as one registry (docs/DESIGN.md §1.5).

A family is k(x, y) = f(r / λ) with r one of three distances and f a profile:

    r = ‖x − y‖₁ ("l1"),  ‖x − y‖₂ ("l2")  or  ‖x − y‖₂² ("sq_l2")

    KERNEL_FAMILIES["matern32"]            # KernelSpec(name, id, distance, f, f′, defaults)
    kernel_spec("cauchy").kernel_of(acc, 1 / lam)

Every backend reads the spec, never the family's name: the C and Triton loops sum the spec's
``accumulation`` (|·| for "l1", (·)² for "l2" and "sq_l2"; "l2" takes √ of it), the PyTorch side applies the
profile (``kernel_of``) and its slope (``slope_of``, dk/d(accumulated distance)), and fused Triton code
takes the spec's ``id`` as a constexpr. A new family is one ``KernelSpec`` here (its profile and defaults)
and one row of the design doc; ``register_kernel_family`` adds one at run time (tests, experiments).
Backends declare which families they serve (by distance or id), so an unserved family is refused with a
reason, never computed as another one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

__all__ = ["DISTANCES", "KERNEL_FAMILIES", "KernelSpec", "code_path_representatives", "kernel_names", "kernel_spec", "register_kernel_family",
           "unregister_kernel_family"]

DISTANCES = ("l1", "l2", "sq_l2")
"""r: the L1 distance, the L2 distance and the squared L2 distance."""
_ACCUMULATION = {"l1": "l1", "l2": "sq_l2", "sq_l2": "sq_l2"}
_POWER = {"l1": 1, "l2": 1, "sq_l2": 2}

Profile = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class KernelSpec:
    """One kernel family k(x, y) = f(r / λ) (docs/DESIGN.md §1.5).

    name: the ``kernel=`` value; id: a small integer the fused code takes (unique); distance: "l1" | "l2" |
    "sq_l2"; profile f(u) and profile_slope f′(u), u = r / λ ≥ 0, elementwise on tensors (f(0) = 1);
    default_lam(d), default_qk_scale(d): the bandwidth on q, k scaled by qk_scale, and the scale, for head
    dim d (§1.1, §1.4); slope_from_value: f′ as a function of f's value, when it is one (exp: −f; cauchy:
    −f²), so a backward needs no distance; summary: one line for docs and errors.
    """

    name: str
    id: int
    distance: str
    profile: Profile
    profile_slope: Profile
    default_lam: Callable[[int], float]
    default_qk_scale: Callable[[int], float]
    slope_from_value: Profile | None = None
    summary: str = ""
    accumulation: str = field(init=False)
    power: int = field(init=False)

    def __post_init__(self) -> None:
        if self.distance not in DISTANCES:
            raise ValueError(f"distance: expected one of {list(DISTANCES)}, got {self.distance!r}")
        object.__setattr__(self, "accumulation", _ACCUMULATION[self.distance])
        object.__setattr__(self, "power", _POWER[self.distance])

    def __reduce__(self):
        """Pickled by name (a settings object or a module holds its spec): the registered family on load."""
        return kernel_spec, (self.name,)

    @property
    def l1(self) -> bool:
        """Whether the fused loops sum |x − y| (else (x − y)²)."""
        return self.accumulation == "l1"

    def distance_of(self, acc: torch.Tensor) -> torch.Tensor:
        """r from the accumulated sum (``accumulation``): itself, or √ for "l2"."""
        return acc.clamp_min(0.0).sqrt() if self.distance == "l2" else acc

    def kernel_of(self, acc: torch.Tensor, inv_lam: float) -> torch.Tensor:
        """k = f(r / λ) from the accumulated distance ``acc`` (any shape)."""
        return self.profile(self.distance_of(acc) * inv_lam)

    def slope_of(self, acc: torch.Tensor | None, k: torch.Tensor, inv_lam: float) -> torch.Tensor:
        """dk / d(acc) for the accumulated distance ``acc`` and k = ``kernel_of(acc)``: f′(u) / λ, times
        1 / (2r) for "l2" (whose r = √acc), 0 where r = 0 there (the minimal-norm subgradient, as sign(0) = 0
        for "l1": docs/DESIGN.md §1.5). ``acc`` may be None when ``slope_needs_distance`` is False."""
        if not self.slope_needs_distance:
            return self.slope_from_value(k) * inv_lam
        r = self.distance_of(acc)
        slope = (self.profile_slope(r * inv_lam) if self.slope_from_value is None else self.slope_from_value(k)) * inv_lam
        if self.distance == "l2":
            slope = torch.where(r > 0, slope / (2.0 * r).clamp_min(torch.finfo(r.dtype).tiny), 0.0)
        return slope

    @property
    def exp_of_accumulation(self) -> bool:
        """Whether k = exp(−acc / λ) on the accumulated distance itself (the Laplacian and the Gaussian), so a
        backend may compute it in place as exp(scale · acc) and its slope as −k / λ."""
        return self.profile is _exp_neg and self.distance != "l2"

    @property
    def slope_needs_distance(self) -> bool:
        """Whether ``slope_of`` reads the distance (else k alone gives it)."""
        return self.slope_from_value is None or self.distance == "l2"

    def bandwidth(self, lam: float, qk_scale: float) -> float:
        """The bandwidth on unscaled q and k: k(s·x, s·y; λ) = k(x, y; λ / s^p), p = 1 for "l1" and "l2",
        2 for "sq_l2" (docs/DESIGN.md §1.2)."""
        return lam / qk_scale ** self.power


def _exp_neg(u: torch.Tensor) -> torch.Tensor:
    return torch.exp(-u)


def _neg_exp_neg(u: torch.Tensor) -> torch.Tensor:
    return -torch.exp(-u)


def _neg(k: torch.Tensor) -> torch.Tensor:
    return -k


_SQRT3 = math.sqrt(3.0)


def _matern32(u: torch.Tensor) -> torch.Tensor:
    return (1.0 + _SQRT3 * u) * torch.exp(-_SQRT3 * u)


def _matern32_slope(u: torch.Tensor) -> torch.Tensor:
    return -3.0 * u * torch.exp(-_SQRT3 * u)


def _cauchy(u: torch.Tensor) -> torch.Tensor:
    return 1.0 / (1.0 + u)


def _cauchy_slope(u: torch.Tensor) -> torch.Tensor:
    return -1.0 / (1.0 + u).square()


def _neg_square(k: torch.Tensor) -> torch.Tensor:
    return -k * k


def _inv_sqrt(d: int) -> float:
    return d ** -0.5


def _one(_d: int) -> float:
    return 1.0


KERNEL_FAMILIES: dict[str, KernelSpec] = {}
"""name -> spec, in registration order (the five shipped families first)."""


def register_kernel_family(spec: KernelSpec) -> KernelSpec:
    """Adds ``spec`` to the registry; ValueError when its name or id is taken."""
    if spec.name in KERNEL_FAMILIES:
        raise ValueError(f"kernel: a family named {spec.name!r} is registered already")
    if any(s.id == spec.id for s in KERNEL_FAMILIES.values()):
        raise ValueError(f"kernel: id {spec.id} of {spec.name!r} is taken")
    KERNEL_FAMILIES[spec.name] = spec
    return spec


def unregister_kernel_family(name: str) -> None:
    """Removes a family added by ``register_kernel_family`` (the shipped five cannot be removed)."""
    if name in SHIPPED:
        raise ValueError(f"kernel: {name!r} is a shipped family")
    KERNEL_FAMILIES.pop(name, None)


def kernel_names() -> tuple[str, ...]:
    """The registered families' names."""
    return tuple(KERNEL_FAMILIES)


def code_path_representatives() -> tuple[str, ...]:
    """One registered family per distinct path through the backends (accumulation, distance, in-place exp,
    slope from the value or the distance): what an expensive test needs to cover them all."""
    seen, names = set(), []
    for spec in KERNEL_FAMILIES.values():
        path = (spec.accumulation, spec.distance, spec.exp_of_accumulation, spec.slope_needs_distance)
        if path not in seen:
            seen.add(path)
            names.append(spec.name)
    return tuple(names)


def kernel_spec(name: str) -> KernelSpec:
    """The spec of family ``name``; ValueError naming ``kernel`` for an unknown one."""
    spec = KERNEL_FAMILIES.get(name) if isinstance(name, str) else None
    if spec is None:
        raise ValueError(f"kernel: expected one of {list(KERNEL_FAMILIES)}, got {name!r}")
    return spec


for _spec in (
    KernelSpec("laplacian", 0, "l1", _exp_neg, _neg_exp_neg, lambda d: 4.0, _inv_sqrt, _neg,
               "exp(-||x-y||_1 / lam), the paper's; lam = 4 on q, k scaled by d^-1/2"),
    KernelSpec("gaussian", 1, "sq_l2", _exp_neg, _neg_exp_neg, lambda d: 2.0 * math.sqrt(d), _one, _neg,
               "exp(-||x-y||_2^2 / lam), SOFT's; lam = 2 sqrt(d) on the raw q, k"),
    KernelSpec("exponential", 2, "l2", _exp_neg, _neg_exp_neg, _one, _inv_sqrt, _neg,
               "exp(-||x-y||_2 / lam); lam = 1 on q, k scaled by d^-1/2"),
    KernelSpec("matern32", 3, "l2", _matern32, _matern32_slope, _one, _inv_sqrt, None,
               "(1 + sqrt(3) r / lam) exp(-sqrt(3) r / lam), r = ||x-y||_2; lam = 1 on q, k scaled by d^-1/2"),
    KernelSpec("cauchy", 4, "sq_l2", _cauchy, _cauchy_slope, _one, _inv_sqrt, _neg_square,
               "1 / (1 + ||x-y||_2^2 / lam); lam = 1 on q, k scaled by d^-1/2"),
):
    register_kernel_family(_spec)

SHIPPED = tuple(KERNEL_FAMILIES)
"""The families the package ships (the fused Triton code has a profile for each: ``id`` 0..4)."""

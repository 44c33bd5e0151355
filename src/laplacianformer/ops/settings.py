"""The attention operator's settings as one frozen object, validated once where it is made (docs/DESIGN.md §1–§4).

    s = AttentionSettings(head_dim=32, norm="inline")       # checks every field; lam, qk_scale resolved
    s.lam, s.qk_scale                                        # 4.0, 32**-0.5 (the kernel's defaults, §1.1, §1.4)
    s.bandwidth                                              # lam on unscaled q and k (§1.2)

``laplacian_attention`` builds one from its keywords, ``LaplacianAttention`` holds one, and the operator,
the normalisation and the lean recompute receive it as one argument. ``OPERATOR_SETTINGS`` (the field
names but ``head_dim``) is the one list of the operator's keywords; ``settings_from(head_dim, options,
where)`` takes a dict of them and names an unknown key.

``key`` is a string that stands for the settings where only plain values may travel (a TorchScript or
torch.fx leaf, ``layers/laplacian_attention.py``); ``from_key`` returns the object made with that key, or
makes it again from the string (a graph loaded in another process).
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, fields

from .kernel_families import KernelSpec
from .validation import (
    NORM_SCALES,
    NORMS,
    NS_BACKWARDS,
    SOLVERS,
    WHITENED_NORMS,
    check_choice,
    check_kernel,
    check_landmarks,
    check_positive,
    check_positive_int,
)

__all__ = ["AttentionSettings", "OPERATOR_SETTINGS", "SETTINGS_VERSION", "WHITENED_OUTPUT_SCALE", "default_bandwidth",
           "default_norm_scale", "settings_from"]



def default_bandwidth(kernel: str, head_dim: int, lam: float | None = None, qk_scale: float | None = None):
    """(lam, qk_scale) with each None replaced by the kernel family's default (``KernelSpec.default_lam``,
    ``default_qk_scale``; docs/DESIGN.md §1.1, §1.4, §1.5).

    Laplacian exp(-||s·q - s·k||_1 / lam): lam = 4, s = d**-0.5 (ours). Gaussian exp(-||s·q - s·k||² / lam):
    lam = 2·sqrt(d), s = 1, i.e. SOFT's exp(-||q - k||² / (2·sqrt(d))) on the raw q and k. Given values
    are checked (finite, > 0) and kept.
    """
    spec = check_kernel(kernel)
    if lam is None:
        lam = spec.default_lam(head_dim)
    if qk_scale is None:
        qk_scale = spec.default_qk_scale(head_dim)
    return check_positive("lam", lam), check_positive("qk_scale", qk_scale)


WHITENED_OUTPUT_SCALE = "inv_n"
"""The output scale of the whitened norms when ``norm_scale`` is not given (docs/DESIGN.md §4.6, decided in
§7.6 on validation, test and detection evidence): the whitened part divided by N. The one place of that
choice; ``norm_scale="one"`` is the unscaled map (the default up to version 0.1, under which every result
recorded before the change was trained; ``SETTINGS_VERSION``)."""

SETTINGS_VERSION = 2
"""The version of the defaults a saved configuration was written under: 1 (no ``settings_version`` entry;
up to 0.1): ``norm_scale`` "one" when not given; 2: ``WHITENED_OUTPUT_SCALE``. Readers of saved files fill
what a version-1 file left out with the defaults of its time (``layers.token_mixer.saved_attn_kwargs``)."""


def default_norm_scale(norm: str) -> str:
    """``norm_scale`` when not given: ``WHITENED_OUTPUT_SCALE`` for the whitened norms, "one" (no scale) for the
    others."""
    return WHITENED_OUTPUT_SCALE if norm in WHITENED_NORMS else "one"


def validate(s: "AttentionSettings") -> tuple[float, float]:
    """Checks every field of ``s`` (errors name the argument) and returns the resolved (lam, qk_scale).
    Runs once per object, from ``__post_init__``."""
    check_positive_int("head_dim", s.head_dim)
    lam, qk_scale = default_bandwidth(s.kernel, s.head_dim, s.lam, s.qk_scale)
    check_landmarks(s.landmarks)
    check_choice("norm", s.norm, NORMS)
    check_choice("solver", s.solver, SOLVERS)
    check_choice("ns_backward", s.ns_backward, NS_BACKWARDS)
    check_positive_int("iters", s.iters)
    check_positive("ns_eps", s.ns_eps, allow_zero=True)
    check_positive("norm_eps", s.norm_eps, allow_zero=s.norm not in WHITENED_NORMS)
    check_choice("norm_scale", s.norm_scale, NORM_SCALES)
    if s.norm_scale != "one" and s.norm not in WHITENED_NORMS:
        raise ValueError(f"norm_scale: scales the whitened part of norm in {list(WHITENED_NORMS)} "
                         f"(docs/DESIGN.md §4.6), got norm={s.norm!r} with norm_scale={s.norm_scale!r}")
    return lam, qk_scale


_BY_KEY: dict[str, "AttentionSettings"] = {}


@dataclass(frozen=True)
class AttentionSettings:
    """Everything of the attention operator that is not a tensor (docs/DESIGN.md §1–§4).

    head_dim: d, on which the defaults of lam and qk_scale depend. kernel: a registered family
    (``kernel_families``: "laplacian", "gaussian", "exponential", "matern32", "cauchy"; §1, §1.4, §1.5). lam, qk_scale: None is the kernel's default (``default_bandwidth``); held resolved. landmarks:
    a grid (lh, lw), an int or None (exact), resolved per call by ``resolve_landmarks`` (§2.2). norm: the
    normalisation (§4.1, §4.4); norm_scale: "one" | "inv_sqrt_n" | "inv_n" (§4.6), None the norm's default
    (``default_norm_scale``: "inv_n" for the whitened norms), held resolved; norm_eps: the whitening ε. solver, iters, ns_eps, ns_backward: the regularised inverse (§3).
    """

    head_dim: int
    kernel: str = "laplacian"
    lam: float | None = None
    qk_scale: float | None = None
    landmarks: object = (7, 7)
    norm: str = "injective"
    norm_scale: str | None = None
    norm_eps: float = 1e-6
    solver: str = "newton_schulz"
    iters: int = 20
    ns_eps: float = 0.01
    ns_backward: str = "implicit"

    def __post_init__(self) -> None:
        if self.norm_scale is None:
            object.__setattr__(self, "norm_scale", default_norm_scale(self.norm))
        lam, qk_scale = validate(self)
        resolved = dict(lam=lam, qk_scale=qk_scale, landmarks=check_landmarks(self.landmarks),
                        ns_eps=float(self.ns_eps), norm_eps=float(self.norm_eps))
        for name, value in resolved.items():
            object.__setattr__(self, name, value)
        # resolved once, plain attributes (not fields): torch.compile traces readers of these
        object.__setattr__(self, "_spec", check_kernel(self.kernel))
        object.__setattr__(self, "_bandwidth", self._spec.bandwidth(self.lam, self.qk_scale))

    @property
    def spec(self) -> KernelSpec:
        """The kernel family's spec (``kernel_families``), resolved once."""
        return self._spec

    @property
    def bandwidth(self) -> float:
        """The bandwidth on unscaled q and k (docs/DESIGN.md §1.2): k(s·x, s·y; lam) = k(x, y; lam / s^p), p = 1
        for the L1 and L2 distances and 2 for the squared L2 distance (the pooled landmarks of s·q are s times
        those of q), so the operator never scales the (N, d) tensors."""
        return self._bandwidth

    @functools.cached_property
    def key(self) -> str:
        """A string standing for these settings (JSON of the fields); ``from_key`` maps it back to this object."""
        key = json.dumps(asdict(self), sort_keys=True)
        _BY_KEY.setdefault(key, self)
        return key

    @staticmethod
    def from_key(key: str) -> "AttentionSettings":
        """The settings whose ``key`` is ``key``: the object already made (no validation), else a new one."""
        found = _BY_KEY.get(key)
        if found is not None:
            return found
        made = AttentionSettings(**json.loads(key))
        return _BY_KEY.setdefault(made.key, made)

    def options(self) -> dict:
        """The operator keywords (every field but ``head_dim``), resolved."""
        return {name: getattr(self, name) for name in OPERATOR_SETTINGS}


OPERATOR_SETTINGS = tuple(f.name for f in fields(AttentionSettings) if f.name != "head_dim")
"""The operator's keywords, in one place: ``laplacian_attention``'s, the lean recompute's, the modules'."""

DEFAULTS = {f.name: f.default for f in fields(AttentionSettings) if f.name != "head_dim"}
"""Each operator keyword's default (lam and qk_scale: None, the kernel's)."""


def settings_from(head_dim: int, options: dict, where: str) -> AttentionSettings:
    """``AttentionSettings(head_dim, **options)``; a key that is not an operator setting raises TypeError
    naming it and ``where`` (the function that received it)."""
    unknown = sorted(set(options) - set(OPERATOR_SETTINGS))
    if unknown:
        raise TypeError(f"{where}: unexpected keyword argument(s) {unknown}; operator settings are "
                        f"{list(OPERATOR_SETTINGS)}")
    return AttentionSettings(head_dim, **options)

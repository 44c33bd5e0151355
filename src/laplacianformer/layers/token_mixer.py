"""The token mixers of the models by name: the one list of attention kinds and their arguments (docs/DESIGN.md §5).

    ATTENTIONS = ("laplacian", "gaussian", "exponential", "matern32", "cauchy", "softmax")
    make = get_token_mixer("laplacian", {"lam": 2.0})     # validates the name and the keys once
    attn = make(64, 2, sr_ratio=8, landmarks=(7, 7))      # an nn.Module: forward(x (B, N, C), hw) -> (B, N, C)

Each kernel family of ``ops.kernel_families`` ("laplacian", "gaussian", "exponential", "matern32", "cauchy") is
``LaplacianAttention`` with that kernel (docs/DESIGN.md §1, §1.5, §2);
"softmax" is PVTv2's ``SpatialReductionAttention`` (the quadratic baseline).

Presets (``ATTN_PRESETS``, docs/DESIGN.md §7.6) name whole ``attn_kwargs`` of the Laplacian attention:
``get_token_mixer("laplacian", {"iters": 10}, attn_preset="tuned")`` is the preset's kwargs with
``attn_kwargs`` over them (an explicit key wins).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from torch import nn

from ..ops.kernel_families import SHIPPED
from ..ops.settings import DEFAULTS, OPERATOR_SETTINGS, SETTINGS_VERSION, default_norm_scale
from .laplacian_attention import LaplacianAttention
from .spatial_reduction_attention import SpatialReductionAttention

__all__ = ["ATTENTIONS", "ATTN_PRESETS", "LAPLACIAN_ATTN_KWARGS", "LAPLACIAN_MODULE_KWARGS", "SOFTMAX_ATTN_KWARGS", "check_token_mixer", "get_token_mixer",
           "preset_kwargs", "saved_attn_kwargs", "with_output_scale"]

ATTENTIONS = SHIPPED + ("softmax",)
# ``attn_kwargs`` keys each kind accepts (forwarded to the module's constructor, which checks the values):
# the operator settings (``ops.settings.OPERATOR_SETTINGS``) but the kernel, which ``attn`` names, and the
# module's own options
LAPLACIAN_MODULE_KWARGS = ("tie_qk", "dwconv", "recompute")
LAPLACIAN_ATTN_KWARGS = tuple(k for k in OPERATOR_SETTINGS if k != "kernel") + LAPLACIAN_MODULE_KWARGS
SOFTMAX_ATTN_KWARGS = ("sr_ratio",)
ATTN_PRESETS: dict[str, dict] = {
    "paper": {},
    "tuned": {"lam": 0.5, "norm": "inline", "tie_qk": True},
}
"""Named ``attn_kwargs`` of ``attn="laplacian"`` (docs/DESIGN.md §7.6). "paper": the paper's method, the
defaults (λ = 4, the injective normalisation, separate keys). "tuned": λ = 0.5, the inline normalisation,
tied keys: the configuration chosen on validation data by ``laplacianformer accuracy`` (§7.5; its test
confirmation: docs/RESULTS.md); tests/layers check it is that choice."""


def preset_kwargs(attn: str, attn_preset: str | None, attn_kwargs: Mapping | None) -> dict | None:
    """The ``attn_kwargs`` of ``attn_preset`` with ``attn_kwargs`` over them (None: ``attn_kwargs`` as given).

    ValueError naming ``attn_preset`` for an unknown name or an attention other than "laplacian" (the
    presets' λ and normalisation are settings of the Laplacian kernel)."""
    if attn_preset is None:
        return attn_kwargs
    if attn_preset not in ATTN_PRESETS:
        raise ValueError(f"attn_preset: expected one of {list(ATTN_PRESETS)}, got {attn_preset!r}")
    if attn != "laplacian":
        raise ValueError(f"attn_preset: the presets configure attn='laplacian', got attn={attn!r}")
    if attn_kwargs is not None and not isinstance(attn_kwargs, Mapping):
        raise TypeError(f"attn_kwargs: expected a dict, got {type(attn_kwargs).__name__}")
    return {**ATTN_PRESETS[attn_preset], **(attn_kwargs or {})}


def with_output_scale(attn: str, kwargs: dict) -> dict:
    """``kwargs`` of a laplacian/gaussian mixer with ``norm_scale`` resolved where not given
    (``ops.settings.default_norm_scale`` of its norm), so a model's saved config names the scale it was built
    with and reads the same under any later default; softmax kwargs as they are."""
    if attn == "softmax" or "norm_scale" in kwargs:
        return kwargs
    return {**kwargs, "norm_scale": default_norm_scale(kwargs.get("norm", DEFAULTS["norm"]))}


def saved_attn_kwargs(attn: str, kwargs: Mapping | None, version: int) -> dict | None:
    """The ``attn_kwargs`` of a saved configuration written under the defaults of ``version``
    (``ops.settings.SETTINGS_VERSION``): a version-1 file (before 0.2) that does not name ``norm_scale`` was
    built with "one", its default then, and gets it; later files as they are."""
    if kwargs is None or attn == "softmax" or version >= SETTINGS_VERSION or "norm_scale" in kwargs:
        return None if kwargs is None else dict(kwargs)
    return {**kwargs, "norm_scale": "one"}


def check_token_mixer(attn: str, attn_kwargs: Mapping | None = None) -> dict:
    """Validate an attention name and the keys of its ``attn_kwargs``; returns the kwargs as a new dict.

    ValueError naming ``attn`` or ``attn_kwargs`` otherwise. A list ``landmarks`` becomes a tuple (JSON
    configs store tuples as lists). The values are checked by the module that receives them.
    """
    if attn not in ATTENTIONS:
        raise ValueError(f"attn: expected one of {list(ATTENTIONS)}, got {attn!r}")
    if attn_kwargs is not None and not isinstance(attn_kwargs, Mapping):
        raise TypeError(f"attn_kwargs: expected a dict, got {type(attn_kwargs).__name__}")
    kwargs = dict(attn_kwargs or {})
    if attn == "softmax":
        unknown = sorted(set(kwargs) - set(SOFTMAX_ATTN_KWARGS))
        if unknown:
            raise ValueError(f"attn_kwargs: keys {unknown} do not apply to attn='softmax' (allowed: {list(SOFTMAX_ATTN_KWARGS)})")
    else:
        unknown = sorted(set(kwargs) - set(LAPLACIAN_ATTN_KWARGS))
        if unknown:
            raise ValueError(f"attn_kwargs: unknown keys {unknown} for attn={attn!r} (allowed: {list(LAPLACIAN_ATTN_KWARGS)})")
    if isinstance(kwargs.get("landmarks"), list):
        kwargs["landmarks"] = tuple(kwargs["landmarks"])
    return kwargs


def get_token_mixer(attn: str = "laplacian", attn_kwargs: Mapping | None = None,
                    attn_preset: str | None = None) -> Callable[..., nn.Module]:
    """A builder of the ``attn`` token mixer, validated once (``check_token_mixer``), with the kwargs of
    ``attn_preset`` under ``attn_kwargs`` (``preset_kwargs``).

    The builder ``make(dim, num_heads, *, sr_ratio=1, landmarks=(7, 7), qkv_bias=True, attn_drop=0.0,
    proj_drop=0.0)`` returns the module for one block; ``attn_kwargs`` entries take precedence over
    ``sr_ratio`` (softmax) and ``landmarks`` (laplacian/gaussian). ``make.attn`` and ``make.attn_kwargs``
    hold the validated name and kwargs.
    """
    kwargs = with_output_scale(attn, check_token_mixer(attn, preset_kwargs(attn, attn_preset, attn_kwargs)))

    def make(
        dim: int, num_heads: int, *, sr_ratio: int = 1, landmarks=(7, 7), qkv_bias: bool = True,
        attn_drop: float = 0.0, proj_drop: float = 0.0,
    ) -> nn.Module:
        common = dict(qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=proj_drop)
        if attn == "softmax":
            return SpatialReductionAttention(dim, num_heads, **{"sr_ratio": sr_ratio, **kwargs}, **common)
        return LaplacianAttention(dim, num_heads, kernel=attn, **{"landmarks": landmarks, **kwargs}, **common)

    make.attn, make.attn_kwargs = attn, kwargs
    return make

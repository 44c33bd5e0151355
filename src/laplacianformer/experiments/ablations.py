"""The ablations of DESIGN.md §7 as data: each one changes a single setting of the micro model.

A ``Variant`` is (label, attention type, attention kwargs, model kwargs) handed to
``laplacianformer.train.TrainConfig``; everything else in the run is the shared base budget.
``qk_scale`` variants are written as powers of the head dim d and resolved once d is known.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Variant:
    """One value of the ablated setting."""

    label: str
    attn: str = "laplacian"
    attn_kwargs: dict[str, Any] = field(default_factory=dict)
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    qk_scale_power: float | None = None


@dataclass(frozen=True)
class Ablation:
    """A named sweep; ``default`` is the label of the design's default value (docs/DESIGN.md) (None when there is none)."""

    name: str
    setting: str
    question: str
    variants: tuple[Variant, ...]
    default: str | None
    quick: tuple[str, str]

    def variant(self, label: str) -> Variant:
        for v in self.variants:
            if v.label == label:
                return v
        raise ValueError(f"values: {label!r} is not a value of ablation {self.name!r}; expected one of {self.labels}")

    @property
    def labels(self) -> list[str]:
        return [v.label for v in self.variants]


def _lam(x: float) -> Variant:
    return Variant(f"lam={x:g}", attn_kwargs={"lam": x})


ABLATIONS: dict[str, Ablation] = {
    a.name: a
    for a in (
        Ablation(
            "lambda", "lam", "Kernel bandwidth (paper Tiny/ImageNet: 79.4/79.6/80.1/81.4/78.5, best at 4)",
            tuple(_lam(x) for x in (0.5, 1.0, 2.0, 4.0, 8.0)), "lam=4", ("lam=1", "lam=4"),
        ),
        Ablation(
            "solver", "solver", "Newton–Schulz vs conjugate gradient, 20 iterations each (paper: NS +2.2 top-1)",
            (Variant("newton_schulz", attn_kwargs={"solver": "newton_schulz", "iters": 20}),
             Variant("cg", attn_kwargs={"solver": "cg", "iters": 20})),
            "newton_schulz", ("newton_schulz", "cg"),
        ),
        Ablation(
            "kernel", "attn", "Laplacian vs Gaussian kernel (same Nyström/normalisation) vs softmax attention",
            (Variant("laplacian", attn="laplacian"), Variant("gaussian", attn="gaussian"), Variant("softmax", attn="softmax")),
            "laplacian", ("laplacian", "gaussian"),
        ),
        Ablation(
            "norm", "norm", "Injective normalisation and its variants (DESIGN.md §4)",
            tuple(Variant(n, attn_kwargs={"norm": n}) for n in ("injective", "inline", "rowsum", "none")),
            "injective", ("injective", "inline"),
        ),
        Ablation(
            "landmarks", "landmarks", "Landmark grid m = 16 / 49 / 100 (stage-1 grid must exceed 10×10)",
            tuple(Variant(f"m={s * s}", attn_kwargs={"landmarks": [s, s]}) for s in (4, 7, 10)),
            "m=49", ("m=16", "m=49"),
        ),
        Ablation(
            "ns_iters", "iters", "Newton–Schulz iteration count",
            tuple(Variant(f"iters={i}", attn_kwargs={"solver": "newton_schulz", "iters": i}) for i in (5, 10, 20, 40)),
            "iters=20", ("iters=5", "iters=20"),
        ),
        Ablation(
            "qk_scale", "qk_scale", "Scale of q and k before the distance: 1, d^-1/4, d^-1/2 (DESIGN.md §1)",
            (Variant("1", qk_scale_power=0.0), Variant("d^-0.25", qk_scale_power=-0.25), Variant("d^-0.5", qk_scale_power=-0.5)),
            "d^-0.5", ("1", "d^-0.5"),
        ),
        Ablation(
            "tie_qk", "tie_qk", "Separate keys vs K = Q (SOFT's symmetric variant)",
            (Variant("separate", attn_kwargs={"tie_qk": False}), Variant("tied", attn_kwargs={"tie_qk": True})),
            "separate", ("separate", "tied"),
        ),
    )
}


def get_ablation(name: str) -> Ablation:
    """The registered ablation ``name``; ValueError listing the names otherwise."""
    if name not in ABLATIONS:
        raise ValueError(f"name: unknown ablation {name!r}; expected one of {sorted(ABLATIONS)} or 'all'")
    return ABLATIONS[name]


def resolve_variant(variant: Variant, head_dim: int | None) -> dict[str, Any]:
    """TrainConfig fields (attn, attn_kwargs, model_kwargs) of a variant, qk_scale resolved for head dim d."""
    attn_kwargs = dict(variant.attn_kwargs)
    if variant.qk_scale_power is not None:
        if head_dim is None:
            raise ValueError("head_dim: the qk_scale ablation needs the model's (single) attention head dim")
        attn_kwargs["qk_scale"] = float(head_dim) ** variant.qk_scale_power
    return {"attn": variant.attn, "attn_kwargs": attn_kwargs, "model_kwargs": dict(variant.model_kwargs)}

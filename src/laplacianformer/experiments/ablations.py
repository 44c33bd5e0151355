"""The ablations of docs/DESIGN.md §7 (ablations and evidence) as data: each changes one setting of the micro model.

A ``Variant`` is (label, attention type, attention kwargs, model kwargs) handed to
``laplacianformer.train.TrainConfig``; everything else is the fixed recipe of ``protocol.PROTOCOL``.
Some values are only known once the model is: ``qk_scale`` as a power of the head dim d, the Gaussian
bandwidth as a multiple of √d, and CG's iteration count at Newton–Schulz's wall time (measured by
``solver_timing``); ``resolve_variant`` fills them in.

Each ablation also lists its ``claims``: differences a − b (paired by seed) with the side the claim takes
(+1: a > b).  A claim is the paper's, or, for our own open choices (landmark count, NS iterations, qk_scale,
tied keys, the key mean μ_j), "our default is the best of the values tried", judged by the same verdicts.
Every other value is compared with the default for information only (side None, verdict ``no_claim``).  A
``Ref`` with several labels means "the best of these by mean top-1" (selected on the same seeds that then
estimate the difference: the comparison is descriptive, biased towards a difference).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SOFT_LAM_SQRT_D = 2.0  # SOFT's Gaussian exp(-||q - k||² / (2 √d)) on unscaled q, k
GAUSSIAN_BW = (0.25, 0.5, 2.0, 4.0)  # bandwidth multiples around SOFT's (λ, the denominator, scaled)
NS_ITERS = (10, 20, 30, 40)  # Newton–Schulz iteration counts of the ns_iters ablation
NS_ITERS_DEFAULT = 20  # the operator's default (ops.laplacian_attention ``iters``; docs/DESIGN.md §3.6)


@dataclass(frozen=True)
class Variant:
    """One value of the ablated setting."""

    label: str
    attn: str = "laplacian"
    attn_kwargs: dict[str, Any] = field(default_factory=dict)
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    qk_scale_power: float | None = None  # qk_scale = d ** power
    lam_sqrt_d: float | None = None  # lam = this · √d
    cg_at_ns_time: bool = False  # iters = CG iterations taking NS's wall time (solver_timing)


@dataclass(frozen=True)
class Ref:
    """One side of a comparison: a value of an ablation, or the best (highest mean top-1) of several."""

    labels: tuple[str, ...]
    ablation: str | None = None  # None: the ablation that declares the claim

    @property
    def selected(self) -> bool:
        return len(self.labels) > 1

    def describe(self) -> str:
        where = f"{self.ablation}:" if self.ablation else ""
        return f"best of {where}{{{', '.join(self.labels)}}}" if self.selected else where + self.labels[0]


@dataclass(frozen=True)
class Claim:
    """A statement about differences a − b; ``side`` +1 when it says a > b (the paper's claim or our default's),
    None for a comparison reported without a claim."""

    text: str
    pairs: tuple[tuple[Ref, Ref], ...]
    side: int | None = 1


@dataclass(frozen=True)
class Ablation:
    """A named sweep; ``default`` is the label of the design's default value."""

    name: str
    setting: str
    question: str
    variants: tuple[Variant, ...]
    default: str
    quick: tuple[str, str]
    claims: tuple[Claim, ...] = ()

    def variant(self, label: str) -> Variant:
        for v in self.variants:
            if v.label == label:
                return v
        raise ValueError(f"values: {label!r} is not a value of ablation {self.name!r}; expected one of {self.labels}")

    @property
    def labels(self) -> list[str]:
        return [v.label for v in self.variants]

    @property
    def all_claims(self) -> tuple[Claim, ...]:
        """The declared claims, then "value vs default" (no claim) for every value no claim compares."""
        covered = {r.labels[0] for c in self.claims for pair in c.pairs for r in pair
                   if not r.selected and r.ablation is None}
        extra = tuple(
            Claim(f"{lb} vs default {self.default} (no paper claim)", ((Ref((lb,)), Ref((self.default,))),), None)
            for lb in self.labels if lb != self.default and lb not in covered
        )
        return self.claims + extra


def _r(*labels: str, ablation: str | None = None) -> Ref:
    return Ref(tuple(labels), ablation)


def _beats(text: str, winner: str, losers, side: int | None = 1) -> Claim:
    return Claim(text, tuple((_r(winner), _r(lb)) for lb in losers), side)


def _our_default_best(text: str, default: str, labels) -> Claim:
    """Our open choice: the default beats every other value tried (each comparison paired by seed)."""
    return _beats(f"Our default: {text}", default, [lb for lb in labels if lb != default])


LAMBDAS = (0.5, 1.0, 2.0, 4.0, 8.0)
LAMBDA_LABELS = tuple(f"lam={x:g}" for x in LAMBDAS)
GAUSSIAN_LABELS = ("gaussian",) + tuple(f"gaussian-bw{f:g}" for f in GAUSSIAN_BW)

ABLATIONS: dict[str, Ablation] = {
    a.name: a
    for a in (
        Ablation(
            "lambda", "lam", "Kernel bandwidth (paper Tiny/ImageNet: 79.4/79.6/80.1/81.4/78.5, best at 4)",
            tuple(Variant(lb, attn_kwargs={"lam": x}) for lb, x in zip(LAMBDA_LABELS, LAMBDAS)),
            "lam=4", ("lam=1", "lam=4"),
            (_beats("λ = 4 is the best of {0.5, 1, 2, 4, 8}", "lam=4", [lb for lb in LAMBDA_LABELS if lb != "lam=4"]),),
        ),
        Ablation(
            "solver", "solver",
            "Newton–Schulz vs conjugate gradient: 20 iterations each, and CG at NS's wall time (paper: NS +2.2 top-1)",
            (Variant("newton_schulz", attn_kwargs={"solver": "newton_schulz", "iters": 20}),
             Variant("cg", attn_kwargs={"solver": "cg", "iters": 20}),
             Variant("cg-equal-time", attn_kwargs={"solver": "cg"}, cg_at_ns_time=True)),
            "newton_schulz", ("newton_schulz", "cg"),
            (_beats("Newton–Schulz beats CG at equal iterations (20)", "newton_schulz", ["cg"]),
             _beats("Newton–Schulz beats CG at equal wall time", "newton_schulz", ["cg-equal-time"])),
        ),
        Ablation(
            "kernel", "attn",
            "Laplacian vs Gaussian kernel (same Nyström/normalisation; Gaussian at SOFT's bandwidth and ×¼…×4) "
            "vs softmax attention (PVTv2 spatial reduction, and full)",
            (Variant("laplacian", attn="laplacian"),
             Variant("gaussian", attn="gaussian", attn_kwargs={"qk_scale": 1.0}, lam_sqrt_d=SOFT_LAM_SQRT_D),
             *(Variant(f"gaussian-bw{f:g}", attn="gaussian", attn_kwargs={"qk_scale": 1.0}, lam_sqrt_d=SOFT_LAM_SQRT_D * f)
               for f in GAUSSIAN_BW),
             Variant("softmax-sr", attn="softmax"),
             Variant("softmax-full", attn="softmax", attn_kwargs={"sr_ratio": 1})),
            "laplacian", ("laplacian", "gaussian"),
            (_beats("Laplacian beats Gaussian, each at its default bandwidth (λ = 4 vs SOFT's 2√d)", "laplacian",
                    ["gaussian"]),
             Claim("Laplacian beats Gaussian, best bandwidth vs best bandwidth (λ sweep vs Gaussian ×¼…×4)",
                   ((_r(*LAMBDA_LABELS, ablation="lambda"), _r(*GAUSSIAN_LABELS)),))),
        ),
        Ablation(
            "norm", "norm", "Injective normalisation and its variants (docs/DESIGN.md §4)",
            (*(Variant(n, attn_kwargs={"norm": n}) for n in ("injective", "inline", "rowsum", "none")),
             Variant("injective-nomean", attn_kwargs={"norm": "injective_nomean"})),
            "injective", ("injective", "inline"),
            (_beats("injective beats inline, rowsum and none", "injective", ["inline", "rowsum", "none"]),
             _our_default_best("the injective map with the key mean μ_j subtracted beats it without "
                               "(the student reproduction's reading)", "injective", ("injective-nomean",))),
        ),
        Ablation(
            "landmarks", "landmarks",
            "Landmark grid m = 16 / 49 / 100 (m = 100 on 196 stage-1 tokens: under 4 tokens per landmark, nearly exact)",
            tuple(Variant(f"m={s * s}", attn_kwargs={"landmarks": [s, s]}) for s in (4, 7, 10)),
            "m=49", ("m=16", "m=49"),
            (_our_default_best("m = 49 (a 7×7 grid) is the best of m = 16 / 49 / 100", "m=49",
                               ("m=16", "m=100")),),
        ),
        Ablation(
            "ns_iters", "iters", "Newton–Schulz iteration count",
            tuple(Variant(f"iters={i}", attn_kwargs={"solver": "newton_schulz", "iters": i}) for i in NS_ITERS),
            f"iters={NS_ITERS_DEFAULT}", ("iters=10", f"iters={NS_ITERS_DEFAULT}"),
            (_our_default_best("20 Newton–Schulz iterations are the best of 10 / 20 / 30 / 40", f"iters={NS_ITERS_DEFAULT}",
                               tuple(f"iters={i}" for i in NS_ITERS)),),
        ),
        Ablation(
            "qk_scale", "qk_scale", "Scale of q and k before the distance: 1, d^-1/4, d^-1/2 (docs/DESIGN.md §1.1)",
            (Variant("1", qk_scale_power=0.0), Variant("d^-0.25", qk_scale_power=-0.25), Variant("d^-0.5", qk_scale_power=-0.5)),
            "d^-0.5", ("1", "d^-0.5"),
            (_our_default_best("qk_scale = d^-1/2 is the best of 1 / d^-1/4 / d^-1/2", "d^-0.5",
                               ("1", "d^-0.25")),),
        ),
        Ablation(
            "tie_qk", "tie_qk", "Separate keys vs K = Q (SOFT's symmetric variant)",
            (Variant("separate", attn_kwargs={"tie_qk": False}), Variant("tied", attn_kwargs={"tie_qk": True})),
            "separate", ("separate", "tied"),
            (_our_default_best("separate keys beat tied keys K = Q", "separate", ("tied",)),),
        ),
    )
}


def get_ablation(name: str) -> Ablation:
    """The registered ablation ``name``; ValueError listing the names otherwise."""
    if name not in ABLATIONS:
        raise ValueError(f"name: unknown ablation {name!r}; expected one of {sorted(ABLATIONS)} or 'all'")
    return ABLATIONS[name]


def resolve_variant(variant: Variant, head_dim: int | None, cg_iters: int | None = None) -> dict[str, Any]:
    """TrainConfig fields (attn, attn_kwargs, model_kwargs) of a variant, with its head-dim-dependent values
    and (for CG at NS's time) ``cg_iters`` filled in."""
    attn_kwargs = dict(variant.attn_kwargs)
    if variant.qk_scale_power is not None or variant.lam_sqrt_d is not None:
        if head_dim is None:
            raise ValueError(f"head_dim: {variant.label!r} needs the model's (single) attention head dim")
        if variant.qk_scale_power is not None:
            attn_kwargs["qk_scale"] = float(head_dim) ** variant.qk_scale_power
        if variant.lam_sqrt_d is not None:
            attn_kwargs["lam"] = variant.lam_sqrt_d * float(head_dim) ** 0.5
    if variant.cg_at_ns_time:
        if cg_iters is None:
            raise ValueError(f"cg_iters: {variant.label!r} needs CG's iteration count at NS's wall time (solver_timing)")
        attn_kwargs["iters"] = int(cg_iters)
    return {"attn": variant.attn, "attn_kwargs": attn_kwargs, "model_kwargs": dict(variant.model_kwargs)}


def operator_support(fields: dict[str, Any]) -> str | None:
    """None when the attention operator accepts the resolved variant, else why not ("needs operator support")."""
    if fields["attn"] == "softmax":
        return None
    from ..layers import LaplacianAttention

    kwargs = {k: v for k, v in fields["attn_kwargs"].items() if k not in ("landmarks", "dwconv", "recompute")}
    try:
        LaplacianAttention(8, 1, kernel=fields["attn"], **kwargs)
    except (TypeError, ValueError) as exc:
        return f"needs operator support: the attention operator rejects {fields['attn_kwargs']} ({exc})"
    return None

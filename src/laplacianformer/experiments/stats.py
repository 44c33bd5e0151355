"""Paired statistics and verdicts of the ablations (docs/DESIGN.md §7, ablations and evidence).

Without scipy: the Student t quantile comes from the regularised incomplete beta function (continued
fraction, modified Lentz) inverted by bisection; ``math.lgamma`` gives the beta function.

Top-1 values are fractions in [0, 1]; a difference "a − b" is paired by seed (same seed: same data order
and initialisation).  A CI needs n ≥ 2 pairs: n = 1 gives ``None``, never a made-up interval.

Verdicts of one comparison whose claimed side is "a − b > 0" (``side=+1``; ``-1`` for "< 0"); the claim is the
paper's, or for our own open choices "our default is the best value":

- ``reproduced``: the 95 % CI lies entirely on the claimed side of 0 (0 excluded);
- ``reversed``: entirely on the other side;
- ``not_reproduced``: the CI contains 0 and its half-width is ≤ ``NEGLIGIBLE`` (0.005 = 0.5 points):
  any effect is smaller than half a point;
- ``undecided``: the CI contains 0 and is wider than that, or there is no CI (n < 2, missing cells);
- ``no_claim``: no side is claimed (a value compared with the default for information); the CI is reported all the same.

A claim made of several comparisons (e.g. "λ = 4 best" = λ=4 beats each other λ) combines them as:
any ``reversed`` → ``reversed``; else any ``undecided`` → ``undecided`` (more seeds could still change
it); else any ``not_reproduced`` → ``not_reproduced``; else (all ``reproduced``) → ``reproduced``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

NEGLIGIBLE = 0.005  # half-width (fraction of top-1) below which a CI around 0 counts as "no effect"
VERDICTS = ("reproduced", "reversed", "not_reproduced", "undecided", "no_claim")
_TINY = 1e-300


def _beta_cf(a: float, b: float, x: float) -> float:
    """Continued fraction of I_x(a, b): 1 / (1 + d1 / (1 + d2 / (1 + ...))), modified Lentz."""
    f = c = 1.0
    d = 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    f = d
    for m in range(1, 10_000):
        for coef in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                     -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + coef * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + coef / c
            c = c if abs(c) > _TINY else _TINY
            f *= c * d
        if abs(c * d - 1.0) < 1e-15:
            return f
    raise ArithmeticError(f"betainc: continued fraction did not converge (a={a}, b={b}, x={x})")


def betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta function I_x(a, b) for a, b > 0 and 0 ≤ x ≤ 1."""
    if a <= 0 or b <= 0:
        raise ValueError(f"a, b: expected positive shape parameters, got a={a}, b={b}")
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"x: expected a value in [0, 1], got {x}")
    if x in (0.0, 1.0):
        return x
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_cf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_cf(b, a, 1.0 - x) / b


def t_cdf(t: float, dof: float) -> float:
    """P(T ≤ t) for Student's t with ``dof`` degrees of freedom."""
    if dof <= 0:
        raise ValueError(f"dof: expected > 0, got {dof}")
    tail = 0.5 * betainc(0.5 * dof, 0.5, dof / (dof + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, dof: float) -> float:
    """The t with P(T ≤ t) = p (Student, ``dof`` degrees of freedom), by bisection on ``t_cdf``."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p: expected a probability in (0, 1), got {p}")
    if p < 0.5:
        return -t_quantile(1.0 - p, dof)
    if p == 0.5:
        return 0.0
    lo, hi = 0.0, 1.0
    while t_cdf(hi, dof) < p:
        lo, hi = hi, 2.0 * hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, dof) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class Describe:
    """n, mean and sample std (ddof = 1; None for n < 2) of some values."""

    n: int
    mean: float | None
    std: float | None


def describe(values: Sequence[float]) -> Describe:
    vals = [float(v) for v in values]
    n = len(vals)
    if n == 0:
        return Describe(0, None, None)
    mean = sum(vals) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1)) if n > 1 else None
    return Describe(n, mean, std)


@dataclass(frozen=True)
class PairedCI:
    """Mean paired difference and its two-sided Student-t confidence interval (None when n < 2)."""

    n: int
    mean: float | None
    std: float | None
    halfwidth: float | None
    lo: float | None
    hi: float | None
    confidence: float = 0.95

    @property
    def ci(self) -> list[float] | None:
        return None if self.lo is None else [self.lo, self.hi]


def paired_ci(diffs: Sequence[float], confidence: float = 0.95) -> PairedCI:
    """CI of the mean of paired differences: mean ± t_{(1+c)/2, n−1} · sd / √n."""
    d = describe(diffs)
    if d.n < 2:
        return PairedCI(d.n, d.mean, None, None, None, None, confidence)
    half = t_quantile(0.5 + 0.5 * confidence, d.n - 1) * d.std / math.sqrt(d.n)
    return PairedCI(d.n, d.mean, d.std, half, d.mean - half, d.mean + half, confidence)


def paired(a: Mapping[int, float], b: Mapping[int, float], confidence: float = 0.95) -> PairedCI:
    """CI of a − b over the seeds both have (``a``, ``b``: seed -> top-1)."""
    seeds = sorted(set(a) & set(b))
    return paired_ci([a[s] - b[s] for s in seeds], confidence)


def on_common_seeds(per_label: Mapping[str, Mapping[int, float]]) -> dict[str, dict[int, float]]:
    """Each label's per-seed values restricted to the seeds every label has: a selection among the labels
    compares them on the same seeds, and seeds one label gained later (a confirmation's) never move it."""
    common = set.intersection(*(set(v) for v in per_label.values())) if per_label else set()
    return {lb: {s: v for s, v in vals.items() if s in common} for lb, vals in per_label.items()}


def verdict(ci: PairedCI | None, side: int | None, negligible: float = NEGLIGIBLE) -> str:
    """Verdict of one comparison a − b whose claimed side is ``side`` (+1: a > b, −1: a < b, None: no claim)."""
    if side is None:
        return "no_claim"
    if side not in (1, -1):
        raise ValueError(f"side: expected +1, -1 or None, got {side!r}")
    if ci is None or ci.lo is None:
        return "undecided"
    lo, hi = (ci.lo, ci.hi) if side == 1 else (-ci.hi, -ci.lo)
    if lo > 0:
        return "reproduced"
    if hi < 0:
        return "reversed"
    return "not_reproduced" if ci.halfwidth <= negligible else "undecided"


def combine(verdicts: Sequence[str]) -> str:
    """Verdict of a claim from those of its comparisons (rule in the module docstring)."""
    vs = list(verdicts)
    if not vs:
        return "undecided"
    unknown = set(vs) - set(VERDICTS)
    if unknown:
        raise ValueError(f"verdicts: unknown {sorted(unknown)}")
    if all(v == "no_claim" for v in vs):
        return "no_claim"
    for outcome in ("reversed", "undecided", "not_reproduced"):
        if outcome in vs:
            return outcome
    return "reproduced"

"""Paired statistics and verdicts of the ablations against hand-worked numbers (docs/DESIGN.md §7)."""

import math

import pytest

from laplacianformer.experiments.stats import (
    NEGLIGIBLE, PairedCI, betainc, combine, describe, paired, paired_ci, t_cdf, t_quantile, verdict,
)


def test_betainc_closed_forms():
    # I_0.4(2, 3) = sum_{j=2..4} C(4, j) 0.4^j 0.6^(4-j) = 0.3456 + 0.1536 + 0.0256 = 0.5248
    assert betainc(2, 3, 0.4) == pytest.approx(0.5248, abs=1e-13)
    # I_x(1/2, 1/2) = (2/π) asin(√x)
    for x in (0.01, 0.3, 0.5, 0.9, 0.999):
        assert betainc(0.5, 0.5, x) == pytest.approx(2 / math.pi * math.asin(math.sqrt(x)), abs=1e-12)
    assert betainc(3, 4, 0.0) == 0.0 and betainc(3, 4, 1.0) == 1.0
    with pytest.raises(ValueError, match="^x"):
        betainc(1, 1, 1.5)


def test_t_cdf_closed_forms():
    for t in (-3.0, -0.5, 0.0, 0.7, 4.0, 40.0):
        assert t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)  # Cauchy
        assert t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-12)


@pytest.mark.parametrize("dof, table", [(1, 12.706), (2, 4.303), (4, 2.776), (9, 2.262), (29, 2.045)])
def test_t_quantile_matches_tables(dof, table):
    assert t_quantile(0.975, dof) == pytest.approx(table, abs=5e-4)
    assert t_quantile(0.025, dof) == pytest.approx(-table, abs=5e-4)


def test_t_quantile_inverts_cdf_and_tends_to_normal():
    assert t_quantile(0.975, 1) == pytest.approx(math.tan(math.pi * 0.475), rel=1e-10)  # Cauchy exactly
    assert t_quantile(0.5, 7) == 0.0
    for dof in (3, 11, 50):
        for p in (0.6, 0.9, 0.995):
            assert t_cdf(t_quantile(p, dof), dof) == pytest.approx(p, abs=1e-11)
    assert t_quantile(0.975, 1e6) == pytest.approx(1.959964, abs=1e-5)
    with pytest.raises(ValueError, match="^p"):
        t_quantile(1.0, 3)


def test_paired_ci_hand_worked():
    diffs = [0.01, 0.03, -0.005, 0.02, 0.015]
    # n = 5, sum = 0.07, mean = 0.014
    # deviations: -0.004, 0.016, -0.019, 0.006, 0.001; squares (×1e-6): 16, 256, 361, 36, 1 = 670
    # sample variance = 670e-6 / 4 = 1.675e-4, sd = sqrt(1.675e-4) = 0.0129422
    # se = sd / sqrt(5) = 0.0129422 / 2.2360680 = 0.0057879
    # t_{0.975, 4} = 2.776445, half-width = 2.776445 × 0.0057879 = 0.0160698
    # CI = [0.014 − 0.0160698, 0.014 + 0.0160698] = [−0.0020698, 0.0300698]
    ci = paired_ci(diffs)
    assert ci.n == 5
    assert ci.mean == pytest.approx(0.014, abs=1e-12)
    assert ci.std == pytest.approx(0.0129422, abs=1e-7)
    assert ci.halfwidth == pytest.approx(0.0160698, abs=1e-7)
    assert ci.ci == pytest.approx([-0.0020698, 0.0300698], abs=1e-7)
    # contains 0 and is 1.6 points wide on each side: undecided whichever side the paper takes
    assert verdict(ci, +1) == "undecided" and verdict(ci, -1) == "undecided" and verdict(ci, None) == "no_claim"


def test_paired_uses_common_seeds_and_n1_has_no_ci():
    a = {0: 0.80, 1: 0.82, 2: 0.81, 5: 0.9}
    b = {0: 0.79, 1: 0.80, 2: 0.80, 3: 0.7}
    # common seeds 0, 1, 2: diffs 0.01, 0.02, 0.01; mean 0.04/3, sd = sqrt((2·(1/300)² + (2/300)²)/2) = 0.0057735
    ci = paired(a, b)
    assert ci.n == 3 and ci.mean == pytest.approx(0.04 / 3)
    assert ci.std == pytest.approx(0.0057735, abs=1e-7)
    assert ci.halfwidth == pytest.approx(t_quantile(0.975, 2) * 0.0057735 / math.sqrt(3), abs=1e-7)
    one = paired({0: 0.8}, {0: 0.7})
    assert one.n == 1 and one.mean == pytest.approx(0.1)
    assert one.halfwidth is None and one.ci is None and one.std is None
    assert verdict(one, +1) == "undecided"
    assert paired({}, {0: 0.5}).n == 0
    d = describe([0.5])
    assert (d.n, d.mean, d.std) == (1, 0.5, None)


def _ci(lo, hi):
    return PairedCI(5, (lo + hi) / 2, 0.01, (hi - lo) / 2, lo, hi)


def test_verdict_rule_on_constructed_cis():
    assert verdict(_ci(0.001, 0.02), +1) == "reproduced"
    assert verdict(_ci(0.001, 0.02), -1) == "reversed"
    assert verdict(_ci(-0.02, -0.001), +1) == "reversed"
    assert verdict(_ci(-0.02, -0.001), -1) == "reproduced"
    assert verdict(_ci(-0.004, 0.005), +1) == "not_reproduced"       # half-width 0.0045 ≤ 0.005
    assert verdict(_ci(-0.005, 0.005), -1) == "not_reproduced"       # exactly 0.5 points
    assert verdict(_ci(-0.004, 0.008), +1) == "undecided"            # half-width 0.006 > 0.005
    assert verdict(_ci(0.0, 0.004), +1) == "not_reproduced"          # touching 0 is containing it
    assert verdict(_ci(-0.02, 0.03), None) == "no_claim"
    assert NEGLIGIBLE == 0.005
    with pytest.raises(ValueError, match="^side"):
        verdict(_ci(0.0, 0.1), 2)


def test_combination_rule():
    assert combine(["reproduced"] * 4) == "reproduced"
    assert combine(["reproduced", "reversed", "undecided"]) == "reversed"
    assert combine(["reproduced", "undecided", "not_reproduced"]) == "undecided"
    assert combine(["reproduced", "not_reproduced"]) == "not_reproduced"
    assert combine(["no_claim", "no_claim"]) == "no_claim"
    assert combine([]) == "undecided"

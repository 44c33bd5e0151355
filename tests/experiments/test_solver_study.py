"""The NS-vs-CG study measures what it says: condition numbers, residuals, tables."""

import math

import pytest
import torch

from laplacianformer.experiments import solver_study as ss


@pytest.mark.parametrize("kappa", [10.0, 1e4])
def test_spd_has_requested_condition_number(kappa):
    p = ss.spd_with_condition(9, kappa, batch=3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert torch.allclose(p, p.transpose(-1, -2))
    cond = ss.condition_numbers(p)
    assert all(math.isclose(c, kappa, rel_tol=1e-6) for c in cond)


def test_residual_curves_match_direct_residual_and_converge():
    p = ss.spd_with_condition(9, 10.0, batch=2, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    ns = ss.residual_curve(p, "newton_schulz", [1, 40])
    cg = ss.residual_curve(p, "cg", [1, 9])
    v = ss.newton_schulz_iterate(p, 1)
    direct = torch.linalg.matrix_norm(torch.eye(9, dtype=torch.float64) - p @ v).median()
    assert ns[0] == pytest.approx(float(direct), rel=1e-12)
    assert ns[1] < 1e-8 < ns[0]
    assert cg[1] < 1e-6 < cg[0]


def test_landmark_matrices_are_regularised_kernel_matrices():
    g = torch.Generator().manual_seed(2)
    for source in ("iid", "smooth"):
        p = ss.landmark_matrices(source, hw=(8, 8), grid=(3, 3), d=8, batch=2, eps=0.01, generator=g)
        assert p.shape == (2, 9, 9)
        assert torch.allclose(p, p.transpose(-1, -2))
        assert torch.allclose(torch.diagonal(p, dim1=-2, dim2=-1), torch.full((2, 9), 1.01))
        assert bool(((p > 0) & (p <= 1.01)).all())
    with pytest.raises(ValueError, match="^source"):
        ss.landmark_matrices("bogus")


def test_study_table_and_plot(tmp_path):
    fams = ss.standard_families(m=9, kappas=(10.0,), lams=(4.0,), batch=2)
    study = ss.run_solver_study(fams, iters=(5, 10), progress=False)
    assert [e["name"] for e in study["families"]] == list(fams)
    table = ss.solver_table(study, table_iters=(5, 10))
    assert table.count("\n") == 1 + len(fams)
    assert "NS@10" in table and "CG@5" in table
    ss.plot_solver_study(study, tmp_path / "s.png")
    assert (tmp_path / "s.png").stat().st_size > 1000

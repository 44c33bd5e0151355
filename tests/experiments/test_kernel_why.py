"""``laplacianformer kernels why`` (docs/DESIGN.md §7.8, "Why"): which model each family is read from, the
distances and kernel values it sees, the Nyström error, the ranking's states, and the CLI at initialisation."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from laplacianformer import LaplacianAttention
from laplacianformer.experiments import accuracy, kernel_why, kernels
from laplacianformer.experiments.ablate import build_protocol
from laplacianformer.experiments.analysis import capture_qk
from laplacianformer.ops.kernel.naive import pairwise_l1_naive, pairwise_sq_l2_naive
from laplacianformer.ops.kernel_families import kernel_spec
from laplacianformer.ops.pooling import pool_landmarks

STUDY = kernels.why_study()


class TwoStages(nn.Module):
    """A Nyström layer on a 6×5 grid, then an exact one on 2×2 tokens (two "stages")."""

    def __init__(self, kernel="laplacian", lam=None):
        super().__init__()
        self.a1 = LaplacianAttention(8, 2, landmarks=(2, 3), kernel=kernel, lam=lam)
        self.a2 = LaplacianAttention(8, 2, landmarks=(7, 7), kernel=kernel, lam=lam)

    def forward(self, x):
        return self.a2(self.a1(x, (6, 5))[:, :4], (2, 2))


def _records(kernel="laplacian", lam=None):
    torch.manual_seed(0)
    return capture_qk(TwoStages(kernel, lam).double(), torch.randn(3, 30, 8, dtype=torch.float64))


def test_run_dirs_are_the_ones_the_studies_write(tmp_path):
    seen = []

    def fake(config):
        seen.append(config["out"])
        return {"top1": 0.5, "final_test_top1": 0.5, "eval_split": "val"}

    protocol = build_protocol(accuracy.QUICK_NAME, accuracy.QUICK_VAL)
    kernels.run_cells(["cauchy@lam=0.11"], [1], protocol=protocol, out=tmp_path / "k", runs=tmp_path / "kr",
                      borrow=None, train_fn=fake, progress=False)
    accuracy.run_cells(["default"], [2], protocol=protocol, out=tmp_path / "a", runs=tmp_path / "ar",
                       train_fn=fake, progress=False)
    assert seen == [str(kernel_why.kernel_run_dir(tmp_path / "kr", "cauchy@lam=0.11", 1)),
                    str(kernel_why.accuracy_run_dir(tmp_path / "ar", "default", 2))]


def _cell(family, lam, seed, **extra):
    return {"label": STUDY.label(family, lam), "seed": seed, "attn": family, "val_top1": 0.9, "test_top1": 0.89, **extra}


def _with_weights(run_dir):
    run_dir.mkdir(parents=True)
    (run_dir / "model.safetensors").write_bytes(b"")


def test_choose_models_selected_matched_stand_in_and_missing(tmp_path):
    runs, acc = tmp_path / "runs", tmp_path / "acc"
    cells = [_cell("gaussian", 16.0, 0), _cell("gaussian", 3.9, 0),  # gaussian: selection complete at 16
             _cell("laplacian", 4.0, 0, reused_from="results/accuracy/cells.json#scale_inv_n|seed=0"),
             _cell("laplacian", 1.0, 0), _cell("laplacian", 16.0, 0), _cell("laplacian", 16.0, 1),
             _cell("cauchy", 0.11, 0, val_top1=None)]  # recorded but not finished
    record = {"cells": {f"{c['label']}|seed={c['seed']}": c for c in cells}}
    for c in cells:
        if c["label"] != "laplacian@lam=4":
            _with_weights(kernel_why.cell_run_dir(c, runs, acc))
    sel = {"families": {"gaussian": {"complete": True, "selected_lam": 16.0},
                        "laplacian": {"complete": False, "selected_lam": 1.0}}}
    got = kernel_why.choose_models(record, sel, ["gaussian", "laplacian", "cauchy", "matern32"], STUDY, runs, acc)
    g = got["gaussian"]
    assert (g["lam"], g["seed"], g["stand_in"]) == (16.0, 0, None) and g["basis"].startswith("λ selected")
    lap = got["laplacian"]  # matched λ = 4 was reused from the accuracy study, whose run dir is not here
    assert lap["wanted"] == {"label": "laplacian@lam=4", "seed": 0} and lap["basis"].startswith("matched")
    assert (lap["lam"], lap["seed"]) == (1.0, 0)  # λ 1 and 16 are equally far in log λ: the smaller, seed 0
    assert "not on this machine" in lap["stand_in"] and str(acc / "scale_inv_n-s0") in lap["stand_in"]
    assert "not trained yet" in got["cauchy"]["missing"] and "missing" in got["matern32"]
    given = kernel_why.choose_models(record, sel, ["laplacian"], STUDY, runs, acc, lams={"laplacian": 16.0})["laplacian"]
    assert (given["lam"], given["seed"], given["stand_in"], given["basis"]) == (16.0, 0, None, "λ given (--lam)")


def test_stage_distances_are_the_pairs_the_kernel_sees():
    recs = _records()
    stages = kernel_why.stage_distances(recs)
    assert [(s["stage"], s["hw"]) for s in stages] == [(1, [6, 5]), (2, [2, 2])]
    assert stages[0]["pairs"].startswith("query–landmark") and stages[1]["pairs"].startswith("query–key")
    marks = pool_landmarks(recs[0]["q"], recs[0]["hw"], recs[0]["landmarks"])
    torch.testing.assert_close(stages[0]["l1"], pairwise_l1_naive(recs[0]["q"], marks).flatten())
    torch.testing.assert_close(stages[1]["l2"].square(), pairwise_sq_l2_naive(recs[1]["q"], recs[1]["k"]).flatten())


@pytest.mark.parametrize("family", ["laplacian", "cauchy", "matern32"])
def test_distance_summary_reads_the_family_own_distance(family):
    stage = kernel_why.stage_distances(_records(family, lam=0.7))[0]
    s = kernel_why.distance_summary(stage)
    spec = kernel_spec(family)
    r = {"l1": stage["l1"], "l2": stage["l2"], "sq_l2": stage["l2"].square()}[spec.distance]
    k = spec.profile(r / 0.7)
    assert s["lam"] == 0.7 and s["count"] == 3 * 2 * 30 * 6
    assert s["kernel"]["q"]["50"] == pytest.approx(float(k.median()), rel=0.05)
    assert s["r_over_lam"]["q"]["95"] == pytest.approx(float(torch.quantile(r / 0.7, 0.95)))
    assert s["kernel"]["tail_retention"] == pytest.approx(s["kernel"]["q"]["5"] / s["kernel"]["q"]["50"])
    assert s["l1"]["q99_over_q50"] > 1.0


def test_hill_alpha_recovers_a_power_law_and_flags_a_light_tail():
    gen = torch.Generator().manual_seed(0)
    pareto = torch.rand(200_000, generator=gen, dtype=torch.float64).pow(-1.0 / 3.0)  # P(X > x) = x^-3
    assert kernel_why.hill_alpha(pareto) == pytest.approx(3.0, rel=0.1)
    normal = 10.0 + torch.randn(200_000, generator=gen, dtype=torch.float64)
    assert kernel_why.hill_alpha(normal) > 20.0


def test_nystrom_error_is_exact_when_every_token_is_a_landmark_and_matches_dense():
    torch.manual_seed(0)
    q, k = torch.randn(2, 1, 12, 4, dtype=torch.float64), torch.randn(2, 1, 12, 4, dtype=torch.float64)
    settings = {"kernel": "cauchy", "lam": 2.0, "solver": "newton_schulz", "iters": 20, "ns_eps": 1e-12}
    full = {"q": q, "k": k, "hw": (3, 4), "landmarks": (3, 4), "settings": settings}
    assert max(kernel_why.nystrom_error(full)["exact"]) < 1e-8
    rec = {**full, "landmarks": (2, 2), "settings": {**settings, "ns_eps": 0.01}}
    err = kernel_why.nystrom_error(rec)
    spec = kernel_spec("cauchy")
    kern = lambda x, y: spec.profile(pairwise_sq_l2_naive(x, y) / 2.0)  # noqa: E731
    marks = pool_landmarks(q, (3, 4), (2, 2))
    approx = kern(q, marks) @ torch.linalg.inv(kern(marks, marks) + 0.01 * torch.eye(4, dtype=torch.float64)) @ kern(k, marks).transpose(-1, -2)
    g = kern(q, k)
    want = ((g - approx).flatten(-2).norm(dim=-1) / g.flatten(-2).norm(dim=-1)).flatten().tolist()
    assert err["exact"] == pytest.approx(want, rel=1e-6)
    assert err["solver"] == pytest.approx(want, rel=0.05)
    assert kernel_why.nystrom_error({**rec, "landmarks": None}) is None


def test_ranking_is_unknown_until_the_study_is_complete():
    tails = {"l1": {"q99_over_q50": 1.8, "hill_alpha": 12.0}, "l2": {"q99_over_q50": 1.7, "hill_alpha": 13.0}}
    dist = {f: [{"kernel": {"tail_retention": t}, **tails}] for f, t in
            (("laplacian", 0.5), ("gaussian", 0.1), ("cauchy", 0.7), ("matern32", 0.3))}
    r = kernel_why.ranking(None, None, dist)
    assert r["premise"]["gaussian"] == {"l1_q99_over_q50": 1.8, "l1_hill_alpha": 12.0, "l2_q99_over_q50": 1.7,
                                        "l2_hill_alpha": 13.0}
    assert r["prediction"]["order"] == ["cauchy", "laplacian", "matern32", "gaussian"]
    assert r["validation"]["status"].startswith("not yet known") and r["test"]["status"].startswith("not yet known")
    means = {"laplacian": 0.90, "gaussian": 0.88, "cauchy": 0.91, "matern32": 0.89}
    sel = {"complete": True, "families": {f: {"complete": True, "selected_lam": 1.0, "lambdas": {"1": {"mean": m}}}
                                          for f, m in means.items()}}
    conf = {"complete": True, "chosen": {f: f"{f}@lam=1" for f in means},
            "configurations": {f"{f}@lam=1": {"mean": m - 0.01} for f, m in means.items()},
            "pairs": [{"family": "gaussian", "b": "laplacian_default", "n": 5, "mean": -0.02, "ci95": [-0.03, -0.01],
                       "verdict": "reversed"}]}
    r = kernel_why.ranking(sel, conf, dist)
    assert r["validation"]["order"] == ["cauchy", "laplacian", "matern32", "gaussian"]
    assert r["validation"]["spearman_with_prediction"] == pytest.approx(1.0)
    assert r["validation"]["laplacian_above_gaussian"] is True
    assert r["test"]["gaussian_minus_laplacian_default"]["verdict"] == "reversed"


def test_why_at_initialisation_writes_its_files(tmp_path, capsys):
    out = tmp_path / "why"
    argv = ["why", "--init", "--families", "laplacian", "cauchy", "--images", "2", "--nystrom-images", "1",
            "--sizes", "28", "--study", str(tmp_path / "none"), "--out", str(out)]
    assert kernels.main(argv) == 0
    res = json.loads((out / "why.json").read_text())
    assert set(res["distances"]) == {"laplacian", "cauchy"} and res["init"] is True
    s1 = res["distances"]["cauchy"][0]
    assert s1["tokens"] == 196 and s1["lam"] == kernels.MATCHED_LAMBDAS["cauchy"] and s1["distance"] == "sq_l2"
    assert [r["tokens"] for r in res["nystrom"]["laplacian"]] == [196]
    assert 0.0 < res["nystrom"]["laplacian"][0]["error"]["mean"] < 1.0
    assert res["ranking"]["validation"]["status"].startswith("not yet known")
    for name in ("why.md", "laplacian.png", "cauchy.png", "nystrom.png"):
        assert (out / name).stat().st_size > 0
    assert "Nyström error on stage 1" in (out / "why.md").read_text()
    assert kernels.main(["why", "--images", "0", "--out", str(out)]) == 2
    assert "images" in capsys.readouterr().err
    assert kernels.main(["why", "--lam", "nope=1", "--out", str(out)]) == 2
    assert "lam: expected FAMILY=LAM" in capsys.readouterr().err
    assert not math.isnan(s1["kernel"]["q"]["50"])

"""``laplacianformer accuracy`` (docs/DESIGN.md §7.5): the held-out validation split, the candidates and their
combinations, resumable cells, a selection that never reads test numbers, the confirmation's statistics."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from laplacianformer.data import holdout_indices
from laplacianformer.data.errors import DataError
from laplacianformer.experiments import accuracy
from laplacianformer.experiments.ablate import build_protocol
from laplacianformer.train import TrainConfig


def test_holdout_split_is_fixed_by_its_own_seed_and_disjoint():
    a, b = holdout_indices(1000, 100, 0), holdout_indices(1000, 100, 0)
    assert np.array_equal(a, b) and len(np.unique(a)) == 100 and np.all(np.diff(a) > 0)
    assert not np.array_equal(a, holdout_indices(1000, 100, 1))
    with pytest.raises(DataError, match="holdout"):
        holdout_indices(1000, 1000, 0)


def test_train_config_checks_holdout():
    with pytest.raises(ValueError, match="holdout"):
        TrainConfig(holdout=0).validate()
    with pytest.raises(ValueError, match="holdout_seed"):
        TrainConfig(holdout=10, holdout_seed=-1).validate()


def test_build_datasets_holds_out_training_images():
    pytest.importorskip("laplacianformer.data.fashion_mnist")
    from laplacianformer.data import build_datasets
    from laplacianformer.data.fashion_mnist import load_fashion_mnist

    try:
        xtr, _ = load_fashion_mnist("train")
    except DataError:
        pytest.skip("Fashion-MNIST not installed")
    splits = build_datasets("fashion-mnist", 28, holdout=500, holdout_seed=3, seed=7)
    assert len(splits.train) == len(xtr) - 500 and len(splits.test) == 500
    idx = holdout_indices(len(xtr), 500, 3)
    assert np.array_equal(splits.test.images[:, 0].numpy(), xtr[idx])  # the held-out images, not the test set


def test_combinations_merge_and_refuse_conflicts():
    assert accuracy.combination("lam_0.5+inline+tied_keys") == (
        "laplacian", {"lam": 0.5, "norm": "inline", "tie_qk": True})
    with pytest.raises(ValueError, match="lam_0.5\\+lam_1"):
        accuracy.combination("lam_0.5+lam_1")
    with pytest.raises(ValueError, match="candidate"):
        accuracy.combination("nope")


def _fake_train(config):
    """A deterministic stand-in for a training: val and test top-1 from the label's settings and the seed."""
    base = 0.80 + 0.01 * len(json.dumps(config["attn_kwargs"], sort_keys=True)) / 10 + 0.001 * config["seed"]
    return {"top1": base, "final_test_top1": base - 0.02, "eval_split": "val", "steps": 3}


def _protocol():
    return build_protocol(accuracy.QUICK_NAME, accuracy.QUICK_VAL)


def test_cells_resume_and_selection_ignores_test_numbers(tmp_path):
    calls = []

    def train_fn(config):
        calls.append((config["attn_kwargs"], config["seed"]))
        assert config["holdout"] == accuracy.QUICK_VAL["holdout"] and config["final_test"] and config["resume"]
        return _fake_train(config)

    labels = ["default", "inline", "lam_0.5+inline"]
    kw = dict(protocol=_protocol(), out=tmp_path, runs=tmp_path / "runs", progress=False, train_fn=train_fn)
    record = accuracy.run_cells(labels, [0, 1, 2], **kw)
    assert len(record["cells"]) == 9 and len(calls) == 9
    accuracy.run_cells(labels, [0, 1, 2], **kw)  # resume: nothing left to train
    assert len(calls) == 9
    sel = accuracy.selection(record)
    assert sel["complete"] and sel["chosen"] == "lam_0.5+inline" and sel["ranking"][-1] == "default"
    assert "test" not in json.dumps(sel["candidates"])
    shuffled = copy.deepcopy(record)
    for cell in shuffled["cells"].values():
        cell["test_top1"] = 1.0 - cell["test_top1"] if cell["label"] == "default" else 0.0
    assert accuracy.selection(shuffled) == sel
    # the confirmation's seeds 3, 4 of the choice do not enter the selection (its seeds are paired)
    more = accuracy.run_cells([sel["chosen"], "default"], [3, 4], **kw)
    assert accuracy.selection(more) == sel


def test_selection_needs_three_seeds_to_choose(tmp_path):
    record = accuracy.run_cells(["default", "inline"], [0, 1], protocol=_protocol(), out=tmp_path, runs=tmp_path,
                                progress=False, train_fn=_fake_train)
    sel = accuracy.selection(record)
    assert sel["chosen"] is None and not sel["complete"]


def test_detection_variants_are_the_choice_and_the_best_scale_fix(tmp_path, capsys):
    # fake val top-1 grows with the length of the settings' JSON: scale_inv_sqrt_n > scale_inv_n
    labels = ["default", "scale_inv_n", "scale_inv_sqrt_n", "scale_inv_n+lam_0.5+tied_keys"]
    record = accuracy.run_cells(labels, [0, 1], protocol=_protocol(), out=tmp_path, runs=tmp_path, progress=False,
                                train_fn=_fake_train)
    assert accuracy.detection_variants(accuracy.selection(record)) == {}  # incomplete: no runs yet
    accuracy.run_cells(labels, [0, 1, 2], protocol=_protocol(), out=tmp_path, runs=tmp_path, progress=False,
                       train_fn=_fake_train)
    accuracy.write_reports(tmp_path)
    assert accuracy.main(["variants", "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.split("\n")
    got = dict(line.split(" ", 1) for line in lines if line.startswith("scale_"))
    assert list(got) == ["scale_inv_n+lam_0.5+tied_keys", "scale_inv_sqrt_n"]
    assert json.loads(got["scale_inv_sqrt_n"]) == {"attn": "laplacian", "attn_kwargs": {"norm_scale": "inv_sqrt_n"}}
    assert " " not in got["scale_inv_n+lam_0.5+tied_keys"]  # one shell word per value


def test_confirmation_pairs_and_reports(tmp_path):
    labels = ["default", "inline", "gaussian_soft", "sr_softmax"]
    accuracy.run_cells(labels, list(range(5)), protocol=_protocol(), out=tmp_path, runs=tmp_path, progress=False,
                       train_fn=_fake_train)
    done = accuracy.write_reports(tmp_path)
    conf = done["confirmation"]
    assert conf["chosen"] == "inline" and conf["complete"]
    pair = next(p for p in conf["pairs"] if p["claim"] == "inline > default")
    assert pair["n"] == 5 and pair["mean"] > 0 and pair["verdict"] in ("reproduced", "undecided")
    assert (tmp_path / "selection.md").read_text().count("|") > 10
    assert "inline > sr_softmax" in (tmp_path / "confirmation.md").read_text()


def test_confirmation_adds_the_best_scale_alone(tmp_path):
    """The best output scale alone gets its own claims on test (the default scale's evidence, DESIGN §7.6)."""
    labels = ["default", "scale_inv_n", "lam_0.5+inline+tied_keys", "gaussian_soft", "sr_softmax"]
    accuracy.run_cells(labels, list(range(5)), protocol=_protocol(), out=tmp_path, runs=tmp_path, progress=False,
                       train_fn=_fake_train)
    conf = accuracy.write_reports(tmp_path)["confirmation"]
    assert conf["chosen"] == "lam_0.5+inline+tied_keys" and conf["best_scale"] == "scale_inv_n"
    claims = {p["claim"]: p for p in conf["pairs"]}
    assert claims["scale_inv_n > default"]["n"] == 5 and "scale_inv_n > sr_softmax" in claims
    assert conf["configurations"]["scale_inv_n"]["n"] == 5 and conf["complete"]


def test_quick_cell_trains_on_the_split_and_scores_test(tmp_path):
    """One real quick cell (3 steps): evaluated on the held-out split, then its final weights on the test set;
    run again with ``resume`` it continues from its checkpoint instead of starting over."""
    from laplacianformer.data.fashion_mnist import load_fashion_mnist
    from laplacianformer.experiments.cell import run_cell

    try:
        load_fashion_mnist("test")
    except DataError:
        pytest.skip("Fashion-MNIST not installed")
    config = {**_protocol()["recipe"], "attn": "laplacian", "attn_kwargs": {"norm_scale": "inv_n"}, "seed": 0,
              "progress": False, "out": str(tmp_path / "cell"), "save_every_steps": 1, "final_test": True,
              "resume": True}
    first = run_cell(config)
    assert first["eval_split"] == "val" and first["steps"] == 3 and 0 <= first["final_test_top1"] <= 1
    assert first["final_test_n"] == accuracy.QUICK_VAL["test_subset"]
    again = run_cell(config)
    assert again.get("resumed") and again["steps"] == 3


def test_results_page_accuracy_block_is_generated(tmp_path):
    from laplacianformer.experiments import results_page

    accuracy.run_cells(["default", "inline"], [0, 1, 2], protocol=_protocol(), out=tmp_path, runs=tmp_path,
                       progress=False, train_fn=_fake_train)
    accuracy.write_reports(tmp_path)
    assert (tmp_path / "selection.png").stat().st_size > 0
    (tmp_path / "ablations").mkdir()
    page = tmp_path / "RESULTS.md"
    page.write_text(f"{results_page.BEGIN}\n{results_page.END}\nprose\n{results_page.ACCURACY_BEGIN}\nold\n"
                    f"{results_page.ACCURACY_END}\n")
    assert results_page.rewrite(page, tmp_path / "ablations", tmp_path, tmp_path / "missing.md")
    text = page.read_text()
    assert "Chosen: **inline**" in text and "old" not in text and "prose" in text and "selection.png" in text


def test_readme_claims_block_is_generated_from_the_confirmation(tmp_path, monkeypatch):
    from laplacianformer.experiments import results_page

    accuracy.run_cells(["default", "inline", "gaussian_soft", "sr_softmax"], [0, 1, 2], protocol=_protocol(),
                       out=tmp_path, runs=tmp_path, progress=False, train_fn=_fake_train)
    accuracy.write_reports(tmp_path)
    (tmp_path / "ablations").mkdir()
    page, readme = tmp_path / "RESULTS.md", tmp_path / "README.md"
    page.write_text(f"{results_page.BEGIN}\n{results_page.END}\n{results_page.ACCURACY_BEGIN}\n{results_page.ACCURACY_END}\n")
    readme.write_text(f"intro\n{results_page.CLAIMS_BEGIN}\nold claim\n{results_page.CLAIMS_END}\nrest\n")
    monkeypatch.chdir(tmp_path)
    assert results_page.main(["--results", "ablations", "--accuracy", ".", "--gain", "none.md", "--page", str(page),
                              "--readme", str(readme), "--publish"]) == 0
    text = readme.read_text()
    conf = json.loads((tmp_path / "confirmation.json").read_text())
    pair = next(p for p in conf["pairs"] if p["claim"] == "inline > default")
    assert "old claim" not in text and text.startswith("intro\n") and text.endswith("rest\n")
    assert f"| inline > default | 3 | {100 * pair['mean']:+.2f} |" in text and "3 paired seeds, incomplete" in text

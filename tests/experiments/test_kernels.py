"""``laplacianformer kernels`` (docs/DESIGN.md §7.8): the labels and bandwidths of the kernel-family study,
resumable cells that reuse identical cells of the accuracy study, a selection per family that reads validation
only, the confirmation's paired statistics, the detection variants and the reports."""

from __future__ import annotations

import copy
import json

import pytest

from laplacianformer.experiments import accuracy, kernels
from laplacianformer.experiments.ablate import build_protocol
from laplacianformer.ops.kernel_families import SHIPPED


def _protocol():
    return build_protocol(accuracy.QUICK_NAME, accuracy.QUICK_VAL)


def _fake_train(config):
    """Val top-1 peaks at the matched λ of each family, cauchy and matern32 above the Laplacian; test = val - 1 pt."""
    lam = config["attn_kwargs"].get("lam", 4.0)
    bonus = {"cauchy": 0.02, "matern32": 0.01, "softmax": 0.0}.get(config["attn"], 0.005)
    matched = kernels.MATCHED_LAMBDAS.get(config["attn"], lam)
    top1 = 0.85 + bonus - 0.002 * abs(lam - matched) / matched + 0.001 * config["seed"]
    return {"top1": top1, "final_test_top1": top1 - 0.01, "eval_split": "val", "steps": 3}


def test_labels_round_trip_and_bad_labels_name_the_label():
    assert kernels.configuration("cauchy@lam=0.11") == ("cauchy", {"lam": 0.11, "norm_scale": "inv_n"})
    assert kernels.configuration("sr_softmax") == ("softmax", {})
    for bad in ("cauchy", "nope@lam=1", "cauchy@lam=-1", "cauchy@lam=x"):
        with pytest.raises(ValueError, match="^label: "):
            kernels.configuration(bad)


def test_every_shipped_family_is_swept_around_its_matched_bandwidth():
    for family in SHIPPED:
        lams = kernels.bandwidths(family)
        assert len(lams) >= 3 and kernels.MATCHED_LAMBDAS[family] in lams
        assert min(lams) <= kernels.MATCHED_LAMBDAS[family] / 3.5 and max(lams) >= kernels.MATCHED_LAMBDAS[family] * 3.5
    assert 0.5 in kernels.bandwidths("laplacian")  # measured already (the tuned preset's λ)


def _borrow_file(tmp_path, protocol):
    """An accuracy cells.json with the Laplacian at λ = 4, 1/N (as ``scale_inv_n``) and SR-softmax, seeds 0..4."""
    record = accuracy.run_cells(["scale_inv_n", "sr_softmax"], list(range(5)), protocol=protocol,
                                out=tmp_path / "acc", runs=tmp_path / "acc-runs", progress=False, train_fn=_fake_train)
    assert len(record["cells"]) == 10
    return tmp_path / "acc" / "cells.json"


def test_cells_reuse_identical_accuracy_cells_and_resume(tmp_path):
    protocol = _protocol()
    borrow = _borrow_file(tmp_path, protocol)
    calls = []

    def train_fn(config):
        calls.append((config["attn"], config["attn_kwargs"]["lam"], config["seed"]))
        assert config["final_test"] and config["resume"] and config["attn_kwargs"]["norm_scale"] == "inv_n"
        return _fake_train(config)

    labels = kernels.selection_labels(("laplacian", "cauchy"))
    kw = dict(protocol=protocol, out=tmp_path / "k", runs=tmp_path / "runs", borrow=borrow, progress=False,
              train_fn=train_fn)
    record = kernels.run_cells(labels, [0, 1, 2], **kw)
    reused = {k for k, c in record["cells"].items() if "reused_from" in c}
    assert reused == {f"laplacian@lam=4|seed={s}" for s in range(3)}  # λ = 4 with 1/N is scale_inv_n
    assert ("laplacian", 4.0, 0) not in calls and len(calls) == len(labels) * 3 - 3
    kernels.run_cells(labels, [0, 1, 2], **kw)  # resume: nothing left to train
    assert len(calls) == len(labels) * 3 - 3


def test_selection_per_family_reads_validation_only(tmp_path):
    protocol = _protocol()
    record = kernels.run_cells(kernels.selection_labels(), [0, 1, 2], protocol=protocol, out=tmp_path, runs=tmp_path,
                               borrow=None, progress=False, train_fn=_fake_train)
    sel = kernels.selection(record, 32)
    assert sel["complete"]
    for family in SHIPPED:
        assert sel["families"][family]["selected_lam"] == kernels.MATCHED_LAMBDAS[family]
    shuffled = copy.deepcopy(record)
    for cell in shuffled["cells"].values():
        cell["test_top1"] = 0.0
    assert kernels.selection(shuffled, 32) == sel
    assert kernels.detection_variants(sel) == {
        "kernel_cauchy": {"attn": "cauchy", "attn_kwargs": {"lam": 0.11, "norm_scale": "inv_n"}},
        "kernel_matern32": {"attn": "matern32", "attn_kwargs": {"lam": 0.36, "norm_scale": "inv_n"}}}
    # the confirmation's seeds 3, 4 of one λ per family do not enter the selection (its seeds are paired)
    chosen = [e["selected"] for e in sel["families"].values()]
    more = kernels.run_cells(chosen, [3, 4], protocol=protocol, out=tmp_path, runs=tmp_path, borrow=None,
                             progress=False, train_fn=_fake_train)
    assert kernels.selection(more, 32) == sel
    partial = kernels.run_cells(kernels.selection_labels(), [0, 1], protocol=protocol, out=tmp_path / "p",
                                runs=tmp_path, borrow=None, progress=False, train_fn=_fake_train)
    assert kernels.detection_variants(kernels.selection(partial, 32)) == {}  # 2 seeds: nothing selected


def test_confirmation_pairs_each_family_with_both_references(tmp_path, capsys):
    protocol = _protocol()
    out = tmp_path / "k"
    kernels.run_cells(kernels.selection_labels(), [0, 1, 2], protocol=protocol, out=out, runs=tmp_path,
                      borrow=None, progress=False, train_fn=_fake_train)
    sel = kernels.write_reports(out, 32)["selection"]
    chosen = [e["selected"] for e in sel["families"].values()]
    kernels.run_cells(chosen + list(kernels.REFERENCES), list(range(5)), protocol=protocol, out=out, runs=tmp_path,
                      borrow=None, progress=False, train_fn=_fake_train)
    conf = kernels.write_reports(out, 32)["confirmation"]
    assert conf["complete"] and len(conf["pairs"]) == 2 * len(SHIPPED)
    pair = next(p for p in conf["pairs"] if p["family"] == "cauchy" and p["b"] == "laplacian_default")
    assert pair["n"] == 5 and pair["mean"] == pytest.approx(0.015) and pair["verdict"] == "reproduced"
    text = (out / "confirmation.md").read_text()
    assert "| cauchy | 0.11 |" in text and "wins" in text
    assert (out / "selection.png").stat().st_size > 1000
    assert kernels.main(["variants", "--out", str(out)]) == 0
    lines = [json.loads(line.split(" ", 1)[1]) for line in capsys.readouterr().out.splitlines() if line.startswith("kernel_")]
    assert [v["attn"] for v in lines] == ["cauchy", "matern32"]

"""Ablation registry, the resumable runner, the seed loop and the results file (docs/DESIGN.md §7).

The training itself is train(); here fake cell runners stand in for it, except in the single real
--quick smoke run."""

import json
import math

import pytest

from laplacianformer.experiments import ablate
from laplacianformer.experiments.ablations import ABLATIONS, get_ablation, operator_support, resolve_variant
from laplacianformer.experiments.protocol import PROTOCOL, QUICK

DESIGN_ABLATIONS = {"lambda", "solver", "kernel", "norm", "landmarks", "ns_iters", "qk_scale", "tie_qk"}


@pytest.fixture(scope="module")
def quick_protocol():
    return ablate.build_protocol("test", QUICK)


def test_registry_covers_design_section_7():
    assert set(ABLATIONS) == DESIGN_ABLATIONS
    for a in ABLATIONS.values():
        assert a.default in a.labels
        assert all(q in a.labels for q in a.quick)
        assert len(set(a.labels)) == len(a.labels)
        assert all("/" not in lb for lb in a.labels)  # labels name run directories
    assert get_ablation("lambda").labels == ["lam=0.5", "lam=1", "lam=2", "lam=4", "lam=8"]
    assert get_ablation("ns_iters").labels == ["iters=10", "iters=20", "iters=30", "iters=40"]
    assert get_ablation("kernel").labels == ["laplacian", "gaussian", "gaussian-bw0.25", "gaussian-bw0.5",
                                             "gaussian-bw2", "gaussian-bw4", "softmax-sr", "softmax-full"]
    with pytest.raises(ValueError, match="^name"):
        get_ablation("nope")
    with pytest.raises(ValueError, match="^values"):
        get_ablation("lambda").variant("lam=3")


def test_paper_claims_and_our_defaults_take_sides_other_values_none():
    sides = {a.name: {c.text: c.side for c in a.all_claims} for a in ABLATIONS.values()}
    assert list(sides["lambda"].values()) == [1]
    assert list(sides["solver"].values()) == [1, 1]
    assert sum(s == 1 for s in sides["kernel"].values()) == 2
    assert list(sides["norm"].values()) == [1, 1]  # injective beats 3 others; our μ_j subtraction beats none
    for name in ("landmarks", "ns_iters", "qk_scale", "tie_qk"):  # our open choices: the default is the best
        a = get_ablation(name)
        (claim,) = a.all_claims
        assert claim.side == 1 and claim.text.startswith("Our default")
        others = [lb for lb in a.labels if lb != a.default]
        assert [(p[0].labels, p[1].labels) for p in claim.pairs] == [((a.default,), (lb,)) for lb in others]
    lam4 = get_ablation("lambda").claims[0]
    assert [(p[0].labels, p[1].labels) for p in lam4.pairs] == [(("lam=4",), (lb,)) for lb in ("lam=0.5", "lam=1", "lam=2", "lam=8")]


def test_resolved_values_depend_on_head_dim_and_timing():
    a = get_ablation("qk_scale")
    assert [resolve_variant(v, 16)["attn_kwargs"]["qk_scale"] for v in a.variants] == pytest.approx([1.0, 0.5, 0.25])
    with pytest.raises(ValueError, match="^head_dim"):
        resolve_variant(a.variants[0], None)
    k = get_ablation("kernel")
    soft = resolve_variant(k.variant("gaussian"), 32)
    assert soft["attn"] == "gaussian" and soft["attn_kwargs"] == pytest.approx({"qk_scale": 1.0, "lam": 2 * 32**0.5})
    assert resolve_variant(k.variant("gaussian-bw0.25"), 32)["attn_kwargs"]["lam"] == pytest.approx(0.5 * 32**0.5)
    assert resolve_variant(k.variant("softmax-full"), 32)["attn_kwargs"] == {"sr_ratio": 1}
    s = get_ablation("solver").variant("cg-equal-time")
    assert resolve_variant(s, 32, cg_iters=7)["attn_kwargs"] == {"solver": "cg", "iters": 7}
    with pytest.raises(ValueError, match="^cg_iters"):
        resolve_variant(s, 32)


def test_every_variant_is_a_valid_attention_config():
    from laplacianformer import LaplacianAttention
    from laplacianformer.layers.token_mixer import ATTENTIONS, LAPLACIAN_ATTN_KWARGS

    for a in ABLATIONS.values():
        for v in a.variants:
            if v.attn_kwargs.get("norm") == "injective_nomean":
                continue  # needs operator support (test_unsupported_variant_is_reported)
            f = resolve_variant(v, 32, cg_iters=5)
            assert f["attn"] in ATTENTIONS and not f["model_kwargs"]
            assert operator_support(f) is None
            if f["attn"] != "softmax":
                assert set(f["attn_kwargs"]) <= set(LAPLACIAN_ATTN_KWARGS)
                LaplacianAttention(32, 1, kernel=f["attn"], **f["attn_kwargs"])


def test_protocol_block_and_refusal_of_too_few_stage1_tokens(quick_protocol):
    full = ablate.build_protocol("full", PROTOCOL)
    assert (full["img_size"], full["stage1_tokens"], full["landmarks"]) == (28, 196, 49)
    assert (full["train_images"], full["test_images"], full["head_dim"]) == (60000, 10000, 32)
    r = full["recipe"]
    assert r["model_kwargs"] == {"stem_stride": 2} and r["threads"] == 1 and r["train_subset"] is None
    for k in ("lr", "epochs", "batch_size", "drop_path", "label_smoothing", "random_crop", "hflip", "weight_decay",
              "warmup_epochs", "clip_grad", "min_lr"):
        assert k in r
    assert "seed" not in r and "attn" not in r
    assert (quick_protocol["train_images"], quick_protocol["test_images"]) == (128, 64)
    with pytest.raises(ValueError, match=r"^protocol: stage 1 has 64 tokens .* fewer than 4 × m = 196.*barely"):
        ablate.build_protocol("bad", {**PROTOCOL, "img_size": 32, "model_kwargs": {"stem_stride": 4}})
    with pytest.raises(ValueError, match="^protocol: stage 1 has 196 tokens"):
        ablate.build_protocol("bad", {**PROTOCOL, "model_kwargs": {"stem_stride": 2, "landmarks": (8, 8)}})


def test_cli_refuses_protocol_with_too_few_tokens(capsys, tmp_path):
    # img 26, stem stride 2: 13² = 169 tokens < 4 × 49
    assert ablate.main(["tie_qk", "--img-size", "26", "--out", str(tmp_path)]) == 2
    assert "protocol: stage 1 has 169 tokens" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


class Synthetic:
    """Stands in for train(): top-1 = per-value level + seed noise (deterministic), no training."""

    def __init__(self, levels: dict, spread: float = 0.004, key=lambda c: c["attn_kwargs"].get("lam")):
        self.levels, self.spread, self.key, self.calls = levels, spread, key, []

    def __call__(self, config):
        k = self.key(config)
        self.calls.append((k, config["seed"]))
        noise = self.spread * math.sin(1.7 * config["seed"] + 3.1 * (k or 0))
        return {"top1": self.levels[k] + noise, "loss": 1.0 - self.levels[k]}


def _kw(tmp_path, protocol, **extra):
    return dict(protocol=protocol, out=tmp_path, smoke_test=True, progress=False, **extra)


def test_runner_resumes_shares_cells_and_refuses_other_protocols(tmp_path, quick_protocol):
    a = get_ablation("lambda")
    rec = Synthetic({1.0: 0.80, 4.0: 0.83})
    kw = _kw(tmp_path, quick_protocol, seeds=[0, 1], labels=["lam=1", "lam=4"], train_fn=rec)
    record = ablate.run_ablation(a, **kw)
    assert sorted(rec.calls) == [(1.0, 0), (1.0, 1), (4.0, 0), (4.0, 1)]
    saved = json.loads((tmp_path / "lambda.json").read_text())
    assert saved["cells"] == record["cells"] and len(saved["cells"]) == 4
    del saved["cells"]["lam=4|seed=1"]
    (tmp_path / "lambda.json").write_text(json.dumps(saved))
    ablate.run_ablation(a, **kw)
    assert rec.calls[4:] == [(4.0, 1)]
    other = {**quick_protocol, "recipe": {**quick_protocol["recipe"], "lr": 1.0}}
    with pytest.raises(ValueError, match=r"^out: .* another protocol \(recipe.lr: 0.002 vs 1.0"):
        ablate.run_ablation(a, **{**kw, "protocol": other})
    before = len(rec.calls)
    solver = ablate.run_ablation(get_ablation("solver"), **{**kw, "labels": ["newton_schulz"]})
    assert len(rec.calls) == before
    assert solver["cells"]["newton_schulz|seed=1"]["reused_from"] == "lambda/lam=4|seed=1"
    ablate.run_ablation(a, **{**kw, "protocol": other, "fresh": True})
    assert len(rec.calls) == before + 4


def test_legacy_file_is_never_mixed_nor_overwritten(tmp_path, quick_protocol, capsys):
    legacy = {"ablation": "tie_qk", "default": "separate", "settings": {"base": {"train_subset": 2000, "epochs": 2}},
              "cells": {"separate|seed=0": {"label": "separate", "seed": 0, "top1": 0.7, "loss": 0.9},
                        "tied|seed=0": {"label": "tied", "seed": 0, "top1": 0.69, "loss": 0.9}}}
    (tmp_path / "tie_qk.json").write_text(json.dumps(legacy))
    for fresh in (False, True):
        with pytest.raises(ValueError, match=r"^out: .* legacy record .* \(not even with --fresh\)"):
            ablate.run_ablation(get_ablation("tie_qk"), **_kw(tmp_path, quick_protocol, seeds=[0], labels=["tied"],
                                                               train_fn=lambda c: {"top1": 0.5}, fresh=fresh))
    assert json.loads((tmp_path / "tie_qk.json").read_text()) == legacy
    assert ablate.main(["tie_qk", "--report", "--out", str(tmp_path)]) == 0
    assert "LEGACY small-budget protocol" in (tmp_path / "tie_qk.md").read_text()
    assert json.loads((tmp_path / "tie_qk.json").read_text()) == legacy


def test_results_file_schema_and_partial_status(tmp_path, quick_protocol):
    a = get_ablation("lambda")
    levels = {0.5: 0.80, 1.0: 0.81, 2.0: 0.82, 4.0: 0.84, 8.0: 0.79}
    record = ablate.run_ablation(a, **_kw(tmp_path, quick_protocol, seeds=[0, 1, 2], labels=["lam=1", "lam=4"],
                                          train_fn=Synthetic(levels, spread=0.001)))
    saved = json.loads((tmp_path / "lambda.json").read_text())
    assert saved == json.loads(json.dumps(record))
    p = saved["protocol"]
    assert {"img_size", "stage1_tokens", "landmarks", "train_images", "test_images", "epochs", "seeds", "recipe"} <= set(p)
    assert p["seeds"] == [0, 1, 2] and saved["default"] == "lam=4"
    assert saved["complete"] is False and "lam=0.5|seed=0" in saved["missing"] and len(saved["missing"]) == 9
    s = saved["summary"]
    assert set(s) == {"lam=1", "lam=4"}
    for entry in s.values():
        assert {"n", "mean", "std", "paired_delta", "paired_ci95", "paired_n"} <= set(entry)
        assert 0.0 <= entry["mean"] <= 1.0
    assert s["lam=4"]["paired_delta"] is None and s["lam=1"]["paired_n"] == 3
    lo, hi = s["lam=1"]["paired_ci95"]
    assert s["lam=1"]["paired_delta"] == pytest.approx(-0.03, abs=0.003)
    assert lo < s["lam=1"]["paired_delta"] < hi < 0
    (v,) = saved["verdicts"]
    assert set(v) >= {"claim", "verdict", "evidence"} and v["verdict"] == "undecided"  # lam=0.5, 2, 8 missing
    assert "no cells of lam=0.5" in v["evidence"]
    assert [c["verdict"] for c in v["comparisons"]] == ["undecided", "reproduced", "undecided", "undecided"]
    ablate.write_report(saved, tmp_path)
    md = (tmp_path / "lambda.md").read_text()
    assert "INCOMPLETE: 6 of 15 cells" in md and "| lam=4 (default) | 3 |" in md and "λ = 4 is the best" in md
    assert (tmp_path / "lambda.png").stat().st_size > 5000
    full = ablate.run_ablation(a, **_kw(tmp_path, quick_protocol, seeds=[0, 1, 2], labels=a.labels,
                                        train_fn=Synthetic(levels, spread=0.001)))
    assert full["complete"] is True and full["missing"] == []
    assert full["verdicts"][0]["verdict"] == "reproduced"


def test_n1_gives_no_ci_in_json_and_table(tmp_path, quick_protocol):
    record = ablate.run_ablation(get_ablation("tie_qk"), **_kw(
        tmp_path, quick_protocol, seeds=[0], labels=["separate", "tied"],
        train_fn=lambda c: {"top1": 0.8 if c["attn_kwargs"]["tie_qk"] else 0.82, "loss": 0.5}))
    s = record["summary"]["tied"]
    assert s["paired_n"] == 1 and s["paired_ci95"] is None and s["std"] is None
    assert s["paired_delta"] == pytest.approx(-0.02)
    assert record["verdicts"][0]["verdict"] == "undecided" and "no CI" in record["verdicts"][0]["evidence"]
    assert record["complete"] is True
    ablate.write_report(record, tmp_path)
    assert "| tied | 1 | 80.00 | -2.00 | n/a | 1 |" in (tmp_path / "tie_qk.md").read_text()


def test_seed_loop_stops_when_halfwidth_target_is_reached(tmp_path, quick_protocol):
    a = get_ablation("lambda")
    labels = ["lam=1", "lam=4"]
    # paired differences: -0.02 + 0.004·(sin(1.7 s + 3.1) − sin(1.7 s + 12.4)): half-width falls with n
    fake = Synthetic({1.0: 0.80, 4.0: 0.82})
    record = ablate.grow_seeds(a, target_halfwidth=0.005, max_seeds=12, start_seeds=3, labels=labels,
                               **_kw(tmp_path, quick_protocol, train_fn=fake))
    n = record["seed_policy"]["seeds"]
    assert record["seed_policy"]["met"] is True and 3 <= n < 12
    assert len(fake.calls) == 2 * n and sorted({s for _, s in fake.calls}) == list(range(n))
    assert record["summary"]["lam=1"]["paired_halfwidth"] <= 0.005
    # one seed fewer would not have met it: the loop stopped at the first n that does
    prev = ablate.summarise({**record, "cells": {k: c for k, c in record["cells"].items() if c["seed"] < n - 1}}, a)
    assert prev["lam=1"]["paired_halfwidth"] > 0.005
    # resumable: running again trains nothing
    again = ablate.grow_seeds(a, target_halfwidth=0.005, max_seeds=12, labels=labels,
                              **_kw(tmp_path, quick_protocol, train_fn=fake))
    assert len(fake.calls) == 2 * n and again["seed_policy"]["seeds"] == n
    # an interrupted round resumes with its missing cell only
    saved = json.loads((tmp_path / "lambda.json").read_text())
    del saved["cells"][f"lam=1|seed={n - 1}"]
    (tmp_path / "lambda.json").write_text(json.dumps(saved))
    ablate.grow_seeds(a, target_halfwidth=0.005, max_seeds=12, labels=labels, **_kw(tmp_path, quick_protocol, train_fn=fake))
    assert fake.calls[2 * n:] == [(1.0, n - 1)]


def test_interrupted_training_is_not_recorded(tmp_path, quick_protocol):
    def interrupted(config):
        return {"top1": 0.1, "loss": 2.0, "interrupted": "SIGTERM"}

    with pytest.raises(KeyboardInterrupt, match="rerun the same command"):
        ablate.run_ablation(get_ablation("tie_qk"), **_kw(tmp_path, quick_protocol, seeds=[0], labels=["tied"],
                                                           train_fn=interrupted))
    saved = json.loads((tmp_path / "tie_qk.json").read_text())
    assert saved["cells"] == {} and saved["complete"] is False


def test_seed_loop_caps_at_max_seeds_and_runs_two_jobs(tmp_path, quick_protocol):
    a = get_ablation("lambda")
    fake = Synthetic({1.0: 0.80, 4.0: 0.82}, spread=0.05)
    record = ablate.grow_seeds(a, target_halfwidth=0.001, max_seeds=4, start_seeds=2, labels=["lam=1", "lam=4"],
                               **_kw(tmp_path, quick_protocol, train_fn=fake, jobs=2))
    assert record["seed_policy"]["met"] is False and record["seed_policy"]["seeds"] == 4
    assert sorted(fake.calls) == sorted((k, s) for k in (1.0, 4.0) for s in range(4))
    with pytest.raises(ValueError, match="^max_seeds"):
        ablate.grow_seeds(a, target_halfwidth=0.005, max_seeds=1, labels=["lam=4"], **_kw(tmp_path, quick_protocol))


def test_cg_at_ns_time_is_measured_once_and_recorded(tmp_path, quick_protocol):
    timings = []

    def timing(recipe):
        timings.append(recipe["batch_size"])
        return {"cg_iters": 6, "ns_iters": 20, "ns_seconds": 0.02, "cg_seconds_per_iter": 0.003, "source": "fake"}

    kw = _kw(tmp_path, quick_protocol, seeds=[0], labels=["newton_schulz", "cg-equal-time"], timing_fn=timing,
             train_fn=lambda c: {"top1": 0.8 + 0.001 * c["attn_kwargs"]["iters"], "loss": 0.5})
    record = ablate.run_ablation(get_ablation("solver"), **kw)
    assert timings == [16] and record["resolved"]["cg_equal_time"]["cg_iters"] == 6
    assert record["cells"]["cg-equal-time|seed=0"]["attn_kwargs"] == {"solver": "cg", "iters": 6}
    ablate.run_ablation(get_ablation("solver"), **{**kw, "seeds": [0, 1]})
    assert timings == [16]


def test_solver_timing_helper_on_model_matrices(quick_protocol):
    from laplacianformer.experiments.solver_timing import cg_iters_at_ns_time

    t = cg_iters_at_ns_time(quick_protocol["recipe"], batch=2, repeats=1)
    assert t["cg_iters"] >= 1 and t["matrices"] == [[2, 49, 49]] and t["ns_iters"] == 20


def test_unsupported_variant_is_reported(tmp_path, quick_protocol):
    """A value the operator rejects is listed as unsupported with the reason, never trained or recorded."""
    import dataclasses

    from laplacianformer.experiments.ablations import Variant

    norm = get_ablation("norm")
    bogus = Variant("no-such-norm", attn_kwargs={"norm": "no_such_norm"})
    sweep = dataclasses.replace(norm, variants=(norm.variant("injective"), bogus))
    assert operator_support(resolve_variant(norm.variant("injective-nomean"), 32)) is None
    why = operator_support(resolve_variant(bogus, 32))
    assert why.startswith("needs operator support") and "no_such_norm" in why
    record = ablate.run_ablation(sweep, **_kw(
        tmp_path, quick_protocol, seeds=[0], labels=["injective", "no-such-norm"],
        train_fn=lambda c: {"top1": 0.8, "loss": 0.5}))
    assert set(record["cells"]) == {"injective|seed=0"}
    assert record["unsupported"]["no-such-norm"].startswith("needs operator support")
    assert record["complete"] is False


def test_cross_ablation_best_vs_best_notes_selection_bias(tmp_path, quick_protocol):
    lam_levels = {0.5: 0.80, 1.0: 0.81, 2.0: 0.85, 4.0: 0.84, 8.0: 0.79}
    ablate.run_ablation(get_ablation("lambda"), **_kw(tmp_path, quick_protocol, seeds=[0, 1, 2],
                                                      labels=get_ablation("lambda").labels,
                                                      train_fn=Synthetic(lam_levels, spread=0.001)))

    def kernel_fake(c):
        lam = c["attn_kwargs"].get("lam", 4.0)
        top = 0.84 if c["attn"] == "laplacian" else 0.70 + 0.001 * lam
        return {"top1": top + 0.0005 * c["seed"], "loss": 0.5}

    k = get_ablation("kernel")
    labels = [lb for lb in k.labels if not lb.startswith("softmax")]
    record = ablate.run_ablation(k, **_kw(tmp_path, quick_protocol, seeds=[0, 1, 2], labels=labels, train_fn=kernel_fake))
    best = next(v for v in record["verdicts"] if "best bandwidth" in v["claim"])
    assert best["comparisons"][0]["a"] == "lam=2" and best["comparisons"][0]["b"] == "gaussian-bw4"
    assert best["verdict"] == "reproduced" and "Selection bias" in best["evidence"]
    assert "best of lambda: lam=2" in best["evidence"]


def test_cli_errors_name_the_argument(capsys):
    assert ablate.main(["bogus"]) == 2
    assert "name: unknown ablation" in capsys.readouterr().err
    assert ablate.main(["lambda", "--values", "lam=3", "--quick"]) == 2
    assert "values:" in capsys.readouterr().err
    assert ablate.main(["norm", "--report", "--out", "/nonexistent-dir"]) == 2
    assert "out:" in capsys.readouterr().err
    assert ablate.main(["--list"]) == 0
    assert "tie_qk" in capsys.readouterr().out


FAKE_CELL = """
import json, os, sys, time
cfg = json.load(open(sys.argv[1]))
time.sleep(0.3)
json.dump({"top1": 0.5 + 0.01 * cfg["seed"], "loss": 1.0, "threads_env": os.environ["OMP_NUM_THREADS"],
           "pid": os.getpid()}, open(sys.argv[2], "w"))
"""


def test_cell_processes_run_concurrently(tmp_path):
    import sys
    import time

    runner = ablate.CellRunner(jobs=2, command=[sys.executable, "-c", FAKE_CELL])
    items = [(f"c{s}", {"seed": s, "out": str(tmp_path / f"c{s}")}) for s in range(4)]
    start = time.perf_counter()
    got = {k: r for k, r, _ in runner.run(items)}
    assert set(got) == {"c0", "c1", "c2", "c3"} and got["c3"]["top1"] == pytest.approx(0.53)
    assert {r["threads_env"] for r in got.values()} == {"1"} and len({r["pid"] for r in got.values()}) == 4
    assert time.perf_counter() - start < 4 * 0.3 + 3.0
    assert (tmp_path / "c0" / "cell-config.json").exists() and (tmp_path / "c0" / "cell.log").exists()
    bad = ablate.CellRunner(jobs=2, command=[sys.executable, "-c", "import sys; sys.exit(3)"])
    with pytest.raises(RuntimeError, match="failed \\(exit 3\\)"):
        list(bad.run(items[:1]))


def test_quick_smoke_run_trains_for_real(tmp_path, capsys):
    assert ablate.main(["tie_qk", "--quick", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "tie_qk.json").read_text())
    assert record["smoke_test"] is True and record["protocol"]["name"] == "quick-smoke"
    p = record["protocol"]
    assert (p["img_size"], p["stage1_tokens"], p["landmarks"], p["train_images"], p["test_images"], p["epochs"]) == \
        (28, 196, 49, 128, 64, 1)
    assert p["seeds"] == [0] and p["recipe"]["max_steps"] == 3
    assert set(record["cells"]) == {"separate|seed=0", "tied|seed=0"}
    assert all(0.0 <= c["top1"] <= 1.0 for c in record["cells"].values())
    assert record["complete"] is True and record["missing"] == []
    assert record["summary"]["tied"]["paired_n"] == 1 and record["summary"]["tied"]["paired_ci95"] is None
    assert record["verdicts"][0]["verdict"] == "undecided"  # one seed: no CI for "separate keys beat tied"
    out = capsys.readouterr().out
    assert "SMOKE TEST" in out and "| tied |" in out and "[tie_qk " in out
    assert (tmp_path / "tie_qk.png").exists() and "SMOKE TEST" in (tmp_path / "tie_qk.md").read_text()


def test_same_protocol_ignores_new_default_flags_and_display_fields_but_not_results():
    from laplacianformer.experiments.protocol import PROTOCOL, recipe, same_protocol

    base = {"name": "p", "img_size": 28, "recipe": recipe(PROTOCOL)}
    older = {**base, "recipe": {k: v for k, v in base["recipe"].items() if k != "ema"}}  # written before "ema" existed
    assert same_protocol(base, older)
    assert same_protocol(base, {**base, "recipe": {**base["recipe"], "verify_images": not base["recipe"]["verify_images"]}})
    assert not same_protocol(base, {**base, "recipe": {**base["recipe"], "lr": 1.0}})
    assert not same_protocol({**base, "recipe": {**base["recipe"], "ema": True}}, older)  # new flag, not at its default
    assert not same_protocol(base, {**base, "img_size": 32})


def test_results_page_section_is_generated_from_the_files(tmp_path, quick_protocol):
    from laplacianformer.experiments import results_page

    results = tmp_path / "results"
    levels = {0.5: 0.80, 1.0: 0.81, 2.0: 0.82, 4.0: 0.84, 8.0: 0.79}
    record = ablate.run_ablation(get_ablation("lambda"), **_kw(results, quick_protocol, seeds=[0, 1, 2],
                                                               labels=["lam=1", "lam=4"],
                                                               train_fn=Synthetic(levels, spread=0.001)))
    ablate.write_report(record, results)
    (results / "tie_qk.json").write_text(json.dumps({"ablation": "tie_qk", "cells": {}}))  # legacy: no protocol
    docs = tmp_path / "docs"
    docs.mkdir()
    page = docs / "RESULTS.md"
    page.write_text(f"# prose kept\n\n{results_page.BEGIN}\nold text\n{results_page.END}\n\n## after\n")
    assert results_page.rewrite(page, results) is True
    text = page.read_text()
    assert text.startswith("# prose kept\n") and text.endswith("\n## after\n") and "old text" not in text
    assert ("| [`lambda`](#ablation-lambda) | SMOKE TEST, not a result; INCOMPLETE: 6 of 15 cells | 6 of 15 | 0, 1, 2 "
            "| undecided |") in text
    assert "| `tie_qk` | not run under this protocol yet |" in text  # the legacy file is not quoted
    assert "| lam=4 (default) | 3 |" in text and "![lambda](../results/lambda.png)" in text
    assert "| λ = 4 is the best of {0.5, 1, 2, 4, 8} | `lambda` | **undecided** |" in text
    assert results_page.rewrite(page, results) is False  # idempotent
    page.write_text("no markers\n")
    with pytest.raises(ValueError, match="^page: .*RESULTS.md must hold the markers"):
        results_page.rewrite(page, results)


def test_seed_coverage_names_the_seed_count_of_each_value_when_they_differ():
    from laplacianformer.experiments.evidence import seed_coverage, status
    from laplacianformer.experiments.results_page import overview

    def cells(label, seeds):
        return {f"{label}|seed={s}": {"label": label, "seed": s, "top1": 0.88 + 0.001 * s} for s in seeds}

    record = {"ablation": "lambda", "protocol": {"seeds": [0, 1, 2, 3, 4]}, "complete": False,
              "cells": {**cells("lam=4", range(5)), **cells("lam=0.5", range(5)), **cells("lam=2", range(3))},
              "missing": ["lam=2|seed=3", "lam=2|seed=4"]}
    assert seed_coverage(record) == "n = 5: lam=0.5, lam=4; n = 3: lam=2"
    assert status(record) == "INCOMPLETE: 13 of 15 cells"
    assert "| 13 of 15 | 0, 1, 2, 3, 4 (n = 5: lam=0.5, lam=4; n = 3: lam=2) |" in overview({"lambda": record})
    even = {**record, "cells": {**cells("lam=4", range(3)), **cells("lam=2", range(3))}}
    assert seed_coverage(even) == ""

"""Ablation registry and the resumable runner (the training itself is C's train(); here a recorder
stands in for it, except in the single real --quick smoke run)."""

import json

import pytest

from laplacianformer.experiments import ablate
from laplacianformer.experiments.ablations import ABLATIONS, get_ablation, resolve_variant

DESIGN_ABLATIONS = {"lambda", "solver", "kernel", "norm", "landmarks", "ns_iters", "qk_scale", "tie_qk"}


def test_registry_covers_spec_section_7():
    assert set(ABLATIONS) == DESIGN_ABLATIONS
    for a in ABLATIONS.values():
        assert a.default in a.labels
        assert all(q in a.labels for q in a.quick)
        assert len(set(a.labels)) == len(a.labels)
    with pytest.raises(ValueError, match="^name"):
        get_ablation("nope")
    with pytest.raises(ValueError, match="^values"):
        get_ablation("lambda").variant("lam=3")


def test_qk_scale_resolves_powers_of_head_dim():
    a = get_ablation("qk_scale")
    scales = [resolve_variant(v, 16)["attn_kwargs"]["qk_scale"] for v in a.variants]
    assert scales == pytest.approx([1.0, 0.5, 0.25])
    with pytest.raises(ValueError, match="^head_dim"):
        resolve_variant(a.variants[0], None)


def test_every_variant_is_a_valid_attention_config():
    from laplacianformer import LaplacianAttention
    from laplacianformer.layers.token_mixer import ATTENTIONS, LAPLACIAN_ATTN_KWARGS

    for a in ABLATIONS.values():
        for v in a.variants:
            f = resolve_variant(v, 32)
            assert f["attn"] in ATTENTIONS and not f["model_kwargs"]
            if f["attn"] != "softmax":
                assert set(f["attn_kwargs"]) <= set(LAPLACIAN_ATTN_KWARGS)
                LaplacianAttention(32, 1, kernel=f["attn"], **f["attn_kwargs"])


class Recorder:
    """Stands in for train(): returns a top-1 that depends on the value and seed, and logs the calls."""

    def __init__(self):
        self.calls = []

    def __call__(self, config):
        self.calls.append((config["attn_kwargs"].get("lam"), config["seed"]))
        return {"top1": 0.5 + 0.01 * config["attn_kwargs"]["lam"] + 0.001 * config["seed"], "loss": 1.0}


def test_runner_resumes_and_refuses_other_settings(tmp_path):
    a = get_ablation("lambda")
    rec = Recorder()
    kw = dict(seeds=[0, 1], labels=["lam=1", "lam=4"], out=tmp_path, smoke_test=True, progress=False, train_fn=rec)
    record = ablate.run_ablation(a, base={"epochs": 1}, **kw)
    assert sorted(rec.calls) == [(1.0, 0), (1.0, 1), (4.0, 0), (4.0, 1)]
    saved = json.loads((tmp_path / "lambda.json").read_text())
    assert saved["cells"] == record["cells"] and len(saved["cells"]) == 4
    del saved["cells"]["lam=4|seed=1"]
    (tmp_path / "lambda.json").write_text(json.dumps(saved))
    ablate.run_ablation(a, base={"epochs": 1}, **kw)
    assert rec.calls[4:] == [(4.0, 1)]
    with pytest.raises(ValueError, match="^out"):
        ablate.run_ablation(a, base={"epochs": 2}, **kw)
    ablate.run_ablation(a, base={"epochs": 2}, fresh=True, **kw)
    assert len(rec.calls) == 9
    before = len(rec.calls)
    solver = ablate.run_ablation(get_ablation("solver"), base={"epochs": 2}, **{**kw, "labels": ["newton_schulz"]})
    assert len(rec.calls) == before
    assert solver["cells"]["newton_schulz|seed=1"]["reused_from"] == "lambda/lam=4|seed=1"
    rows = ablate.summarise(record)
    assert [r["label"] for r in rows] == ["lam=1", "lam=4"]
    assert rows[1]["top1_mean"] == pytest.approx(0.5405)
    assert rows[1]["top1_std"] == pytest.approx(0.001 / 2**0.5)
    table = ablate.ablation_table(record, rows)
    assert "lam=4 (default)" in table and "54.05 ± 0.07" in table
    assert rows[0]["delta_mean"] == pytest.approx(-0.03) and rows[0]["delta_std"] == pytest.approx(0.0, abs=1e-12)
    assert "| -3.00 ± 0.00 |" in table
    ablate.plot_ablation(record, rows, tmp_path / "lambda.png")
    assert (tmp_path / "lambda.png").stat().st_size > 1000
    assert ablate.main(["lambda", "--report", "--out", str(tmp_path)]) == 0
    assert "lam=4 (default)" in (tmp_path / "lambda.md").read_text()
    assert len(rec.calls) == 9


def test_interrupted_training_is_not_recorded(tmp_path):
    def interrupted(config):
        return {"top1": 0.1, "loss": 2.0, "interrupted": "SIGTERM"}

    with pytest.raises(KeyboardInterrupt):
        ablate.run_ablation(get_ablation("tie_qk"), base={}, seeds=[0], labels=["tied"], out=tmp_path,
                            smoke_test=True, progress=False, train_fn=interrupted)
    assert not (tmp_path / "tie_qk.json").exists()


def test_cli_errors_name_the_argument(capsys):
    assert ablate.main(["bogus"]) == 2
    assert "name: unknown ablation" in capsys.readouterr().err
    assert ablate.main(["lambda", "--values", "lam=3", "--quick"]) == 2
    assert "values:" in capsys.readouterr().err
    assert ablate.main(["norm", "--report", "--out", "/nonexistent-dir"]) == 2
    assert "out:" in capsys.readouterr().err
    assert ablate.main(["--list"]) == 0
    assert "tie_qk" in capsys.readouterr().out


def test_quick_smoke_run_trains_for_real(tmp_path, capsys):
    assert ablate.main(["tie_qk", "--quick", "--no-progress", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "tie_qk.json").read_text())
    assert record["settings"]["smoke_test"] is True
    assert set(record["cells"]) == {"separate|seed=0", "tied|seed=0"}
    assert all(0.0 <= c["top1"] <= 1.0 for c in record["cells"].values())
    out = capsys.readouterr().out
    assert "SMOKE TEST" in out and "| tied |" in out
    assert (tmp_path / "tie_qk.png").exists() and (tmp_path / "tie_qk.md").exists()

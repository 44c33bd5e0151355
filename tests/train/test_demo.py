"""The demo (docs/MEASUREMENTS.md, "The demo"): CLI defaults and validation, results assembly, one tiny end-to-end run.

The full demo is never run here; the end-to-end test uses ``--quick`` with a few dozen images and a 32-px
cost panel.
"""

from __future__ import annotations

import json

import pytest

from laplacianformer.cli import build_parser, main
from laplacianformer.demo import report
from laplacianformer.demo.recipe import DEFAULTS, parse_attns
from laplacianformer.demo.run import RESULTS_FILES, run_demo

from train_helpers import run_cli


def _demo_help(capsys) -> str:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["demo", "--help"])
    return capsys.readouterr().out


def test_help_shows_the_defaults_and_the_flags(capsys):
    text = " ".join(_demo_help(capsys).split())
    for flag in ("--seed", "--lr", "--model-kwargs", "--jobs", "--quick", "--attns", "--publish", "--cost-sizes"):
        assert flag in text
    assert f"default {DEFAULTS['lr']}" in text
    assert f"default {DEFAULTS['batch_size']}" in text
    assert "default 2" in text  # --jobs
    assert "default laplacian,gaussian,softmax,laplacian-tuned" in text
    assert '{"stem_stride": 2}' in text
    assert "default 224 512 768 1024" in text


def test_parse_attns():
    assert parse_attns(" softmax, laplacian ") == ["softmax", "laplacian"]
    assert parse_attns(["gaussian"]) == ["gaussian"]
    assert parse_attns("laplacian-tuned,laplacian") == ["laplacian-tuned", "laplacian"]
    for bad, match in (("laplacian,foo", "unknown attention 'foo'"), ("laplacian-paper", "unknown attention"),
                       ("softmax-tuned", "unknown attention"), ("", "one or more"),
                       ("softmax,softmax", "given twice")):
        with pytest.raises(ValueError, match=f"^attns: .*{match}"):
            parse_attns(bad)


@pytest.mark.parametrize("value", ["laplacian,performer", ",", "gaussian,gaussian"])
def test_bad_attns_fail_before_anything_runs(tmp_path, capsys, value):
    out = tmp_path / "demo"
    assert main(["demo", "--attns", value, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--attns" in err and err.count("\n") == 1
    assert not out.exists()


@pytest.mark.parametrize("kwargs, match", [
    (dict(lr=-1.0), "^lr: "),
    (dict(model_kwargs={"stem_stride": 4}, img_size=32), "stage 1 has 64 tokens"),
    (dict(img_size=16), "stage 1 has 64 tokens"),
    (dict(model_kwargs={"stem_stride": 4}), "does not accept img_size 28"),
    (dict(jobs=0), "^jobs: "),
    (dict(attns="laplacian,nope"), "^attns: "),
])
def test_run_demo_checks_its_arguments_before_training(tmp_path, kwargs, match):
    out = tmp_path / "demo"
    with pytest.raises(ValueError, match=match):
        run_demo(out=out, **{"attns": "laplacian", **kwargs})
    assert not out.exists()


def test_cli_maps_a_bad_recipe_value_to_its_flag(tmp_path, capsys):
    assert main(["demo", "--model-kwargs", '{"stem_stride": 4}', "--img-size", "32", "--out", str(tmp_path / "d")]) == 2
    assert "stage 1 has 64 tokens" in capsys.readouterr().err
    assert main(["demo", "--model-kwargs", "[1]", "--out", str(tmp_path / "d")]) == 2
    assert "--model-kwargs" in capsys.readouterr().err


def test_unknown_recipe_field_is_refused(tmp_path):
    with pytest.raises(TypeError, match="^momentum: not a demo recipe field"):
        run_demo(out=tmp_path, attns="laplacian", momentum=0.9)


def _cell(size, mode, attn, ms, heap, act=None):
    return dict(size=size, mode=mode, attn=attn, batch=1, tokens_stage1=(size // 4) ** 2, ms_per_image=ms,
                iqr_ms=0.0, cpu_ms_per_image=ms, repeats=3, peak_heap_mib=heap, activations_mib=act, skipped=None)


def test_key_ratios_crossover_and_rows():
    cells = []
    for size, lap, soft in ((224, 2.0, 1.0), (512, 1.0, 1.0), (1024, 1.0, 4.0)):
        cells += [_cell(size, "infer", "laplacian", lap, 10.0), _cell(size, "infer", "softmax", soft, 10.05),
                  _cell(size, "train", "laplacian", 3 * lap, 30.0, 40.0),
                  _cell(size, "train", "softmax", 3 * soft, 20.0, 30.0)]
    r = report.key_ratios(cells, ["laplacian", "softmax"])["laplacian"]
    assert r["infer"]["size"] == 1024 and r["infer"]["time"] == pytest.approx(0.25)
    assert r["infer"]["crossover_time"] == 512          # equal at 512, faster at 1024
    assert r["infer"]["crossover_peak_heap"] == 224     # within 1 %: equal
    assert r["train"]["crossover_peak_heap"] is None    # always more memory
    assert r["train"]["activations"] == pytest.approx(40 / 30)
    rows = report.cost_rows(cells + [dict(size=2048, mode="train", attn="softmax", batch=1, skipped="over the cap")])
    row = next(x for x in rows if (x["size"], x["attn"]) == (224, "laplacian"))
    assert row["forward_ms"] == 2.0 and row["train_step_ms"] == 6.0 and row["activations_mib"] == 40.0
    assert next(x for x in rows if x["size"] == 2048)["train_step_skipped"] == "over the cap"
    assert "never in 224–1024²" in report._ratio_lines({"laplacian": r}, [224, 512, 1024])


def test_quick_demo_end_to_end(tmp_path):
    """Two attentions and the tuned preset's row, a few steps on sklearn digits at 28 px, a 32-px cost panel (the
    attentions only), published to a second directory: every file is written and the results carry the protocol
    geometry and CPU seconds."""
    pytest.importorskip("sklearn")
    out, pub = tmp_path / "demo", tmp_path / "pub"
    proc = run_cli(["demo", "--quick", "--data", "digits", "--attns", "laplacian,softmax,laplacian-tuned",
                    "--train-subset", "128",
                    "--test-subset", "64", "--cost-sizes", "32", "--jobs", "2", "--out", str(out),
                    "--publish", str(pub), "--no-progress"], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    assert [r["attn"] for r in res["rows"]] == ["laplacian", "softmax", "laplacian-tuned"]
    assert [r["attn_preset"] for r in res["rows"]] == [None, None, "tuned"]
    tuned = json.loads((out / "laplacian-tuned" / "train_config.json").read_text())
    assert tuned["attn"] == "laplacian" and tuned["attn_preset"] == "tuned"
    assert res["rows"][2]["params"] < res["rows"][0]["params"]  # tied keys: no key projection
    for r in res["rows"]:
        assert 0 <= r["top1"] <= 1 and r["cpu_time_s"] > 0 and r["peak_memory_mb"] > 0 and r["eval_n"] == 64
        assert (out / r["attn"] / "model.safetensors").exists()
    s = res["settings"]
    assert s["protocol"]["stage1_tokens"] == 196 and s["protocol"]["landmarks"] == 49
    assert s["jobs"] == 2 and s["threads"] == 1 and s["recipe"]["lr"] == DEFAULTS["lr"]
    assert s["total_cpu_time_s"] > sum(r["cpu_time_s"] for r in res["rows"]) * 0.99
    sizes = {(c["size"], c["attn"]) for c in res["cost"]["rows"]}
    assert sizes == {(32, "laplacian"), (32, "softmax")}
    assert all(c["forward_ms"] > 0 and c["train_step_peak_mib"] > 0 for c in res["cost"]["rows"])
    for name in RESULTS_FILES:
        assert (out / name).stat().st_size > 0 and (pub / name).read_bytes() == (out / name).read_bytes()
    md = (out / "results.md").read_text()
    assert "quick smoke test" in md and "14×14 = 196 tokens" in md

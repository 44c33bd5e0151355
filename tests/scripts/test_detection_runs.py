"""scripts/detection_runs.sh: the run table and ORDER, checked with PYTHON=echo (no training runs)."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "detection_runs.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _run(tmp_path: Path, order: str) -> subprocess.CompletedProcess:
    data = tmp_path / "data"
    (data / "annotations").mkdir(parents=True)
    (data / "annotations" / "instances_val.json").write_text("{}")
    env = dict(os.environ, PYTHON="echo", VARIANTS_PYTHON="true", ORDER=order, DATA=str(data), RUNS=str(tmp_path / "runs"),
               KEEP=str(tmp_path / "keep"), REPORT=str(tmp_path / "report"))
    return subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def test_order_runs_the_named_runs_with_their_flags(tmp_path):
    done = _run(tmp_path, "retinanet-gaussian-s2 maskrcnn-laplacian-s0")
    assert done.returncode == 0, done.stderr
    started = [line.split(":")[0] for line in done.stdout.splitlines() if ": starting" in line]
    assert started == ["retinanet-gaussian-s2", "maskrcnn-laplacian-s0"]
    gaussian = (tmp_path / "runs" / "retinanet-gaussian-s2.log").read_text().split()
    assert gaussian[gaussian.index("--max-steps") + 1] == "900"
    assert gaussian[gaussian.index("--seed") + 1] == "2"
    assert gaussian[gaussian.index("--backbone-kwargs") + 1] == '{"attn":"gaussian"}'
    assert gaussian[gaussian.index("--detector") + 1] == "retinanet"
    mask = (tmp_path / "runs" / "maskrcnn-laplacian-s0.log").read_text().split()
    assert mask[mask.index("--max-steps") + 1] == "300"
    assert mask[mask.index("--detector") + 1] == "maskrcnn"


def test_default_order_has_three_seeds_per_backbone_then_mask_rcnn(tmp_path):
    done = _run(tmp_path, "")
    assert done.returncode == 0, done.stderr
    started = [line.split(":")[0] for line in done.stdout.splitlines() if ": starting" in line]
    assert started == [f"retinanet-{b}-s{s}" for s in range(3) for b in ("laplacian", "gaussian", "srsoftmax")] \
        + ["maskrcnn-laplacian-s0"]


def test_unknown_run_name_is_refused(tmp_path):
    done = _run(tmp_path, "retinanet-laplacian-s0 retinanet-bogus-s9")
    assert done.returncode == 2
    assert "unknown run 'retinanet-bogus-s9'" in done.stderr

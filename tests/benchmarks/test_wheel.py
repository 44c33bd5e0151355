"""``laplacianformer bench`` from a wheel installed outside the checkout: the benchmarks are part of the
package, list themselves, run, and write under the current directory (nothing of the source tree is used).

The wheel is built from a copy of the project files (pyproject.toml, README.md, LICENSE, src/) without
build isolation (no network), installed with ``pip install --no-deps --target`` and run with that
directory first on PYTHONPATH from an empty directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The site directory holding the installed wheel."""
    tmp = tmp_path_factory.mktemp("wheel")
    project = tmp / "project"
    project.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, project / name)
    shutil.copytree(ROOT / "src", project / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.so"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp / "dist"), str(project)],
                   check=True, capture_output=True, timeout=300)
    wheels = list((tmp / "dist").glob("laplacianformer-*.whl"))
    assert len(wheels) == 1, wheels
    site = tmp / "site"
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheels[0])], check=True,
                   capture_output=True, timeout=300)
    return site


def _run(site: Path, cwd: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    return subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_bench_list_and_a_quick_benchmark_outside_the_checkout(installed, tmp_path):
    listed = _run(installed, tmp_path, "-m", "laplacianformer", "bench", "--list")
    assert listed.returncode == 0, listed.stderr
    names = [line.split()[0] for line in listed.stdout.splitlines()]
    assert {"kernels", "model_throughput", "model_cost", "padding", "startup"} <= set(names)
    # the repository's one-off investigations and GPU-only studies (benchmarks/) are not in the wheel
    moved = {"gpu_targets", "roofline", "launch_census", "cpu_pitfalls", "gpu_micro"}
    assert not moved & set(names) and not any((installed / "laplacianformer" / "bench" / f"{m}.py").exists()
                                              for m in moved)
    ran = _run(installed, tmp_path, "-m", "laplacianformer", "bench", "--quick", "padding")
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-3000:]
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert written == ["runs/bench/padding/padding_cpu.json", "runs/bench/padding/padding_cpu.md"], written
    # the benchmark's own process ran the installed copy (its command is the module file it ran; the child
    # imports the copy its parent, ``python -m laplacianformer``, imported: so did the parent)
    command = json.loads((tmp_path / written[0]).read_text())["command"]
    assert str(installed / "laplacianformer" / "bench" / "padding.py") in command, command

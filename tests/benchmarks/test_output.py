"""Where the benchmarks write (``bench.output``) and what ``laplacianformer bench`` runs (``bench.registry``):
a run directory under the current directory by default, the published results only with ``--publish``."""

from __future__ import annotations

import argparse
import ast
import json
import pkgutil
import shutil
import subprocess
from pathlib import Path

import pytest

import laplacianformer.bench as bench_pkg
from laplacianformer.bench import registry
from laplacianformer.bench.output import add_output_options, output_stem
from laplacianformer.cli import main

SRC = Path(bench_pkg.__file__).resolve().parents[1]  # the package directory
ROOT = Path(__file__).resolve().parents[2]
INFRASTRUCTURE = {"allocator", "backends", "harness", "layer_floor", "machine", "options", "output", "process",
                  "registry", "report"}


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_output_options(p)
    return p.parse_args(list(argv))


def test_default_is_a_run_directory_and_publish_needs_an_existing_target(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert output_stem(_args(), "kernels", "kernels_cpu") == Path("runs/bench/kernels/kernels_cpu")
    assert output_stem(_args("--out", "x/y"), "kernels", "kernels_cpu") == Path("x/y")
    with pytest.raises(ValueError, match="^--publish: benchmarks/results: no such directory"):
        output_stem(_args("--publish"), "kernels", "kernels_cpu")
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    assert output_stem(_args("--publish"), "kernels", "kernels_cpu") == Path("benchmarks/results/kernels_cpu")
    (tmp_path / "elsewhere").mkdir()
    assert output_stem(_args("--publish", "elsewhere"), "k", "s") == Path("elsewhere/s")
    with pytest.raises(SystemExit):
        _args("--out", "a", "--publish")


def test_every_benchmark_module_is_registered_and_described():
    modules = {m.name for m in pkgutil.iter_modules(bench_pkg.__path__)} - INFRASTRUCTURE
    assert modules == set(registry.BENCHMARKS)
    for name in registry.BENCHMARKS:
        assert registry.describe(name), name
    assert registry.describe("kernels").startswith("Kernel benchmark")


def test_no_module_of_bench_or_demo_locates_files_from_its_own_path():
    """Outputs and inputs are found from the current directory or given explicitly, never from ``__file__``."""
    for package in ("bench", "demo"):
        for path in sorted((SRC / package).glob("*.py")):
            names = {n.id for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Name)}
            assert "__file__" not in names, path


def test_cli_bench_lists_and_refuses_in_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "--list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in listed] == list(registry.BENCHMARKS)
    for argv, needle in ((["bench", "nope"], "unknown benchmark 'nope'"),
                         (["bench", "padding", "--quick", "--publish"], "--publish: refused with --quick"),
                         (["bench", "padding", "--publish", "missing"], "--publish: missing: no such directory")):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert needle in err and err.count("\n") == 0, err
    assert not any(tmp_path.iterdir())


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _git(cwd: Path, *argv: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *argv], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_quick_benchmark_in_a_checkout_leaves_git_status_clean(tmp_path, monkeypatch):
    """``bench --quick`` from the root of a checkout (the repository's .gitignore, a published file of the
    same name) writes runs/bench/NAME/ only: ``git status --porcelain`` stays empty."""
    published = tmp_path / "benchmarks" / "results"
    published.mkdir(parents=True)
    (published / "padding_cpu.json").write_text("{}\n")
    shutil.copy(ROOT / ".gitignore", tmp_path / ".gitignore")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-q", "-m", "published")
    before = _tree(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "--quick", "padding"]) == 0
    assert _git(tmp_path, "status", "--porcelain") == ""
    after = _tree(tmp_path)
    new = sorted(k for k in set(after) - set(before) if not k.startswith(".git/"))
    assert new == ["runs/bench/padding/padding_cpu.json", "runs/bench/padding/padding_cpu.md"]
    assert json.loads(after[new[0]])["results"]["rows"]


def test_publish_writes_into_the_published_directory(tmp_path, monkeypatch):
    """The padding benchmark at smoke size with ``--publish``: its rows and table, in benchmarks/results only."""
    from laplacianformer.bench import padding

    published = tmp_path / "benchmarks" / "results"
    published.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    padding.main(["--max-len", "32", "--batch", "2", "--dim", "16", "--repeats", "1", "--publish"])
    assert sorted(p.name for p in published.iterdir()) == ["padding_cpu.json", "padding_cpu.md"]
    assert not (tmp_path / "runs").exists()
    rows = json.loads((published / "padding_cpu.json").read_text())["results"]["rows"]
    assert [(r["max_len"], r["mode"]) for r in rows] == [(32, "infer"), (32, "train")]
    assert all(r["ratio"] > 0 for r in rows) and "padded / per-sequence" in (published / "padding_cpu.md").read_text()


def test_cli_bench_passes_one_benchmarks_own_options_to_it(capsys, monkeypatch):
    """``laplacianformer bench NAME --opt ...`` runs NAME with its own options (after the --quick ones, which
    they override); with two names such options are refused in one line (with none, the option's value reads
    as an unknown name, also one line); any other command still refuses arguments it does not know."""
    calls = []
    monkeypatch.setattr(registry.subprocess, "call", lambda cmd, env=None: calls.append(cmd) or 0)
    assert main(["bench", "host_overhead", "--threads", "1", "--repeats", "400"]) == 0
    assert calls[-1][1:] == ["-m", registry.module_of("host_overhead"), "--threads", "1", "--repeats", "400"]
    assert main(["bench", "--quick", "cpu_inference", "--sizes", "48"]) == 0
    assert calls[-1][-2:] == ["--sizes", "48"] and calls[-1][3:-2] == registry.QUICK["cpu_inference"]
    capsys.readouterr()
    for argv, needle in ((["bench", "host_overhead", "padding", "--threads", "1"], "need exactly one benchmark name"),
                         (["bench", "--threads", "1"], "unknown benchmark '1'")):  # the option's value as a name
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert needle in err and err.count("\n") == 0, err
    assert len(calls) == 2
    assert main(["info", "--no-such-option"]) == 2
    assert "unrecognized arguments: --no-such-option" in capsys.readouterr().err

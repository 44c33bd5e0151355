"""``benchmarks/gpu_check.sh`` without a GPU: it parses, its step limits fit the 8-minute budget its header
states, and every command it would run names a test file or a module that exists and accepts the flags it is
given (its dry run, ``GPU_CHECK_DRY_RUN=1``, prints each step instead of running it), so a typo cannot waste
the next GPU session."""

import argparse
import importlib
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import gpu_targets

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
BUDGET_S = 480

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


@pytest.fixture(scope="module")
def steps(tmp_path_factory) -> list[tuple[str, int, list[str]]]:
    """(name, limit s, argv) of every step of the dry run, in order."""
    out = tmp_path_factory.mktemp("gpu_check")
    env = dict(os.environ, GPU_CHECK_DRY_RUN="1", LF_PYTHON=sys.executable)
    proc = subprocess.run(["bash", str(SCRIPT), str(out)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    parsed = []
    for line in proc.stdout.splitlines():
        name, limit, *argv = shlex.split(line)
        parsed.append((name, int(limit), [a.replace(str(out), "OUTDIR") for a in argv]))
    return parsed


def test_the_script_parses():
    proc = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_limits_fit_the_budget_the_header_states(steps):
    header = [line for line in SCRIPT.read_text().splitlines() if line.startswith("#")]
    total = sum(limit for _, limit, _ in steps)
    assert total <= BUDGET_S, [(n, lim) for n, lim, _ in steps]
    stated = re.search(r"step limits below sum to (\d+) s <= (\d+) s", "\n".join(header))
    assert stated and int(stated.group(2)) == BUDGET_S and "8 minutes" in "\n".join(header)
    listed = {m.group(1): int(m.group(2)) for m in (re.match(r"#\s+\d+\.\s+(\w+)\s+(\d+) s \(est\.\s+\d+\)", h)
                                                     for h in header) if m}
    assert int(stated.group(1)) == sum(listed.values())  # the stated sum is the listed limits' sum
    assert {n: lim for n, lim, _ in steps}.items() <= listed.items()  # every step listed with its limit
    assert total == sum(listed.values()) or "census_tests" not in {n for n, _, _ in steps}


def test_order_tests_first_table_last(steps):
    names = [n for n, _, _ in steps]
    assert names[:2] == ["machine", "triton_tests"] and names[-1] == "gpu_targets"
    assert len(set(names)) == len(names)


def test_pytest_steps_name_existing_files_and_markers(steps):
    markers = (ROOT / "pyproject.toml").read_text()
    for name, _, argv in steps:
        if argv[1:3] != ["-m", "pytest"]:
            continue
        files = [a for a in argv if a.startswith("tests/")]
        assert files and all((ROOT / f).is_file() for f in files), (name, files)
        if "-m" in argv[3:]:
            marker = argv[3:][argv[3:].index("-m") + 1]
            assert f'"{marker}:' in markers, marker
        if name == "triton_tests":
            assert {"tests/models/test_cuda_graph.py", "tests/ops/test_kernel_triton.py",
                    "tests/ops/test_newton_schulz_triton.py"} <= set(files)
            assert "TRITON_INTERPRET" not in " ".join(argv)


class _Parsed(Exception):
    pass


def _parsed_args(module: str, argv: list[str], monkeypatch) -> argparse.Namespace:
    """The Namespace ``module.main(argv)`` parses (it stops there: nothing is run)."""
    original = argparse.ArgumentParser.parse_args

    def parse_only(self, args=None, namespace=None):
        raise _Parsed(original(self, args, namespace))

    with monkeypatch.context() as m:
        m.setattr(argparse.ArgumentParser, "parse_args", parse_only)
        with pytest.raises(_Parsed) as caught:
            importlib.import_module(module).main(argv)
    return caught.value.args[0]


def test_every_module_accepts_its_flags(steps, monkeypatch):
    modules = []
    for name, _, argv in steps:
        if argv[1] == "-m" and argv[2].startswith(("laplacianformer.bench.", "benchmarks.")):
            args = _parsed_args(argv[2], argv[3:], monkeypatch)
            modules.append(argv[2])
            if hasattr(args, "device"):
                assert args.device == "cuda", name
    assert {"laplacianformer.bench.gpu_overhead", "laplacianformer.bench.model_throughput",
            "laplacianformer.bench.stage_attention", "benchmarks.gpu_micro",
            "laplacianformer.bench.attention_scaling", "benchmarks.gpu_targets"} <= set(modules)


def test_steps_write_every_file_the_table_reads(steps):
    written = {Path(a).name + ".json" for _, _, argv in steps for flag, a in zip(argv, argv[1:]) if flag == "--out"}
    assert set(gpu_targets.GPU_CHECK_FILES) <= written
    (table,) = [argv for name, _, argv in steps if name == "gpu_targets"]
    assert table[table.index("--measured") + 1] == "OUTDIR"


def test_the_machine_step_stops_without_cuda():
    """The script's inline machine check (its heredoc) imports what it needs and refuses a machine without CUDA."""
    text = SCRIPT.read_text()
    code = text.split("<<'PY'\n", 1)[1].split("\nPY\n", 1)[0]
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-"], input=code, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "no CUDA device visible" in proc.stderr
    assert '"cuda_available": false' in proc.stdout

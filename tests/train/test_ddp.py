"""DDP (issue 4.4): two CPU processes (gloo on 127.0.0.1) train a few steps and end with identical weights."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import torch

from train_helpers import cli_env

WORKER = r"""
import json, sys, torch
sys.path.insert(0, {helpers!r})
from train_helpers import tiny_config
from laplacianformer.train import Trainer
t = Trainer(tiny_config({out!r}, epochs=2, max_steps=6, drop_path=0.1, mixup=0.8))
init = {{k: v.clone() for k, v in t.model.state_dict().items()}}
r = t.fit()
torch.save({{"final": t.model.state_dict(), "init": init, "rank": t.dist.rank, "world": t.dist.world_size,
            "steps": r["steps"], "top1": r["top1"]}}, {out!r} + f"/rank{{t.dist.rank}}.pt")
t.close()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_cpu_ranks_end_with_identical_weights(tmp_path):
    code = WORKER.format(helpers=str(Path(__file__).parent), out=str(tmp_path))
    port = _free_port()
    procs = []
    for rank in range(2):
        env = cli_env()
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                   WORLD_SIZE="2")
        procs.append(subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out
    r0 = torch.load(tmp_path / "rank0.pt", weights_only=True)
    r1 = torch.load(tmp_path / "rank1.pt", weights_only=True)
    assert (r0["rank"], r1["rank"], r0["world"]) == (0, 1, 2)
    assert r0["steps"] == r1["steps"] == 6
    assert r0["top1"] == r1["top1"]
    for k in r0["final"]:
        assert torch.equal(r0["init"][k], r1["init"][k]), k
        assert torch.equal(r0["final"][k], r1["final"][k]), k
    assert any(not torch.equal(r0["init"][k], r0["final"][k]) for k in r0["final"])
    rows = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 7))
    assert json.loads((tmp_path / "summary.json").read_text())["eval_n"] == 128

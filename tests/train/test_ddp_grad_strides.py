"""DDP without the stride warning (issue 43 item 6): two gloo ranks (as torchrun starts them) train the model
and print no "Grad strides do not match bucket view strides": every gradient, the depthwise convs' included,
comes out with its parameter's strides, which DDP's bucket views take (layers/grid_conv.py)."""

from __future__ import annotations

import socket
import subprocess
import sys

import torch

from train_helpers import TINY_MODEL, cli_env


# one rank as torchrun starts it (env://): the model of the training tests, DDP as train/engine.py wraps it
WORKER = """
import torch, torch.distributed as dist
from laplacianformer import create_model
dist.init_process_group("gloo")
torch.manual_seed(0)
model = create_model("laplacianformer_micro", num_classes=3, **{model!r})
net = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
torch.manual_seed(1 + dist.get_rank())
for _ in range(2):
    net(torch.randn(4, 3, 16, 16)).square().mean().backward()
    opt.step()
    opt.zero_grad()
print(sum(p.double().sum().item() for p in model.parameters()))
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_gradients_have_their_parameters_strides():
    from laplacianformer import create_model

    model = create_model("laplacianformer_micro", num_classes=3, **TINY_MODEL)
    model(torch.randn(2, 3, 16, 16)).sum().backward()
    bad = {n: (p.stride(), p.grad.stride()) for n, p in model.named_parameters() if p.grad.stride() != p.stride()}
    assert not bad


def test_two_gloo_ranks_train_without_the_grad_strides_warning():
    port = _free_port()
    procs = []
    for rank in range(2):
        env = cli_env()
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
        procs.append(subprocess.Popen([sys.executable, "-W", "always", "-c", WORKER.format(model=TINY_MODEL)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=120)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out
        assert "Grad strides do not match" not in out, out
    assert outs[0].splitlines()[-1] == outs[1].splitlines()[-1], outs  # the ranks agree

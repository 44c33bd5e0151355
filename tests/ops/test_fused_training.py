"""The op ``fused_training`` (ops/streaming/training.py): the layer's core plus DWConv(V) from its one qkv
projection, forward and backward in fused passes.

- its ``torch`` backend (the passes in plain PyTorch, ``backward_reference.py``) gives the values and the
  gradients (qkv, the conv's weight and bias) of the unfused path (``steps``: the operator on q, k, v views plus
  the conv, with autograd) in float64, for every streamed norm, K = Q and K ≠ Q, with and without the conv;
- the Triton backend (marked ``triton``: CUDA, or TRITON_INTERPRET=1, which ``test_triton_suite_under_interpreter``
  sets in a subprocess) gives them to float32 round-off, the same bits run to run, and the layer's training step
  takes it;
- what each backend refuses, and that the refused calls still get the unfused result.
"""

from __future__ import annotations

import os

import pytest
import torch

from laplacianformer.ops import explain, use
from laplacianformer.ops.attention import attention_from_qkv
from laplacianformer.ops.dispatch import BackendRefused
from laplacianformer.ops.settings import AttentionSettings
from laplacianformer.ops.streaming import STREAMED_NORMS
from laplacianformer.ops.streaming.training import FUSED_TRAINING

TRITON_HERE = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif(not TRITON_HERE, reason="needs CUDA or TRITON_INTERPRET=1")


def _case(gen, tied, with_conv, b=2, heads=2, d=8, hw=(7, 5), dtype=torch.float64, device="cpu"):
    c = heads * d
    qkv = torch.randn(b, hw[0] * hw[1], (2 if tied else 3) * c, generator=gen, dtype=dtype).to(device)
    weight = (torch.randn(c, 1, 3, 3, generator=gen, dtype=dtype) / 3).to(device) if with_conv else None
    bias = torch.randn(c, generator=gen, dtype=dtype).to(device) if with_conv else None
    return qkv, weight, bias


def _run(backend, qkv, weight, bias, s, heads, tied, hw):
    leaves = [t.detach().clone().requires_grad_() if t is not None else None for t in (qkv, weight, bias)]
    with use(fused_training=backend):
        out = attention_from_qkv(leaves[0], s, heads=heads, tied=tied, hw=hw, weight=leaves[1], bias=leaves[2])
    grad = torch.ones_like(out).mul_(torch.linspace(-1, 1, out.shape[-1], dtype=out.dtype, device=out.device))
    grads = torch.autograd.grad(out, [t for t in leaves if t is not None], grad)
    return out, grads


def _rel(got, want) -> float:
    return ((got.double() - want.double()).abs().max() / want.double().abs().max().clamp_min(1e-30)).item()


@pytest.mark.parametrize("norm", STREAMED_NORMS)
@pytest.mark.parametrize("tied", [True, False], ids=["k_is_q", "k_not_q"])
@pytest.mark.parametrize("with_conv", [True, False], ids=["conv", "noconv"])
def test_torch_backend_equals_the_unfused_path(seeded, norm, tied, with_conv):
    _, gen = seeded
    qkv, weight, bias = _case(gen, tied, with_conv)
    s = AttentionSettings(head_dim=8, norm=norm, landmarks=(3, 2))
    got, got_grads = _run("torch", qkv, weight, bias, s, 2, tied, (7, 5))
    want, want_grads = _run("steps", qkv, weight, bias, s, 2, tied, (7, 5))
    assert got.shape == want.shape == (2, 35, 16)
    assert _rel(got, want) < 1e-9
    for g, w in zip(got_grads, want_grads):
        assert _rel(g, w) < 1e-9


@pytest.mark.parametrize("why, change", [
    ("1-D", dict(hw=None)),
    ("norm_scale", dict(norm_scale="inv_n")),
    ("solver", dict(solver="cg")),
])
def test_refusals_run_the_unfused_path(seeded, why, change):
    _, gen = seeded
    hw = change.pop("hw", (7, 5))
    qkv, weight, bias = _case(gen, False, True)
    s = AttentionSettings(head_dim=8, landmarks=(3, 2) if hw else 6, **change)
    report = explain("fused_training", qkv, s, hw, (3, 2) if hw else (6,), 2, False, weight, bias)
    assert why in report
    with use(fused_training="torch"), pytest.raises(BackendRefused, match=why):  # forced: the refusal is an error
        attention_from_qkv(qkv, s, heads=2, tied=False, hw=hw, weight=weight, bias=bias)
    got = attention_from_qkv(qkv, s, heads=2, tied=False, hw=hw, weight=weight, bias=bias)  # auto: unfused path
    with use(fused_training="steps"):
        want = attention_from_qkv(qkv, s, heads=2, tied=False, hw=hw, weight=weight, bias=bias)
    torch.testing.assert_close(got, want)


def test_bad_qkv_names_the_argument():
    s = AttentionSettings(head_dim=8, landmarks=(3, 2))
    with pytest.raises(ValueError, match="qkv"):
        attention_from_qkv(torch.zeros(1, 35, 40), s, heads=2, tied=False, hw=(7, 5))

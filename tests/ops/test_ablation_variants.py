"""The ablation-only variants (issue 40 item 4; docs/DESIGN.md §3, §4.4, §6.3): the norms "rowsum", "none" and
"injective_nomean", the solvers "cg" and "exact" and ``ns_backward="unrolled"`` run the reference / step path,
through the op and through the layer, forward and backward, with the values of the reference backends; every fused
backend (normalization's triton / cpu / fused, the streaming passes, the fused landmark solve, fused training)
declares them unsupported, and ``explain`` names why."""

from __future__ import annotations

import pytest
import torch

from laplacianformer.layers import LaplacianAttention
from laplacianformer.ops import explain, use
from laplacianformer.ops.dispatch import BackendRefused
from laplacianformer.ops.attention import laplacian_attention
from laplacianformer.ops.settings import AttentionSettings
from laplacianformer.ops.validation import (NORMS, NS_BACKWARDS, SHIPPED_NORMS, SHIPPED_NS_BACKWARDS,
                                            SHIPPED_SOLVERS, SOLVERS)

ABLATIONS = ([("norm", n) for n in NORMS if n not in SHIPPED_NORMS]
             + [("solver", s) for s in SOLVERS if s not in SHIPPED_SOLVERS]
             + [("ns_backward", b) for b in NS_BACKWARDS if b not in SHIPPED_NS_BACKWARDS])
"""(setting, value) of every variant outside the shipped configurations, from the single lists of validation.py."""
FORMS = {"norm": ("fused", "streaming", "fused training"), "solver": ("fused solve", "fused training"),
         "ns_backward": ("fused training",)}
"""The forms of the fused backends whose declarations name each setting (``Serves.form``)."""


def test_the_ablations_are_the_known_six():
    assert sorted(ABLATIONS) == sorted([("norm", "rowsum"), ("norm", "none"), ("norm", "injective_nomean"),
                                        ("solver", "cg"), ("solver", "exact"), ("ns_backward", "unrolled")])


def _qkv(gen, n=36, d=8):
    return [torch.randn(2, 2, n, d, generator=gen, dtype=torch.float64).requires_grad_() for _ in range(3)]


@pytest.mark.parametrize("key,value", ABLATIONS, ids=[f"{k}={v}" for k, v in ABLATIONS])
def test_each_variant_runs_through_the_op_as_the_reference(seeded, key, value):
    """Forward and backward of the operator under automatic selection equal the all-reference run (float64)."""
    _, gen = seeded
    q, k, v = _qkv(gen)
    kwargs = dict(hw=(6, 6), landmarks=(3, 3), **{key: value})
    out = laplacian_attention(q, k, v, **kwargs)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    with use(reference=True):
        want = laplacian_attention(q, k, v, **kwargs)
        want_grads = torch.autograd.grad(want.square().sum(), (q, k, v))
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, want, rtol=1e-9, atol=1e-10)
    for g, w in zip(grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("key,value", ABLATIONS, ids=[f"{k}={v}" for k, v in ABLATIONS])
def test_each_variant_runs_through_the_layer(seeded, key, value):
    """``LaplacianAttention`` with the variant: training (forward + backward) and inference equal the all-reference
    run of the same module."""
    _, gen = seeded
    torch.manual_seed(0)
    layer = LaplacianAttention(16, 2, landmarks=(3, 3), **{key: value}).double()
    x = torch.randn(2, 36, 16, generator=gen, dtype=torch.float64).requires_grad_()
    out = layer(x, (6, 6))
    (dx,) = torch.autograd.grad(out.square().sum(), x)
    with torch.no_grad():
        infer = layer(x, (6, 6))
    with use(reference=True):
        want = layer(x, (6, 6))
        (want_dx,) = torch.autograd.grad(want.square().sum(), x)
    torch.testing.assert_close(out, want, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(infer, want.detach(), rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(dx, want_dx, rtol=1e-8, atol=1e-10)


def _reasons(key: str, value: str, gen) -> dict[str, str]:
    """explain() of every fused op the variant's setting reaches, for float32 inputs the fused backends would
    otherwise take (a 6×6 grid, 3×3 landmarks, d = e = 8)."""
    s = AttentionSettings(head_dim=8, landmarks=(3, 3), **{key: value})
    q, k, v = (torch.randn(1, 2, 36, 8, generator=gen) for _ in range(3))
    marks = torch.randn(1, 2, 9, 8, generator=gen)
    w_inv = torch.eye(9).expand(1, 2, 9, 9)
    qkv = torch.randn(1, 36, 48, generator=gen)
    weight, bias = torch.randn(16, 1, 3, 3, generator=gen), torch.randn(16, generator=gen)
    texts = {"fused training": explain("fused_training", qkv, s, (6, 6), (3, 3), 2, False, weight, bias)}
    if key == "norm":
        c = torch.rand(1, 2, 36, 9, generator=gen)
        texts["fused"] = explain("normalization", c, c, v, value, 1e-6, None)
        texts["streaming"] = explain("streaming", q, k, v, marks, w_inv, s, None)
    if key == "solver":
        texts["fused solve"] = explain("landmark_solve", q, k, v, (6, 6), (3, 3), s, None, 0)
    return texts


@pytest.mark.parametrize("key,value", ABLATIONS, ids=[f"{k}={v}" for k, v in ABLATIONS])
def test_explain_names_why_the_fused_backends_refuse(seeded, key, value):
    _, gen = seeded
    texts = _reasons(key, value, gen)
    assert set(texts) == set(FORMS[key])
    for form, text in texts.items():
        fused = [line.strip() for line in text.splitlines()[1:]
                 if line.strip().split(":")[0] in ("triton", "cpu", "fused", "torch")]
        assert fused, text
        for line in fused:
            assert f"{key} {value!r} has no {form} form (only [" in line, (form, line)
        assert "selection 'auto' runs" in text.splitlines()[0]


@pytest.mark.parametrize("key,value", [("norm", "rowsum"), ("solver", "cg")])
def test_forcing_a_fused_backend_on_an_ablation_raises_the_reason(seeded, monkeypatch, key, value):
    """A forced fused backend refuses the variant with its declaration's words (devices aside: the interpreter)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    _, gen = seeded
    s = AttentionSettings(head_dim=8, landmarks=(3, 3), **{key: value})
    q, k, v = (torch.randn(1, 2, 36, 8, generator=gen) for _ in range(3))
    op, inputs, form = (("streaming", (q, k, v, torch.randn(1, 2, 9, 8), torch.eye(9).expand(1, 2, 9, 9), s, None),
                         "streaming") if key == "norm"
                        else ("landmark_solve", (q, k, v, (6, 6), (3, 3), s, None, 0), "fused solve"))
    for backend in ("triton", "torch"):
        with use(**{op: backend}), pytest.raises(BackendRefused, match=f"{key} '{value}' has no {form} form"):
            from laplacianformer.ops.dispatch import get_op

            get_op(op)(*inputs)

"""The layer's DWConv(V) fused into the streaming output pass (``LaplacianAttention._attend_value_conv`` ->
``ops.attention.attention_with_value_conv``; docs/KERNELS.md, "The streaming passes").

- CPU eager inference (no interpreter) takes the steps: the registry runs 'steps' (with the C grid loops of
  ``ops/grid_cpu.py`` for the pooling and the conv) and the output equals the unfused path's (what a call with
  autograd computes) to float rounding, in float64 to 1e-12; masks, prefix tokens, training, TorchScript and
  torch.fx never reach the fused call;
- under Triton (CUDA, or TRITON_INTERPRET=1, which ``test_triton_suite_under_interpreter`` sets in a subprocess)
  the fused output (no conv op runs outside the passes; for K ≠ Q, q and k strided views of one product)
  equals the unfused path and the float64 layer, on grids that are not square, tiny grids, a 1-D sequence,
  several heads, both norms the passes serve (the shipped ones), K = Q and K ≠ Q, with and without the conv's bias, both kernels.
"""

from __future__ import annotations

import os

import pytest
import torch

from laplacianformer.layers import LaplacianAttention, laplacian_attention
from laplacianformer.ops import _runtime, use

TRITON_HERE = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif(not TRITON_HERE, reason="needs CUDA or TRITON_INTERPRET=1")


def _layer(heads, norm="injective", tie_qk=False, landmarks=(3, 4), bias=True, kernel="laplacian", seed=0):
    torch.manual_seed(seed)
    layer = LaplacianAttention(8 * heads, heads, norm=norm, tie_qk=tie_qk, landmarks=landmarks, kernel=kernel).eval()
    with torch.no_grad():
        layer.dwconv.weight.normal_()  # a conv term of the heads' size
        if bias:
            layer.dwconv.bias.normal_()
        else:
            layer.dwconv.bias = None
    return layer


def _tokens(n, c, seed=1):
    return torch.randn(1, n, c, generator=torch.Generator().manual_seed(seed))


def _unfused(layer, x, hw):
    """The path of a call with autograd: attend, then the conv, the heads added out of place (today's code)."""
    with torch.enable_grad():
        return layer(x, hw).detach()


def _rel(a, b) -> float:
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


# --- the CPU keeps the old computation ---------------------------------------------------------------------


@pytest.mark.parametrize("hw,landmarks,tie", [((9, 13), (3, 4), False), ((1, 7), (1, 3), True), (None, 5, False),
                                              ((2, 3), (7, 7), True)], ids=["9x13", "1x7", "1d", "2x3-exact"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cpu_inference_equals_the_unfused_path(monkeypatch, hw, landmarks, tie, dtype):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(laplacian_attention, "ONE_PRODUCT_MIN_WIDTH", 16)  # this layer's width: the one product
    monkeypatch.setattr(LaplacianAttention, "_project_qk_stacked", None)  # the Triton devices' projection
    project, products = LaplacianAttention._project_qkv, []
    monkeypatch.setattr(LaplacianAttention, "_project_qkv", lambda self, t: products.append(1) or project(self, t))
    layer = _layer(2, tie_qk=tie, landmarks=landmarks, bias=not tie).to(dtype)
    x = _tokens(117 if hw in ((9, 13), None) else hw[0] * hw[1], 16).to(dtype)
    with torch.no_grad(), _runtime.recording() as calls:
        got = layer(x, hw)
    assert products == [1]  # the CPU: q, k and v strided views of one product
    streaming = [text for op, _, text in calls if op == "streaming"]
    if landmarks != (7, 7):  # the 2×3 grid with 7×7 landmarks is the exact kernel: no streaming call
        assert len(streaming) == 1 and streaming[0].startswith("streaming: selection 'auto' runs 'steps'"), streaming
        assert dtype == torch.float64 or "triton: tensors on ['cpu'], not cuda" in streaming[0], streaming[0]
    assert _rel(got, _unfused(layer, x, hw)) < (1e-5 if dtype == torch.float32 else 1e-12)


@pytest.mark.parametrize("dim,products", [(32, 0), (256, 1)])
def test_narrow_layers_project_three_times_and_wide_ones_once(monkeypatch, dim, products):
    """CPU inference: one qkv product from ``ONE_PRODUCT_MIN_WIDTH`` (256) up, three contiguous ones below; the
    same output either way."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    project, calls = LaplacianAttention._project_qkv, []
    monkeypatch.setattr(LaplacianAttention, "_project_qkv", lambda self, t: calls.append(1) or project(self, t))
    torch.manual_seed(0)
    layer = LaplacianAttention(dim, 4, landmarks=(3, 3)).eval()
    x = _tokens(64, dim)
    with torch.no_grad():
        got = layer(x, (8, 8))
    assert len(calls) == products
    assert _rel(got, _unfused(layer, x, (8, 8))) < 1e-5


@pytest.mark.parametrize("tie", [False, True])
def test_one_qkv_product(tie):
    """q, k and v from one product with the whole ``qkv`` weight: strided views (row stride 3C, 2C with tied
    keys) equal to the separate products of ``_project_qk`` and ``_project_v``."""
    torch.manual_seed(0)
    layer = LaplacianAttention(24, 3, tie_qk=tie).eval()
    x = _tokens(10, 24)
    with torch.no_grad():
        q, k, v = layer._project_qkv(x)
        q2, k2 = layer._project_qk(x)
        v2 = layer._project_v(x)
    width = 24 * (2 if tie else 3)
    assert q.stride() == (10 * width, 8, width, 1) and v.stride() == (10 * width, width, 1)
    assert (k is q) == tie and v.data_ptr() == q.data_ptr() + (width - 24) * 4
    for got, want in ((q, q2), (k, k2), (v, v2)):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("qk_norm", [False, True])
def test_stacked_qk_product(qk_norm):
    """q and k from one product with the stacked row blocks: strided views (row stride 2C) equal to the two
    products of ``_project_qk``."""
    torch.manual_seed(0)
    layer = LaplacianAttention(24, 3, qk_norm=qk_norm).eval()
    x = _tokens(10, 24)
    with torch.no_grad():
        q, k = layer._project_qk_stacked(x)
        q2, k2 = layer._project_qk(x)
    assert q.shape == k.shape == (1, 3, 10, 8)
    if not qk_norm:
        assert q.stride() == k.stride() == (10 * 48, 8, 48, 1) and k.data_ptr() == q.data_ptr() + 24 * 4
    torch.testing.assert_close(q, q2, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(k, k2, rtol=1e-6, atol=1e-6)


class _OnGrid(torch.nn.Module):
    def __init__(self, attn):
        super().__init__()
        self.attn = attn

    def forward(self, x):
        return self.attn(x, hw=(5, 8))


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
def test_other_calls_never_reach_the_fused_call(monkeypatch):
    """A padding mask, prefix tokens, autograd, TorchScript, torch.fx: the layer's old path (the fused call is
    made to fail here); equal to the eager inference call (which runs the C grid loops) to float rounding."""
    from laplacianformer.layers import laplacian_attention as la

    def fail(*args, **kwargs):
        raise AssertionError("attention_with_value_conv called")

    x = _tokens(40, 16)
    layer = _layer(2, landmarks=4)
    mask = torch.zeros(1, 40, dtype=torch.bool)
    mask[:, 30:] = True
    with torch.no_grad():
        want = [layer(x, None, mask), layer(x, (5, 8))]
    torch.manual_seed(0)
    with_prefix = LaplacianAttention(16, 2, num_prefix_tokens=1, landmarks=(2, 2)).eval()
    monkeypatch.setattr(la, "attention_with_value_conv", fail)
    with torch.no_grad():
        assert torch.equal(layer(x, None, mask), want[0])
        with_prefix(_tokens(37, 16), (6, 6))
        scripted = torch.jit.script(layer)
        torch.testing.assert_close(scripted(x, (5, 8)), want[1], rtol=1e-5, atol=1e-6)
        traced = torch.fx.symbolic_trace(_OnGrid(layer))
        torch.testing.assert_close(traced(x), want[1], rtol=1e-5, atol=1e-6)
    layer(x, (5, 8)).sum().backward()  # training


# --- the fused output pass (Triton) --------------------------------------------------------------------------

# (hw, landmarks, heads, norm, tie_qk, bias, kernel): every norm of the passes, K = Q and K ≠ Q, bias or not
FUSED_CASES = [
    ((9, 13), (3, 4), 3, "injective", False, True, "laplacian"),
    ((9, 13), (2, 3), 2, "inline", True, False, "laplacian"),
    ((2, 3), (1, 2), 2, "inline", True, True, "laplacian"),
    ((1, 7), (1, 3), 1, "injective", False, False, "laplacian"),
    ((5, 7), (2, 2), 2, "inline", False, True, "laplacian"),
    ((5, 7), (2, 3), 2, "injective", True, True, "gaussian"),
    (None, 5, 2, "inline", False, True, "laplacian"),  # 1-D: the (1, N) grid; the landmarks by the steps
]


@pytest.mark.triton
@needs_triton
@pytest.mark.parametrize("case", FUSED_CASES, ids=lambda c: f"{'1d' if c[0] is None else '%dx%d' % c[0]}-{c[3]}"
                         f"-h{c[2]}-{'tied' if c[4] else 'untied'}-{'bias' if c[5] else 'nobias'}-{c[6]}")
def test_fused_layer_equals_unfused_and_float64(monkeypatch, case):
    from laplacianformer.ops import nystrom

    hw, landmarks, heads, norm, tie, bias, kernel = case
    layer = _layer(heads, norm, tie, landmarks, bias, kernel)
    x = _tokens(40 if hw is None else hw[0] * hw[1], 8 * heads)
    with torch.no_grad():
        want = layer.double()(x.double(), hw)
    layer.float()
    unfused = _unfused(layer, x, hw)
    layer, xd = layer.to(DEVICE), x.to(DEVICE)

    def no_conv_outside(*args, **kwargs):
        raise AssertionError("the conv ran outside the output pass")

    monkeypatch.setattr(nystrom, "add_value_conv", no_conv_outside)
    stacked = []
    project = LaplacianAttention._project_qk_stacked
    monkeypatch.setattr(LaplacianAttention, "_project_qk_stacked", lambda self, t: stacked.append(1) or project(self, t))
    forced = dict(streaming="triton", landmark_solve="triton" if hw is not None else "auto")
    with torch.no_grad(), use(**forced), _runtime.recording() as calls:
        got = layer(xd, hw).cpu()
    assert [op for op, _, _ in calls][-1] == "streaming", calls
    assert len(stacked) == (0 if tie else 1)  # K ≠ Q: q and k strided views of one product
    scale = want.abs().max().item()
    assert _rel(got, want) < 2e-5, f"fused vs float64: {_rel(got, want):.2e}"
    assert (got - unfused).abs().max().item() / scale < 5e-5, (got - unfused).abs().max().item() / scale


def test_triton_suite_under_interpreter(triton_interpreter):
    if TRITON_HERE:
        pytest.skip("the Triton tests run in this process")
    pytest.importorskip("triton")
    triton_interpreter("tests/layers/test_fused_value_conv.py", timeout=300.0)


def test_cpu_autocast_inference_takes_the_unfused_path_with_float32_conv_weights():
    """Under CPU bf16 autocast V comes from a bf16 product while the conv's parameters stay float32 (autocast
    casts them in the conv): the inference call accepts that and equals the call with autograd on."""
    layer = _layer(2)
    x = _tokens(12 * 10, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.no_grad():
            fast = layer(x, (12, 10))
        ref = layer(x, (12, 10)).detach()
    assert fast.dtype == ref.dtype and torch.equal(fast, ref)

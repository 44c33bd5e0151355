"""The op ``fused_training`` (ops/streaming/training.py): the layer's core plus DWConv(V) from its one qkv
projection, forward and backward in fused passes.

- its ``torch`` backend (the passes in plain PyTorch, ``backward_reference.py``) gives the values and the
  gradients (qkv, the conv's weight and bias) of the unfused path (``steps``: the operator on q, k, v views plus
  the conv, with autograd) in float64, for every streamed norm, K = Q and K ≠ Q, with and without the conv;
- the Triton backend (marked ``triton``: CUDA, or TRITON_INTERPRET=1, which ``test_triton_suite_under_interpreter``
  sets in a subprocess) gives them to float32 round-off (the Laplacian and the Gaussian on every norm, a K ≠ Q
  injective case with the conv for each other kernel family of the Triton profile), the same bits run to run, and
  the layer's training step takes it;
- what each backend refuses, and that the refused calls still get the unfused result.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from laplacianformer.ops import explain, use
from laplacianformer.ops.kernel.limits import TRITON_KERNEL_IDS
from laplacianformer.ops.kernel_families import KERNEL_FAMILIES
from laplacianformer.ops.attention import attention_from_qkv
from laplacianformer.ops.dispatch import BackendRefused
from laplacianformer.ops.settings import AttentionSettings
from laplacianformer.ops.streaming import STREAMED_NORMS

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
    # a fixed random output gradient (one the same for every row would leave dq = 0 for the centred norms)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    grads = torch.autograd.grad(out, [t for t in leaves if t is not None], grad.to(out.dtype).to(out.device))
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


@pytest.mark.parametrize("norm", ["injective"])  # the whitened streamed norm: α scales it
@pytest.mark.parametrize("norm_scale", ["inv_sqrt_n", "inv_n"])
def test_torch_backend_with_the_output_scale_equals_the_unfused_path(seeded, norm, norm_scale):
    """The §4.6 scale α = N^-p runs inside the fused passes (M = α W⁺ M', dM = α cᵀ G), the same values and
    gradients as the unfused path's post-op."""
    _, gen = seeded
    qkv, weight, bias = _case(gen, False, True)
    s = AttentionSettings(head_dim=8, norm=norm, landmarks=(3, 2), norm_scale=norm_scale)
    got, got_grads = _run("torch", qkv, weight, bias, s, 2, False, (7, 5))
    want, want_grads = _run("steps", qkv, weight, bias, s, 2, False, (7, 5))
    assert _rel(got, want) < 1e-9
    for g, w in zip(got_grads, want_grads):
        assert _rel(g, w) < 1e-9


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("autocast", [False, True], ids=["plain", "autocast"])
def test_torch_backend_reads_half_precision(seeded, dtype, autocast):
    """Half qkv (and under CPU autocast): the torch backend computes in float32 from the half values, as the
    unfused path does (docs/DESIGN.md §1.3); output and gradients in qkv's dtype, equal up to half rounding."""
    _, gen = seeded
    qkv, weight, bias = _case(gen, True, True)
    s = AttentionSettings(head_dim=8, landmarks=(3, 2), norm_scale="inv_n")
    qkv = qkv.to(dtype)
    weight, bias = (weight.float(), bias.float()) if autocast else (weight.to(dtype), bias.to(dtype))  # .half()
    with torch.autocast("cpu", dtype=dtype, enabled=autocast):
        got, got_grads = _run("torch", qkv, weight, bias, s, 2, True, (7, 5))
        want, want_grads = _run("steps", qkv, weight, bias, s, 2, True, (7, 5))
    assert got.dtype == dtype and got_grads[0].dtype == dtype and got_grads[1].dtype == weight.dtype
    tol = 2e-2 if dtype == torch.bfloat16 else 4e-3
    assert _rel(got, want) < tol
    for g, w in zip(got_grads, want_grads):
        assert _rel(g, w) < 2 * tol


@pytest.mark.parametrize("why, change", [
    ("1-D", dict(hw=None)),
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


# --- the Triton backend (CUDA, or the interpreter) --------------------------------------------------------

# (norm, tied, conv, kernel, b, heads, d, hw, grid): N = 70 (3 tiles, not a multiple of 32) or 96; m 6 – 16
TRITON_CASES = [
    ("injective", False, True, "laplacian", 2, 2, 16, (10, 7), (3, 2)),
    ("injective", True, False, "gaussian", 1, 2, 12, (8, 12), (4, 4)),
    ("inline", False, False, "laplacian", 1, 1, 16, (10, 7), (3, 3)),
    ("inline", True, True, "laplacian", 2, 1, 16, (10, 7), (3, 2)),
    ("inline", False, True, "gaussian", 1, 2, 8, (10, 7), (2, 3)),
    ("injective", True, False, "laplacian", 1, 1, 16, (8, 12), (3, 3)),
] + [("injective", False, True, spec.name, 1, 1, 8, (8, 5), (3, 2)) for spec in KERNEL_FAMILIES.values()
     if spec.id in TRITON_KERNEL_IDS and not spec.exp_of_accumulation]  # every pass of the other families
# (dtype, norm_scale, case): half-precision qkv read as such, and the §4.6 output scale inside the passes
TRITON_VARIANT_CASES = [
    (torch.float32, "inv_n", TRITON_CASES[0]),
    (torch.bfloat16, "inv_n", TRITON_CASES[0]),
    (torch.float16, "one", TRITON_CASES[3]),
]


def _triton_case(gen, norm, tied, with_conv, kernel, b, heads, d, hw, grid):
    qkv, weight, bias = _case(gen, tied, with_conv, b=b, heads=heads, d=d, hw=hw)
    s = AttentionSettings(head_dim=d, norm=norm, kernel=kernel, landmarks=grid, iters=30)
    return qkv, weight, bias, s


@pytest.mark.triton
@needs_triton
@pytest.mark.parametrize("case", TRITON_CASES, ids=lambda c: f"{c[0]}-{'tied' if c[1] else 'untied'}"
                         f"-{'conv' if c[2] else 'noconv'}-{c[3]}")
def test_triton_equals_the_float64_passes(seeded, case):
    _, gen = seeded
    qkv, weight, bias, s = _triton_case(gen, *case)
    heads, tied, hw = case[5], case[1], case[7]
    f32 = lambda t: None if t is None else t.float().to(DEVICE)  # noqa: E731
    got, got_grads = _run("triton", f32(qkv), f32(weight), f32(bias), s, heads, tied, hw)
    want, want_grads = _run("torch", qkv, weight, bias, s, heads, tied, hw)
    assert _rel(got.cpu(), want) < 1e-4
    dqkv, dqkv_want = got_grads[0].cpu(), want_grads[0]
    c = dqkv.shape[-1] // (2 if tied else 3)
    for part in range(dqkv.shape[-1] // c):  # dq, dk, dv each against its own scale
        cols = slice(part * c, (part + 1) * c)
        assert _rel(dqkv[..., cols], dqkv_want[..., cols]) < 2e-4, part
    for g, w in zip(got_grads[1:], want_grads[1:]):
        assert _rel(g.cpu(), w) < 2e-4


@pytest.mark.triton
@needs_triton
@pytest.mark.parametrize("variant", TRITON_VARIANT_CASES,
                         ids=lambda c: f"{str(c[0]).removeprefix('torch.')}-{c[1]}-{c[2][0]}")
def test_triton_variants_equal_the_float64_passes(seeded, variant):
    """Half-precision qkv read as they are (output and dq, dk, dv in their dtype, sums in float32) and the §4.6
    output scale inside the passes, against the float64 passes on the same (rounded) values."""
    dtype, norm_scale, case = variant
    _, gen = seeded
    qkv, weight, bias, s = _triton_case(gen, *case)
    s = dataclasses.replace(s, norm_scale=norm_scale)
    heads, tied, hw = case[5], case[1], case[7]
    qkv = qkv.to(dtype).double()  # the values the kernels read
    cast = lambda t: None if t is None else t.to(dtype).to(DEVICE)  # noqa: E731
    got, got_grads = _run("triton", cast(qkv), None if weight is None else weight.float().to(DEVICE),
                          None if bias is None else bias.float().to(DEVICE), s, heads, tied, hw)
    want, want_grads = _run("torch", qkv, weight, bias, s, heads, tied, hw)
    assert got.dtype == dtype and got_grads[0].dtype == dtype
    tol = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype]
    assert _rel(got.cpu(), want) < tol
    dqkv, dqkv_want = got_grads[0].cpu(), want_grads[0]
    c = dqkv.shape[-1] // (2 if tied else 3)
    for part in range(dqkv.shape[-1] // c):
        cols = slice(part * c, (part + 1) * c)
        assert _rel(dqkv[..., cols], dqkv_want[..., cols]) < 2 * tol, part
    for g, w in zip(got_grads[1:], want_grads[1:]):
        assert _rel(g.cpu(), w) < 2 * tol


@pytest.mark.triton
@needs_triton
def test_triton_forward_state_equals_the_reference(seeded):
    """``streaming_triton(save=True)``'s statistics equal ``backward_reference.forward_state`` (float64)."""
    from laplacianformer.ops.streaming.backward_reference import forward_state
    from laplacianformer.ops.streaming.landmarks import landmark_solve_reference
    from laplacianformer.ops.streaming.triton import streaming_triton

    _, gen = seeded
    for norm in STREAMED_NORMS:
        q, k, v = (torch.randn(2, 2, 70, 16, generator=gen, dtype=torch.float64) for _ in range(3))
        s = AttentionSettings(head_dim=16, norm=norm, landmarks=(3, 2), iters=30)
        marks, w, w_inv = landmark_solve_reference(q, (10, 7), (3, 2), s.bandwidth, s.kernel, s.ns_eps, s.iters)
        want = forward_state(q, k, v, marks, w, w_inv, s.bandwidth, s.kernel, norm, s.norm_eps)
        f32 = lambda t: t.float().to(DEVICE)  # noqa: E731
        _, got = streaming_triton(f32(q), f32(k), f32(v), f32(marks), f32(w_inv), s.bandwidth, s.kernel, norm,
                                  s.norm_eps, None, None, save=True)
        from laplacianformer.ops.streaming.limits import whitens
        names = ["m_prime", "v_sum", "c_mean", "k_mean"] + (["cov", "sp"] if whitens(norm) else [])
        for name in names:
            assert _rel(got[name].cpu(), getattr(want, name)) < 1e-5, (norm, name)


@pytest.mark.triton
@needs_triton
def test_triton_backward_is_deterministic(seeded):
    _, gen = seeded
    qkv, weight, bias, s = _triton_case(gen, "injective", False, True, "laplacian", 1, 1, 16, (10, 7), (3, 2))
    f32 = lambda t: t.float().to(DEVICE)  # noqa: E731
    first = _run("triton", f32(qkv), f32(weight), f32(bias), s, 1, False, (10, 7))
    second = _run("triton", f32(qkv), f32(weight), f32(bias), s, 1, False, (10, 7))
    assert torch.equal(first[0], second[0])
    assert all(torch.equal(a, b) for a, b in zip(first[1], second[1]))


@pytest.mark.triton
@needs_triton
@pytest.mark.parametrize("attn_preset", ["paper", "tuned"])
def test_layer_training_step_takes_the_fused_path(seeded, attn_preset):
    """A LaplacianAttention training step where Triton runs goes through ``fused_training`` (forced ``triton``, so a
    refusal would raise) and gives the parameter gradients of the unfused path (forced ``steps``)."""
    from laplacianformer.layers import ATTN_PRESETS, LaplacianAttention

    seed, _ = seeded
    torch.manual_seed(seed)
    layer = LaplacianAttention(32, num_heads=2, landmarks=(3, 2), **ATTN_PRESETS[attn_preset]).to(DEVICE)
    x = torch.randn(2, 70, 32, device=DEVICE)
    grads = {}
    for backend in ("triton", "steps"):
        layer.zero_grad()
        with use(fused_training=backend):
            layer(x, (10, 7)).square().mean().backward()
        grads[backend] = {name: p.grad.clone() for name, p in layer.named_parameters() if p.grad is not None}
    assert set(grads["triton"]) == set(grads["steps"]) and "dwconv.weight" in grads["triton"]
    for name, g in grads["triton"].items():
        assert _rel(g.cpu(), grads["steps"][name].cpu()) < 1e-3, name


def test_triton_suite_under_interpreter(triton_interpreter):
    if TRITON_HERE:
        pytest.skip("the Triton tests run in this process")
    pytest.importorskip("triton")
    # 220-300 s on the shared 2-core machine at load 6-8 (50-60 s of CPU): 600 s, not a hang
    triton_interpreter("tests/ops/test_fused_training.py", timeout=600.0)

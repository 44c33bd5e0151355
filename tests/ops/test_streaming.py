"""The op ``streaming`` (ops/streaming): the Nyström output of the core in fused passes over the rows.

- ``reference.py`` (backend ``torch``) equals the core's step path in float64 for every norm, K = Q and K ≠ Q,
  with and without a padding mask, through the one dispatch point of ``nystrom()``;
- the Triton passes (marked ``triton``: CUDA, or TRITON_INTERPRET=1, which ``test_triton_suite_under_interpreter``
  sets in a subprocess) equal the float64 reference to float32 round-off, are bitwise deterministic, and run
  the whole operator (bfloat16 inputs, computed in float32);
- the registry's refusals and explanations;
- the layer's DWConv(V) fused into the output pass (``conv``, ops/value_conv.py): the reference's term equals
  the conv as the layer computes it (float64, grids that are not square, 1-D), the Triton output equals it,
  and each condition that keeps the conv out of the passes is a refusal with its reason (the layer-level
  tests are tests/layers/test_fused_value_conv.py).
"""

from __future__ import annotations

import os

import pytest
import torch

from laplacianformer import laplacian_attention
from laplacianformer.ops import explain, use
from laplacianformer.ops.dispatch import BackendRefused
from laplacianformer.ops.kernel.limits import TRITON_KERNEL_IDS
from laplacianformer.ops.kernel_families import KERNEL_FAMILIES
from laplacianformer.ops.pooling import pool_landmarks
from laplacianformer.ops.settings import AttentionSettings
from laplacianformer.ops.streaming import STREAMED_NORMS, STREAMING, streaming_nystrom, streaming_nystrom_reference
from laplacianformer.ops.streaming.limits import scale_power, splits_for
from laplacianformer.ops.value_conv import ValueConv, add_value_conv, value_conv_heads

TRITON_HERE = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _qkv(gen, b, h, n, d, e, tied, dtype=torch.float64, device="cpu"):
    q = torch.randn(b, h, n, d, generator=gen, dtype=dtype).to(device)
    k = q if tied else torch.randn(b, h, n, d, generator=gen, dtype=dtype).to(device)
    v = torch.randn(b, h, n, e, generator=gen, dtype=dtype).to(device)
    return q, k, v


def _mask(b, n, device="cpu"):
    """The last sequence padded from 60 % of its length on (not a multiple of the 32-row tiles)."""
    mask = torch.zeros(b, n, dtype=torch.bool, device=device)
    mask[-1, (3 * n) // 5:] = True
    return mask


# --- the pass form equals the core (float64) ------------------------------------------------------------


@pytest.mark.parametrize("norm", STREAMED_NORMS)
@pytest.mark.parametrize("tied", [True, False], ids=["k_is_q", "k_not_q"])
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
def test_reference_equals_the_core(seeded, norm, tied, masked):
    """1-D sequences of 75 tokens (two splits of 32-row tiles and a partial one), 16 landmarks."""
    _, gen = seeded
    q, k, v = _qkv(gen, 2, 1, 75, 16, 8, tied)
    kwargs = dict(landmarks=16, norm=norm, key_padding_mask=_mask(2, 75) if masked else None)
    with use(streaming="steps"):
        want = laplacian_attention(q, k, v, **kwargs)
    with use(streaming="torch"):
        got = laplacian_attention(q, k, v, **kwargs)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kernel,norm_scale", [("laplacian", "inv_sqrt_n"), ("gaussian", "one")])
def test_reference_equals_the_core_on_a_grid(seeded, kernel, norm_scale):
    """2-D grid (7×7 landmarks on 12×10 tokens, m = 49), the Gaussian kernel, and the output scale of §4.6,
    which stays the core's post-op after the streamed output."""
    _, gen = seeded
    q, k, v = _qkv(gen, 1, 3, 120, 32, 16, False)
    kwargs = dict(hw=(12, 10), landmarks=(7, 7), kernel=kernel, norm_scale=norm_scale)
    with use(streaming="steps"):
        want = laplacian_attention(q, k, v, **kwargs)
    with use(streaming="torch"):
        got = laplacian_attention(q, k, v, **kwargs)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("norm_scale", ["inv_sqrt_n", "inv_n"])
def test_reference_with_the_output_scale_and_a_mask_equals_the_core(seeded, norm_scale):
    """The §4.6 scale inside the passes takes each sequence's own valid-key count (α = n^-p per sequence)."""
    _, gen = seeded
    q, k, v = _qkv(gen, 2, 2, 75, 16, 8, False)
    kwargs = dict(landmarks=16, norm_scale=norm_scale, key_padding_mask=_mask(2, 75))
    with use(streaming="steps"):
        want = laplacian_attention(q, k, v, **kwargs)
    with use(streaming="torch"):
        got = laplacian_attention(q, k, v, **kwargs)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_half_inputs_reach_the_fused_ops_uncast(seeded, monkeypatch, dtype):
    """Half q, k, v without a mask go to the landmark solve and the passes as they are (no float32 copies; the
    ops compute in float32 inside), with the layer's DWConv(V) fused; the result equals the cast path's."""
    import laplacianformer.ops.nystrom as core
    from laplacianformer.ops.attention import attention_with_value_conv

    _, gen = seeded
    tokens = torch.randn(2, 48, 32, generator=gen, dtype=torch.float64).to(dtype)
    q = torch.randn(2, 2, 48, 16, generator=gen, dtype=torch.float64).to(dtype)
    weight, bias = (torch.randn(32, 1, 3, 3, generator=gen) / 3).to(dtype), torch.randn(32, generator=gen).to(dtype)
    s = AttentionSettings(head_dim=16, landmarks=(3, 2), norm_scale="inv_n")
    kwargs = dict(hw=(8, 6), weight=weight, bias=bias)
    with use(streaming="steps", landmark_solve="steps"):
        want = attention_with_value_conv(q, q, tokens, s, **kwargs)

    def no_cast(*_args):
        raise AssertionError("the half inputs were cast")

    monkeypatch.setattr(core, "padded_inputs", no_cast)
    with use(streaming="torch", landmark_solve="torch"):
        got = attention_with_value_conv(q, q, tokens, s, **kwargs)
    assert got.dtype == dtype
    tol = 2e-2 if dtype == torch.bfloat16 else 4e-3
    assert ((got.double() - want.double()).abs().max() / want.double().abs().max()).item() < tol


def _conv(gen, tokens, hw, bias=True):
    c = tokens.shape[-1]
    weight = torch.randn(c, 1, 3, 3, generator=gen, dtype=tokens.dtype).to(tokens.device)
    b = torch.randn(c, generator=gen, dtype=tokens.dtype).to(tokens.device) if bias else None
    return ValueConv(tokens, hw, weight, b)


@pytest.mark.parametrize("hw", [(9, 13), (2, 3), (1, 7), None], ids=["9x13", "2x3", "1x7", "1d"])
def test_reference_conv_term_is_the_layers_conv(seeded, hw):
    """The output pass's conv term (``value_conv_heads``: DWConv of vv, a 1-D sequence the (1, N) grid) equals the
    conv the layer computes (``value_conv``: channels-last grid, 1-D the weight's middle row) in float64."""
    _, gen = seeded
    n = 11 if hw is None else hw[0] * hw[1]
    tokens = torch.randn(2, n, 12, generator=gen, dtype=torch.float64)
    conv = _conv(gen, tokens, hw)
    vv = tokens.view(2, n, 3, 4).transpose(1, 2)
    want = add_value_conv(torch.zeros_like(vv), conv)
    torch.testing.assert_close(value_conv_heads(vv, conv), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("norm", STREAMED_NORMS)
@pytest.mark.parametrize("hw,landmarks", [((9, 13), (3, 4)), (None, 7)], ids=["9x13", "1d"])
def test_reference_with_conv_equals_the_core_then_the_conv(seeded, norm, hw, landmarks):
    """``attention_with_value_conv`` with the passes' specification (conv in the output pass) against the steps
    (the conv added after the core), float64, K ≠ Q, and the conv without bias."""
    from laplacianformer.ops.attention import attention_with_value_conv

    _, gen = seeded
    n = 117 if hw else 40
    q, k, _ = _qkv(gen, 1, 2, n, 8, 1, False)
    tokens = torch.randn(1, n, 16, generator=gen, dtype=torch.float64)
    conv = _conv(gen, tokens, hw, bias=norm == "injective")
    s = AttentionSettings(head_dim=8, norm=norm, landmarks=landmarks)
    args = (q, k, tokens, s)
    kwargs = dict(hw=hw, weight=conv.weight, bias=conv.bias)
    with use(streaming="steps"):
        want = attention_with_value_conv(*args, **kwargs)
    with use(streaming="torch"), __import__("laplacianformer").ops._runtime.recording() as calls:
        got = attention_with_value_conv(*args, **kwargs)
    assert [c[0] for c in calls][-1] == "streaming" and "runs 'torch'" in calls[-1][2], calls
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_shifted_covariance_keeps_float32_bits():
    """The query pass's shifted sums against E[ccᵀ] − c̄c̄ᵀ, both float32, on kernel rows of mean² about 1000 times
    their variance (q of small spread around a common offset, d = 64, 7×7 pooled landmarks): the plain form
    loses about 1e-4 of S (relative Frobenius error), the shifted one stays near float32 round-off."""
    from laplacianformer.ops.kernel_families import kernel_spec
    from laplacianformer.ops.streaming.reference import combine_queries, kernel_rows, query_pass

    gen = torch.Generator().manual_seed(0)
    q = 0.2 * torch.randn(1, 1, 4096, 64, generator=gen) + 2.0 * torch.randn(1, 1, 1, 64, generator=gen)
    marks = pool_landmarks(q, (64, 64), (7, 7))
    c64 = kernel_rows(q.double(), marks.double(), 32.0, kernel_spec("laplacian"))
    centred = c64 - c64.mean(2, keepdim=True)
    exact = centred.transpose(-1, -2) @ centred / 4096
    c = kernel_rows(q, marks, 32.0, kernel_spec("laplacian"))
    c_mean = c.mean(2, keepdim=True)
    plain = c.transpose(-1, -2) @ c / 4096 - c_mean.transpose(-1, -2) @ c_mean
    shifted = combine_queries(query_pass(q, q, marks, torch.ones(1, 1, 4096, 1), 32.0, kernel_spec("laplacian"), True))[3]
    error = lambda s: ((s.double() - exact).norm() / exact.norm()).item()  # noqa: E731
    assert error(plain) > 1e-5 and error(shifted) < 1e-6, (error(plain), error(shifted))


def test_splits_cover_the_rows():
    for n, groups in [(1, 1), (31, 8), (75, 4), (300, 2), (16384, 8), (256, 64)]:
        splits, rows = splits_for(n, groups)
        assert rows % 32 == 0 and (splits - 1) * rows < n <= splits * rows and splits <= 16


# --- the registry ----------------------------------------------------------------------------------------


def _inputs(gen, m=16, d=16, e=8, dtype=torch.float32, norm="injective", n=40):
    q, _, v = _qkv(gen, 1, 2, n, d, e, True, dtype)
    marks = torch.randn(1, 2, m, d, generator=gen, dtype=dtype)
    w_inv = torch.eye(m, dtype=dtype).expand(1, 2, m, m)
    return q, q, v, marks, w_inv, AttentionSettings(head_dim=d, norm=norm), None


def test_auto_runs_the_step_path_on_the_cpu(seeded, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    _, gen = seeded
    inputs = _inputs(gen)
    assert streaming_nystrom(*inputs) is None
    text = explain("streaming", *inputs)
    assert text.startswith("streaming: selection 'auto' runs 'steps'"), text
    assert "triton: tensors on ['cpu'], not cuda" in text and "torch: not chosen automatically" in text
    with use(streaming="triton"), pytest.raises(BackendRefused, match="not cuda"):
        streaming_nystrom(*inputs)
    q, k, v = (torch.randn(1, 1, 36, 8, generator=gen) for _ in range(3))
    report = __import__("laplacianformer").ops.explain_all(q, k, v, hw=(6, 6), landmarks=(3, 3))
    assert "] streaming: selection 'auto' runs 'steps'" in report, report


def test_forced_backends_refuse_with_the_reason(seeded, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # CPU tensors pass the device check; no kernel runs here
    _, gen = seeded
    cases = [
        (dict(m=65), r"m=65 > 64 \(the most the streaming passes take; register tiles\)"),
        (dict(d=129), r"d=129 > 128 \(the most the streaming passes take"),
        (dict(e=130), r"e=130 > 128"),
        (dict(n=0), "empty input"),
    ]
    for kwargs, reason in cases:
        inputs = _inputs(gen, **kwargs)
        for backend in ("triton", "torch"):
            with use(streaming=backend), pytest.raises(ValueError, match=reason):
                streaming_nystrom(*inputs)
    inputs = _inputs(gen, dtype=torch.float64)
    with use(streaming="triton"), pytest.raises(ValueError, match="dtype torch.float64"):
        streaming_nystrom(*inputs)
    q, k, v, marks, w_inv, s, mask = _inputs(gen)
    q.requires_grad_(True)
    for backend in ("triton", "torch"):
        with use(streaming=backend):
            assert streaming_nystrom(q, q, v, marks, w_inv, s, mask) is None  # a gradient: not asked, the steps run
            with pytest.raises(ValueError, match="requires grad: the streaming passes run forward only"):
                STREAMING(q, q, v, marks, w_inv, s, mask)  # the registry itself refuses
    with torch.no_grad(), use(streaming="torch"):
        assert streaming_nystrom(q, q, v, marks, w_inv, s, mask) is not None  # no gradient: served
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False), use(streaming="torch"), pytest.raises(ValueError, match="dispatch or function mode"):
        streaming_nystrom(*_inputs(gen))
    with use(reference=True):
        assert streaming_nystrom(*_inputs(gen)) is None  # the op's reference: the step path


def test_conv_refusals(seeded, monkeypatch):
    """Each condition that keeps the DWConv(V) out of the output pass, for both pass backends (then the whole call
    runs the step path and ``nystrom()`` adds the conv as the layer does)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # CPU tensors pass the device check; no kernel runs here
    _, gen = seeded
    q, k, _, marks, w_inv, s, _ = _inputs(gen)  # (1, 2, 40, 16) factors, e = 8
    tokens = torch.randn(1, 40, 16, generator=gen)
    vv = tokens.view(1, 40, 2, 8).transpose(1, 2)
    conv = _conv(gen, tokens, (5, 8))
    copy = vv.clone()  # a copy of V: not the head view of the tokens
    cases = [
        ((vv, torch.zeros(1, 40, dtype=torch.bool), conv), "a key_padding_mask"),
        ((copy, None, conv), "not the head view of the conv's tokens"),
        ((vv, None, conv._replace(hw=(4, 8))), r"hw=\(4, 8\) is not a grid of the N=40 tokens"),
        ((vv, None, conv._replace(weight=torch.randn(16, 1, 5, 5))), "not a 3×3 depthwise conv of the H·e = 16"),
        ((vv, None, conv._replace(bias=torch.randn(8))), "not a 3×3 depthwise conv"),
    ]
    for (v, mask, c), reason in cases:
        for backend in ("triton", "torch"):
            with use(streaming=backend), pytest.raises(ValueError, match="DWConv\\(V\\) not fused: .*" + reason):
                streaming_nystrom(q, q, v, marks, w_inv, s, mask, c)
    half = conv._replace(weight=conv.weight.double())
    with use(streaming="triton"), pytest.raises(ValueError, match="weight is torch.float64: the fused DWConv reads a float32, float16 or bfloat16"):
        streaming_nystrom(q, q, vv, marks, w_inv, s, None, half)
    for backend in ("triton", "torch"):
        with use(streaming=backend):
            assert "runs" in explain("streaming", q, q, vv, marks, w_inv, s, None, conv)
    conv.weight.requires_grad_(True)  # a conv weight that needs a gradient: the op is not asked
    with use(streaming="torch"):
        assert streaming_nystrom(q, q, vv, marks, w_inv, s, None, conv) is None


def test_training_call_runs_the_step_path(seeded):
    """With a gradient the core takes the steps even with a pass backend forced (the op is forward-only: the call
    does not ask it), and the gradients are the step path's."""
    _, gen = seeded
    q, k, v = (t.requires_grad_(True) for t in _qkv(gen, 1, 2, 40, 8, 8, False))
    with use(streaming="torch"):
        text = __import__("laplacianformer").ops.explain_all(q, k, v, landmarks=9)
        out = laplacian_attention(q, k, v, landmarks=9)
    assert "streaming" not in text and "normalization: selection 'auto'" in text, text
    with use(streaming="steps"):
        want = laplacian_attention(q, k, v, landmarks=9)
    for a, b in zip(torch.autograd.grad(out.sum(), (q, k, v)), torch.autograd.grad(want.sum(), (q, k, v))):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


# --- the Triton passes (CUDA, or the interpreter) --------------------------------------------------------

needs_triton = pytest.mark.skipif(not TRITON_HERE, reason="needs CUDA or TRITON_INTERPRET=1")

# (norm, tied, masked, b, h, n, d, e, m): N not a multiple of 32, m in {4, 16, 49}, d in {5, 16, 20, 32} (the
# distance loop's 8-feature steps, its single-feature tail and both)
TRITON_CASES = [
    ("injective", True, False, 1, 2, 75, 32, 16, 16),
    ("injective", False, True, 1, 1, 100, 16, 24, 49),
    ("injective", False, False, 1, 1, 40, 5, 8, 16),
    ("inline", True, True, 2, 1, 50, 16, 8, 4),
    ("inline", False, False, 1, 1, 70, 20, 16, 16),
    ("injective", True, True, 2, 1, 60, 16, 8, 4),
    ("inline", False, False, 1, 1, 90, 32, 16, 16),
]


def _triton_case(gen, norm, tied, masked, b, h, n, d, e, m, kernel="laplacian"):
    """Factors as the core holds them (float32, padded rows 0), landmarks pooled from q, W⁺ from the solver."""
    from laplacianformer.ops.newton_schulz import regularised_inverse
    from laplacianformer.ops.nystrom import padded_inputs
    from laplacianformer.ops.pooling import landmarks_of

    q, k, v = _qkv(gen, b, h, n, d, e, tied, torch.float32)
    mask = _mask(b, n) if masked else None
    qs, ks, vv = padded_inputs(q, k, v, torch.float32, mask)
    s = AttentionSettings(head_dim=d, norm=norm, kernel=kernel)
    marks = landmarks_of(qs, None, m, mask)
    w = torch.exp(-torch.cdist(marks, marks, p=1.0) / s.bandwidth)
    w_inv = regularised_inverse(w, iters=30)
    to = lambda t: None if t is None else t.to(DEVICE)  # noqa: E731
    return tuple(map(to, (qs, ks, vv, marks, w_inv))), s, to(mask)


@pytest.mark.triton
@needs_triton
@pytest.mark.parametrize("case", TRITON_CASES, ids=lambda c: f"{c[0]}-{'tied' if c[1] else 'untied'}"
                         f"-{'mask' if c[2] else 'nomask'}-m{c[8]}")
def test_triton_equals_reference(seeded, case):
    _, gen = seeded
    (qs, ks, vv, marks, w_inv), s, mask = _triton_case(gen, *case)
    if case[1]:
        ks = qs
    with use(streaming="triton"):
        got = streaming_nystrom(qs, ks, vv, marks, w_inv, s, mask)
    f64 = lambda t: None if t is None else t.cpu().double()  # noqa: E731
    q64 = f64(qs)
    want = streaming_nystrom_reference(q64, q64 if case[1] else f64(ks), f64(vv), f64(marks), f64(w_inv), s.bandwidth,
                                       s.kernel, s.norm, s.norm_eps, None if mask is None else mask.cpu(),
                                       scale_power=scale_power(s.norm, s.norm_scale))  # the default's §4.6 scale
    assert got.shape == want.shape and got.dtype == torch.float32
    assert got.transpose(1, 2).is_contiguous()  # written in token layout: the layer's head merge is a view
    err = ((got.cpu().double() - want).abs().max() / want.abs().max()).item()
    assert err < 1e-5, f"max error {err:.2e} relative to the largest output"
    if mask is not None:
        assert not got[mask[:, None, :].expand(-1, got.shape[1], -1)].any()  # padded rows are 0


@pytest.mark.triton
@needs_triton
@pytest.mark.parametrize("case,hw", [(("injective", False, False, 1, 2, 117, 16, 16, 16), (9, 13)),
                                     (("inline", True, False, 2, 1, 7, 16, 8, 4), (1, 7)),
                                     (("inline", True, False, 1, 2, 40, 16, 24, 4), None)],
                         ids=["injective-9x13", "inline-1x7", "inline-1d-e24"])
def test_triton_conv_equals_reference(seeded, case, hw):
    """The output pass with the DWConv(V) term against the float64 reference (V read in place as the head view
    of its tokens; e = 24 is not a power of two; no bias in the 1-D case)."""
    _, gen = seeded
    (qs, _, _, marks, w_inv), s, _ = _triton_case(gen, *case)
    b, h, n, e = qs.shape[0], qs.shape[1], qs.shape[2], case[7]
    tokens = torch.randn(b, n, h * e, generator=gen).to(DEVICE)
    vv = tokens.view(b, n, h, e).transpose(1, 2)
    conv = _conv(gen, tokens, hw, bias=hw is not None)
    with use(streaming="triton"):
        got = streaming_nystrom(qs, qs, vv, marks, w_inv, s, None, conv)
    assert got.transpose(1, 2).is_contiguous()  # the (B, N, C) sum: the layer's merge is a view
    f64 = lambda t: None if t is None else t.cpu().double()  # noqa: E731
    q64 = f64(qs)
    conv64 = ValueConv(f64(tokens), hw, f64(conv.weight), f64(conv.bias))
    want = streaming_nystrom_reference(q64, q64, f64(vv), f64(marks), f64(w_inv), s.bandwidth, s.kernel, s.norm,
                                       s.norm_eps, None, conv64, scale_power(s.norm, s.norm_scale))
    err = ((got.cpu().double() - want).abs().max() / want.abs().max()).item()
    assert err < 1e-5, f"max error {err:.2e} relative to the largest output"


PROFILE_FAMILIES = [spec.name for spec in KERNEL_FAMILIES.values()
                    if spec.id in TRITON_KERNEL_IDS and not spec.exp_of_accumulation]
"""The families whose Triton profile is not the in-place exp of the Laplacian and the Gaussian: a case each."""


@pytest.mark.triton
@needs_triton
@pytest.mark.parametrize("kernel", PROFILE_FAMILIES)
def test_triton_kernel_families_equal_reference(seeded, kernel):
    """Every pass for the other families: K ≠ Q, masked, injective (query pass with Σ C_k, combine, key pass,
    output) and K = Q, inline, with the conv on a 1-D sequence (key pass, output with DWConv(V))."""
    _, gen = seeded
    f64 = lambda t: None if t is None else t.cpu().double()  # noqa: E731
    (qs, ks, vv, marks, w_inv), s, mask = _triton_case(gen, "injective", False, True, 1, 1, 50, 20, 8, 16, kernel)
    with use(streaming="triton"):
        got = streaming_nystrom(qs, ks, vv, marks, w_inv, s, mask)
    want = streaming_nystrom_reference(f64(qs), f64(ks), f64(vv), f64(marks), f64(w_inv), s.bandwidth, s.kernel,
                                       s.norm, s.norm_eps, mask.cpu(), scale_power=scale_power(s.norm, s.norm_scale))
    err = ((got.cpu().double() - want).abs().max() / want.abs().max()).item()
    assert err < 1e-5, f"{kernel}: max error {err:.2e} relative to the largest output"
    (qs, _, _, marks, w_inv), s, _ = _triton_case(gen, "inline", True, False, 1, 1, 7, 16, 8, 4, kernel)
    tokens = torch.randn(1, 7, 8, generator=gen).to(DEVICE)
    vv = tokens.view(1, 7, 1, 8).transpose(1, 2)
    conv = _conv(gen, tokens, None, bias=False)
    with use(streaming="triton"):
        got = streaming_nystrom(qs, qs, vv, marks, w_inv, s, None, conv)
    q64 = f64(qs)
    want = streaming_nystrom_reference(q64, q64, f64(vv), f64(marks), f64(w_inv), s.bandwidth, s.kernel, s.norm,
                                       s.norm_eps, None, ValueConv(f64(tokens), None, f64(conv.weight), None))
    err = ((got.cpu().double() - want).abs().max() / want.abs().max()).item()
    assert err < 1e-5, f"{kernel} with the conv: max error {err:.2e} relative to the largest output"


@pytest.mark.triton
@needs_triton
def test_triton_gaussian_and_determinism(seeded):
    _, gen = seeded
    (qs, _, vv, marks, w_inv), s, mask = _triton_case(gen, "injective", True, True, 1, 1, 70, 16, 16, 16, "gaussian")
    with use(streaming="triton"):
        runs = [streaming_nystrom(qs, qs, vv, marks, w_inv, s, mask) for _ in range(2)]
    assert torch.equal(runs[0], runs[1])  # fixed splits summed in a fixed order: bit-identical
    q64 = qs.cpu().double()
    want = streaming_nystrom_reference(q64, q64, vv.cpu().double(), marks.cpu().double(), w_inv.cpu().double(),
                                       s.bandwidth, s.kernel, s.norm, s.norm_eps, mask.cpu(),
                                       scale_power=scale_power(s.norm, s.norm_scale))
    err = ((runs[0].cpu().double() - want).abs().max() / want.abs().max()).item()
    assert err < 1e-5, f"max error {err:.2e}"


@pytest.mark.triton
@needs_triton
def test_triton_runs_the_whole_operator_on_bfloat16_inputs(seeded):
    """bfloat16 q, k, v: the core computes in float32 (docs/DESIGN.md §1.3), the passes serve that call, and the
    result equals the step path's (both float32 inside, bfloat16 out)."""
    _, gen = seeded
    q, k, v = _qkv(gen, 1, 2, 64, 16, 16, True, torch.bfloat16, DEVICE)
    kwargs = dict(hw=(8, 8), landmarks=(4, 4))
    with use(streaming="steps"):
        want = laplacian_attention(q, k, v, **kwargs)
    with use(streaming="triton"):
        got = laplacian_attention(q, k, v, **kwargs)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


def test_triton_suite_under_interpreter(triton_interpreter):
    if TRITON_HERE:
        pytest.skip("the Triton tests run in this process")
    pytest.importorskip("triton")
    triton_interpreter("tests/ops/test_streaming.py", timeout=300.0)


@pytest.mark.triton
@needs_triton
def test_every_launch_is_enumerated_for_the_aot_check(seeded, record_launches):
    """Each launch of ``streaming_triton`` (kernel, constexprs, options) is among ``aot_specialisations``, the list
    benchmarks/triton_aot.py compiles and checks for spills (a launcher change cannot bypass it)."""
    from laplacianformer.ops.streaming import triton as st

    enumerated = record_launches.enumerated(st.aot_specialisations())
    launched = record_launches(st, "query_stats_kernel", "combine_kernel", "key_pass_kernel", "output_kernel")
    _, gen = seeded
    for case in [("injective", False, False, 1, 1, 40, 16, 24, 49), ("inline", True, True, 1, 1, 40, 16, 8, 4)]:
        (qs, ks, vv, marks, w_inv), s, mask = _triton_case(gen, *case)
        st.streaming_triton(qs, qs if case[1] else ks, vv, marks, w_inv, s.bandwidth, s.kernel, s.norm, s.norm_eps,
                            mask)
    (qs, _, vv, marks, w_inv), s, _ = _triton_case(gen, "inline", True, False, 1, 2, 40, 16, 8, 4)
    tokens = vv.transpose(1, 2).contiguous().view(1, 40, 16)
    st.streaming_triton(qs, qs, tokens.view(1, 40, 2, 8).transpose(1, 2), marks, w_inv, s.bandwidth, s.kernel,
                        s.norm, s.norm_eps, None, _conv(gen, tokens, (5, 8)))
    assert len(launched) == 3 * 4 and set(launched) <= enumerated, set(launched) - enumerated  # four passes a call
    assert any(("CONV", "True") in meta for name, meta, *_ in launched if name == "output_kernel")


def test_stream_capture_is_served_tracing_is_not(monkeypatch):
    """A CUDA graph records the passes as they run (faked capture: no GPU here); a dispatch mode is refused."""
    from torch.utils.flop_counter import FlopCounterMode

    from laplacianformer.ops import _runtime
    from laplacianformer.ops.streaming import _pass_refusal

    settings = AttentionSettings(head_dim=8)
    q = torch.randn(1, 1, 20, 8)
    marks = torch.randn(1, 1, 4, 8)
    args = (q, q, torch.randn(1, 1, 20, 8), marks, torch.eye(4)[None, None], settings, None)
    assert _pass_refusal(*args) is None
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert _runtime.capturing() and _pass_refusal(*args) is None
    with FlopCounterMode(display=False):
        assert "dispatch or function mode" in _pass_refusal(*args)

"""The forward Triton kernels (``ops/streaming/triton.py``, ``landmarks_triton.py``) on half-precision inputs and
with the output scale α of the whitened norms (docs/DESIGN.md §4.6).

The Triton tests (marked ``triton``: CUDA, or TRITON_INTERPRET=1, which ``test_triton_suite_under_interpreter``
sets in a subprocess) check:

- float16 and bfloat16 q, k, v (strided head views of (B, N, H·d) token buffers of that dtype; the conv's V the
  head view of its tokens) against the float64 reference on the SAME half values upcast: the only differences are
  float32 accumulation and the output's rounding to half (relative max error ≤ 2e-3 for float16, ≤ 1e-2 for
  bfloat16); K = Q and K ≠ Q, whitened and non-whitened norms, the fused DWConv(V) with a half and a float32 weight;
  the training forward's state (``save=True``) stays float32, Σ M' unscaled; two runs are bitwise equal;
- ``scale_power`` p = ½ and 1 (α = n^-p on the device, n each sequence's valid rows: with a padding mask α differs
  per batch element) against ``reference.streaming_nystrom_reference(..., scale_power=p)`` for both whitened norms
  with the conv; p = 0 is the default's bits, and the norms that do not whiten ignore p;
- the fused landmark solve on float16 / bfloat16 q: float32 L, W, W⁺ equal to the reference on the upcast q;
- the refusals: ks or vv of another dtype than qs (the argument named), float64;
- every launch of a half call (kernel, constexprs, options and each pointer's type) is among
  ``aot_specialisations``, the list benchmarks/triton_aot.py compiles.
"""

from __future__ import annotations

import os

import pytest
import torch

from laplacianformer.ops.settings import AttentionSettings
from laplacianformer.ops.streaming import backward_reference as bref
from laplacianformer.ops.streaming.landmarks import landmark_solve_reference
from laplacianformer.ops.streaming.limits import output_alpha
from laplacianformer.ops.streaming.reference import streaming_nystrom_reference
from laplacianformer.ops.value_conv import ValueConv, value_conv_heads

TRITON_HERE = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif(not TRITON_HERE, reason="needs CUDA or TRITON_INTERPRET=1")

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
"""Largest output error relative to the float64 reference's largest magnitude, per input (and output) dtype: float32
round-off, or about the half dtype's half-ulp (the output is rounded to it once)."""
HALF = [torch.float16, torch.bfloat16]


def _tokens(gen, b, n, width, dtype):
    return torch.randn(b, n, width, generator=gen).to(dtype).to(DEVICE)


def _heads(tokens, h):
    """The (B, H, N, width) head view of (B, N, H·width) tokens (strided, last dim contiguous)."""
    b, n, c = tokens.shape
    return tokens.view(b, n, h, c // h).transpose(1, 2)


def _case(gen, norm, kernel, tied, conv, b, h, hw, grid, d, e, dtype, weight_dtype=None):
    """(qs, ks, vv, marks, w_inv, conv) for the kernel (q, k, v of ``dtype``; marks and W⁺ float32 from the float64
    landmark solve), their float64 counterparts (the half values upcast) and the settings."""
    n = hw[0] * hw[1]
    qs = _heads(_tokens(gen, b, n, h * d, dtype), h)
    ks = qs if tied else _heads(_tokens(gen, b, n, h * d, dtype), h)
    tokens = _tokens(gen, b, n, h * e, dtype)
    vv = _heads(tokens, h)
    s = AttentionSettings(head_dim=d, kernel=kernel, norm=norm, landmarks=grid)
    f64 = lambda t: None if t is None else t.cpu().double()  # noqa: E731
    q64 = f64(qs)
    k64 = q64 if tied else f64(ks)
    marks, w, w_inv = landmark_solve_reference(q64, hw, grid, s.bandwidth, kernel, eps=0.01, iters=30)
    vc = vc64 = None
    if conv:
        wd = weight_dtype or dtype
        weight = (0.3 * torch.randn(h * e, 1, 3, 3, generator=gen)).to(wd).to(DEVICE)
        bias = torch.randn(h * e, generator=gen).to(wd).to(DEVICE)
        vc = ValueConv(tokens, hw, weight, bias)
        vc64 = ValueConv(f64(tokens), hw, f64(weight), f64(bias))
    to32 = lambda t: t.float().contiguous().to(DEVICE)  # noqa: E731
    kernel_in = (qs, ks, vv, to32(marks), to32(w_inv), vc)
    return kernel_in, (q64, k64, f64(vv), marks, w, w_inv, vc64), s


def _err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.cpu().double() - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


def _reference(ref_in, s, mask=None, scale_power=0.0):
    q64, k64, v64, marks, _, w_inv, vc64 = ref_in
    return streaming_nystrom_reference(q64, k64, v64, marks, w_inv, s.bandwidth, s.kernel, s.norm, s.norm_eps,
                                       mask, vc64, scale_power)


def _run(kernel_in, s, mask=None, **kwargs):
    from laplacianformer.ops.streaming.triton import streaming_triton

    qs, ks, vv, marks, w_inv, vc = kernel_in
    return streaming_triton(qs, ks, vv, marks, w_inv, s.bandwidth, s.kernel, s.norm, s.norm_eps, mask, vc, **kwargs)


# (norm, kernel, tied, conv, b, h, hw, grid, d, e, scale_power): a whitened norm with K = Q and the conv (its weight
# in the inputs' dtype), a non-whitened one with K ≠ Q and d, e not powers of two, a whitened one at m = 49 over
# N = 150 (5 splits) with α ≠ 1
HALF_CASES = [
    ("injective", "laplacian", True, True, 1, 2, (10, 7), (4, 4), 16, 8, 0.0),
    ("inline", "gaussian", False, False, 2, 1, (10, 7), (2, 3), 20, 20, 0.0),
    ("injective", "laplacian", False, False, 1, 1, (15, 10), (7, 7), 16, 16, 0.5),
]


def _case_id(c):
    norm, kernel, tied, conv, b, h, hw, grid, d, e, p = c
    return (f"{norm}-{kernel}-{'tied' if tied else 'untied'}{'-conv' if conv else ''}-n{hw[0] * hw[1]}"
            f"-m{grid[0] * grid[1]}-d{d}-e{e}-p{p}")


@pytest.mark.triton
@needs_triton
@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("case", HALF_CASES, ids=_case_id)
def test_half_inputs_equal_the_reference_on_the_same_values(seeded, case, dtype):
    seed, gen = seeded
    *shape, p = case
    kernel_in, ref_in, s = _case(gen, *shape, dtype)
    qs, ks, vv = kernel_in[:3]
    assert qs.shape[1] == 1 or not (qs.is_contiguous() or vv.is_contiguous())  # read in place
    got = _run(kernel_in, s, scale_power=p)
    assert got.dtype == dtype and got.shape == vv.shape and got.transpose(1, 2).is_contiguous()
    err = _err(got, _reference(ref_in, s, scale_power=p))
    assert err < TOL[dtype], f"seed {seed}: {dtype}: max error {err:.2e} relative to the largest output"


@pytest.mark.triton
@needs_triton
def test_half_training_forward_keeps_a_float32_unscaled_state_deterministically(seeded):
    """``save=True`` on bfloat16 inputs with α = 1/n and a float32 conv weight: the state is float32 and equals
    ``backward_reference.forward_state`` on the upcast inputs (Σ M' unscaled), the output equals the state's output
    α-scaled plus the conv, and a second run gives the same bits."""
    seed, gen = seeded
    dtype, p = torch.bfloat16, 1.0
    kernel_in, ref_in, s = _case(gen, "injective", "laplacian", False, True, 1, 2, (10, 7), (4, 4), 16, 8, dtype,
                                 torch.float32)
    runs = [_run(kernel_in, s, save=True, scale_power=p) for _ in range(2)]
    (out, state), (out2, state2) = runs
    assert torch.equal(out, out2) and all(torch.equal(state[k], state2[k]) for k in state)
    q64, k64, v64, marks, w, w_inv, vc64 = ref_in
    st64 = bref.forward_state(q64, k64, v64, marks, w, w_inv, s.bandwidth, s.kernel, s.norm, s.norm_eps)
    for name in ("c_mean", "k_mean", "cov", "sp", "m_prime", "v_sum"):
        t = state[name]
        assert t.dtype == torch.float32 and t.is_contiguous() and t.shape == getattr(st64, name).shape, name
        err = _err(t, getattr(st64, name))
        assert err < 1e-4, f"seed {seed}: state {name}: max error {err:.2e}"
    alpha = output_alpha(s.norm, p, q64.shape[2])  # 1/70
    want = bref.output_of(q64, st64, s.bandwidth, s.kernel, s.norm, alpha) + value_conv_heads(v64, vc64)
    assert out.dtype == dtype and _err(out, want) < TOL[dtype]
    assert _err(out, _reference(ref_in, s, scale_power=p)) < TOL[dtype]


# (norm, kernel, tied, b, h, hw, grid, d, e, scale_power), every case with the conv
SCALE_CASES = [
    ("injective", "laplacian", True, 1, 2, (10, 7), (4, 4), 16, 8, 0.5),
    ("injective", "gaussian", False, 2, 1, (10, 7), (2, 3), 16, 12, 1.0),
    ("injective", "laplacian", False, 1, 2, (10, 7), (4, 4), 16, 8, 1.0),
    ("injective", "gaussian", True, 1, 1, (8, 5), (2, 3), 8, 8, 0.5),
]


@pytest.mark.triton
@needs_triton
@pytest.mark.parametrize("case", SCALE_CASES,
                         ids=lambda c: f"{c[0]}-{c[1]}-{'tied' if c[2] else 'untied'}-m{c[6][0] * c[6][1]}-p{c[9]}")
def test_output_scale_equals_the_reference(seeded, case):
    seed, gen = seeded
    norm, kernel, tied, b, h, hw, grid, d, e, p = case
    kernel_in, ref_in, s = _case(gen, norm, kernel, tied, True, b, h, hw, grid, d, e, torch.float32)
    got = _run(kernel_in, s, scale_power=p)
    want = _reference(ref_in, s, scale_power=p)
    unscaled = _reference(ref_in, s)
    assert _err(want, unscaled) > 0.1  # α = 70^-p, 40^-p: far from the unscaled output
    err = _err(got, want)
    assert err < TOL[torch.float32], f"seed {seed}: max error {err:.2e} relative to the largest output"


@pytest.mark.triton
@needs_triton
def test_output_scale_per_sequence_under_a_padding_mask(seeded):
    """Two sequences of 70 rows, the second padded from row 42 on: α = n^-½ with n = 70 and 42 (the device's count of
    each group), against the reference's per-sequence α."""
    seed, gen = seeded
    kernel_in, ref_in, s = _case(gen, "injective", "laplacian", False, False, 2, 1, (10, 7), (4, 4), 16, 8,
                                 torch.float32)
    mask = torch.zeros(2, 70, dtype=torch.bool)
    mask[1, 42:] = True
    keep = (~mask)[:, None, :, None]
    qs, ks, vv = (t * keep.to(DEVICE) for t in kernel_in[:3])  # padded rows 0, as the core holds them
    q64, k64, v64 = (t.cpu().double() for t in (qs, ks, vv))
    got = _run((qs, ks, vv, *kernel_in[3:]), s, mask.to(DEVICE), scale_power=0.5)
    want = _reference((q64, k64, v64, *ref_in[3:]), s, mask, 0.5)
    err = _err(got, want)
    assert err < TOL[torch.float32], f"seed {seed}: max error {err:.2e} relative to the largest output"
    assert not got[1, :, 42:].any()  # padded rows are 0


@pytest.mark.triton
@needs_triton
def test_scale_power_zero_is_the_default_and_other_norms_ignore_it(seeded):
    _, gen = seeded
    kernel_in, _, s = _case(gen, "injective", "laplacian", False, True, 1, 1, (8, 5), (2, 3), 8, 8, torch.float32)
    assert torch.equal(_run(kernel_in, s, scale_power=0.0), _run(kernel_in, s))
    for norm in ("inline",):
        other = AttentionSettings(head_dim=8, norm=norm)
        assert torch.equal(_run(kernel_in, other, scale_power=1.0), _run(kernel_in, other))


# --- the fused landmark solve --------------------------------------------------------------------------------


@pytest.mark.triton
@needs_triton
@pytest.mark.parametrize("dtype,kernel", [(torch.float16, "laplacian"), (torch.bfloat16, "gaussian")], ids=str)
def test_landmark_solve_reads_half_q(seeded, dtype, kernel):
    """q (1, 2, 70, 24) of the half dtype as a permuted (B, N, H, d) tensor, pooled 10×7 -> 4×4: L, W and W⁺
    float32, equal to the float64 reference on the same values (float32 round-off: half values are exact in float32)."""
    from laplacianformer.ops.streaming.landmarks_triton import landmark_solve_triton

    seed, gen = seeded
    s = AttentionSettings(head_dim=24, kernel=kernel)
    q = torch.randn(1, 70, 2, 24, generator=gen).to(dtype).to(DEVICE).permute(0, 2, 1, 3)
    got = landmark_solve_triton(q, (10, 7), (4, 4), s.bandwidth, kernel, s.ns_eps, s.iters)
    want = landmark_solve_reference(q.cpu().double(), (10, 7), (4, 4), s.bandwidth, kernel, s.ns_eps, s.iters)
    for g, w, tol, name in zip(got, want, (1e-6, 1e-6, 1e-5), ("L", "W", "W⁺")):
        assert g.dtype == torch.float32 and g.shape == w.shape and g.is_contiguous(), name
        err = ((g.cpu().double() - w).norm() / w.norm()).item()
        assert err < tol, f"seed {seed}: {dtype}: relative error of {name} {err:.2e}"


# --- refusals and the AOT list ---------------------------------------------------------------------------------


@pytest.mark.triton
@needs_triton
def test_mixed_dtypes_and_float64_are_refused(seeded):
    from laplacianformer.ops.streaming.landmarks_triton import landmark_solve_triton

    _, gen = seeded
    kernel_in, _, s = _case(gen, "injective", "laplacian", False, False, 1, 1, (4, 4), (2, 2), 8, 8, torch.float32)
    qs, ks, vv, marks, w_inv, _ = kernel_in
    for args, name in [((qs, ks.half(), vv), "ks is torch.float16"), ((qs, ks, vv.bfloat16()), "vv is torch.bfloat16"),
                       ((qs.half(), qs.half(), vv), "vv is torch.float32")]:
        with pytest.raises(ValueError, match=f"streaming_triton: {name}, qs "):
            _run((*args, marks, w_inv, None), s)
    with pytest.raises(ValueError, match="streaming_triton: dtype torch.float64"):
        _run((qs.double(), qs.double(), vv.double(), marks, w_inv, None), s)
    with pytest.raises(ValueError, match="landmark_solve_triton: dtype torch.float64"):
        landmark_solve_triton(qs.double(), (4, 4), (2, 2), 4.0, "laplacian", 0.01, 3)


@pytest.mark.triton
@needs_triton
def test_every_half_launch_is_enumerated_with_its_pointer_types(seeded, record_launches):
    """A bfloat16 call (K ≠ Q, the conv: all four kernels) and a float16 one (inline, K = Q, a mask), and the
    landmark solve on float16 q: each launch's kernel, constexprs, options and pointer types are an AOT entry."""
    from laplacianformer.ops.streaming import landmarks_triton as lt
    from laplacianformer.ops.streaming import triton as st

    _, gen = seeded
    enumerated = record_launches.enumerated(st.aot_specialisations(), pointers=True)
    launched = record_launches(st, "query_stats_kernel", "combine_kernel", "key_pass_kernel", "output_kernel",
                               pointers=True)
    kernel_in, _, s = _case(gen, "injective", "laplacian", False, True, 1, 2, (5, 8), (2, 3), 16, 8, torch.bfloat16)
    _run(kernel_in, s, save=True, scale_power=0.5)
    kernel_in, _, s = _case(gen, "inline", "gaussian", True, False, 1, 1, (5, 8), (2, 2), 16, 24, torch.float16)
    mask = torch.zeros(1, 40, dtype=torch.bool, device=DEVICE)
    _run(kernel_in, s, mask)
    assert len(launched) == 4 + 4 and set(launched) <= enumerated, set(launched) - enumerated
    assert {dict(k[5]).get("Q") for k in launched} == {"*bf16", "*fp16", None}  # None: the combine kernel
    assert any(dict(k[5])["OUT"] == "*bf16" and ("CONV", "True") in k[1] for k in launched if k[0] == "output_kernel")

    solve_enumerated = record_launches.enumerated(lt.aot_specialisations(), pointers=True)
    solves = record_launches(lt, "landmark_solve_kernel", pointers=True)
    q = torch.randn(1, 36, 1, 24, generator=gen).half().to(DEVICE).permute(0, 2, 1, 3)
    lt.landmark_solve_triton(q, (6, 6), (2, 3), 4.0, "laplacian", 0.01, 3)
    assert len(solves) == 1 and set(solves) <= solve_enumerated and dict(solves[0][5])["Q"] == "*fp16"


@pytest.mark.triton
@needs_triton
def test_aot_lists_every_dtype_with_its_label():
    """Half variants of every data-reading kernel (none of the combine kernel, which reads float32 workspaces only),
    pointers typed per dtype, labels ``dtype=fp32|fp16|bf16`` (the float32 ones as before)."""
    from laplacianformer.ops.streaming import landmarks_triton as lt
    from laplacianformer.ops.streaming import triton as st

    by_dtype: dict[str, set] = {}
    for kernel, sig, _meta, *_rest in st.aot_specialisations():
        label = _rest[2]
        dtype = dict(w.split("=", 1) for w in label.split()[1:])["dtype"]
        by_dtype.setdefault(dtype, set()).add(kernel.__name__)
        data = {k: v for k, v in sig.items() if k in ("Q", "K", "V", "OUT")}
        assert all(v == f"*{dtype}" for v in data.values()), (label, data)
        assert sig.get("scale_power", "fp32") == "fp32" and all(
            v == "*fp32" for k, v in sig.items() if v.startswith("*") and k not in data and k != "MASK"), label
    assert by_dtype["fp32"] == {"query_stats_kernel", "combine_kernel", "key_pass_kernel", "output_kernel"}
    assert by_dtype["fp16"] == by_dtype["bf16"] == {"query_stats_kernel", "key_pass_kernel", "output_kernel"}
    solve = {(s[5].split()[1], s[1]["Q"]) for s in lt.aot_specialisations()}
    assert solve == {("dtype=fp32", "*fp32"), ("dtype=fp16", "*fp16"), ("dtype=bf16", "*bf16")}


def test_triton_suite_under_interpreter(triton_interpreter):
    if TRITON_HERE:
        pytest.skip("the Triton tests run in this process")
    pytest.importorskip("triton")
    triton_interpreter("tests/ops/test_streaming_dtypes.py", timeout=300.0)

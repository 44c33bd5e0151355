"""Passes C and E of the fused backward in Triton (ops/streaming/backward_landmarks_triton.py) against their
specification, ``ops/streaming/backward_reference.py``, in float64.

- ``landmark_grad_triton`` (pass C) equals ``landmark_grad`` for every norm, the Laplacian and the Gaussian (and an
  injective case with the conv for each other family of the Triton profile: d = 40, its distance summed over two
  chunks), m in {6, 16, 49}, d
  and e not powers of two, several (batch, head) groups: the ForwardState and passes A and B are the float64
  reference's (the landmark solve's L, W, W⁺ in float64), their sums cut into 3 random partials per group that
  add up to them (then cast to float32, as the row passes leave them); with a 3×3 depthwise conv, dweight and
  dbias equal the reference's (``query_grad_pass`` with ``ValueConv``), the kernel summing the per-batch
  partials over the batch; with the output scale α of the whitened norms (``limits.output_alpha``, p = ½ and 1:
  pass A's dM carries it, q_const reads M = α W⁺ M') it equals ``landmark_grad(..., alpha=)``;
- ``pool_grad_triton`` (pass E) equals ``pool_grad`` on grids with overlapping bins (10×7 -> 4×3), exact
  ones, the identity pooling and 16×16 -> 7×7, dq a strided view of a token-layout buffer, more than one split;
  a float16 / bfloat16 dq is read, added to in float32 and rounded once (the reference on its values in float64,
  to the half dtype's rounding);
- both are bitwise deterministic, every launch is among ``aot_specialisations`` (the AOT check's list), and
  sizes they do not serve are ValueErrors naming the argument.

Marked ``triton`` (CUDA, or TRITON_INTERPRET=1, which ``test_triton_suite_under_interpreter`` sets in a
subprocess).
"""

from __future__ import annotations

import os

import pytest
import torch

from laplacianformer.ops.kernel.limits import TRITON_KERNEL_IDS
from laplacianformer.ops.kernel_families import KERNEL_FAMILIES
from laplacianformer.ops.settings import AttentionSettings
from laplacianformer.ops.streaming import backward_reference as br
from laplacianformer.ops.streaming.landmarks import landmark_solve_reference
from laplacianformer.ops.streaming.limits import output_alpha, whitens
from laplacianformer.ops.value_conv import ValueConv

TRITON_HERE = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif(not TRITON_HERE, reason="needs CUDA or TRITON_INTERPRET=1")
SPLITS = 3


def _rel(got, want) -> float:
    """Max abs error relative to the reference's max abs (W⁺ ≈ (W + 0.01 I)⁻¹ amplifies dW: absolute errors
    scale with the result)."""
    return ((got.cpu().double() - want).abs().max() / want.abs().max().clamp_min(1e-300)).item()


def _partials(gen, x: torch.Tensor, groups: int) -> torch.Tensor:
    """x (B, H, ...) float64 cut into SPLITS random parts per group that add up to it: (G, SPLITS, ...) float32."""
    x = x.reshape(groups, *x.shape[2:])
    scale = x.abs().mean()
    parts = [scale * torch.randn(x.shape, generator=gen, dtype=x.dtype) for _ in range(SPLITS - 1)]
    parts.append(x - sum(parts))
    return torch.stack(parts, 1).float().to(DEVICE)


def _conv_partials(grad, qs, vv, tokens, st, hw, weight, bias, bandwidth, kernel, norm):
    """Pass A's per-group conv partials (G, 9, e): each batch element's dweight from the reference (one call per
    batch element), [b·H + h, t, j] = dweight_b[h·e + j, 0, t // 3, t % 3]."""
    b, h, e = grad.shape[0], grad.shape[1], grad.shape[-1]
    rows = []
    for i in range(b):
        one = lambda x: x[i:i + 1]  # noqa: E731
        a = br.query_grad_pass(one(grad), one(qs), one(vv), br.ForwardState(*map(one, st)), bandwidth, kernel, norm,
                               ValueConv(one(tokens), hw, weight, bias))
        rows.append(a["dweight"].reshape(h, e, 9).transpose(1, 2))
    return torch.cat(rows)


def _pass_c_case(gen, norm, kernel, hw, grid, b, h, d, e, tied, conv, alpha=1.0):
    """(inputs of ``landmark_grad_triton``, the reference's outputs) from fresh float64 q, k, v, G; ``alpha`` the
    output scale of passes A and C."""
    n = hw[0] * hw[1]
    s = AttentionSettings(head_dim=d, norm=norm, kernel=kernel)
    qs = torch.randn(b, n, h, d, generator=gen, dtype=torch.float64).transpose(1, 2)
    ks = qs if tied else torch.randn(b, n, h, d, generator=gen, dtype=torch.float64).transpose(1, 2)
    tokens = torch.randn(b, n, h * e, generator=gen, dtype=torch.float64)
    vv = tokens.view(b, n, h, e).transpose(1, 2)
    grad = torch.randn(b, h, n, e, generator=gen, dtype=torch.float64)
    marks, w, w_inv = landmark_solve_reference(qs, hw, grid, s.bandwidth, kernel, eps=0.01, iters=30)
    st = br.forward_state(qs, ks, vv, marks, w, w_inv, s.bandwidth, kernel, norm, s.norm_eps)
    weight = bias = value_conv = None
    if conv:
        weight = torch.randn(h * e, 1, 3, 3, generator=gen, dtype=torch.float64)
        bias = torch.randn(h * e, generator=gen, dtype=torch.float64)
        value_conv = ValueConv(tokens, hw, weight, bias)
    a = br.query_grad_pass(grad, qs, vv, st, s.bandwidth, kernel, norm, value_conv, alpha)
    bk = None
    if whitens(norm):
        bk = br.key_grad_pass(ks, vv, st, st.w_inv.transpose(-1, -2) @ a["dm"], s.bandwidth, kernel, s.norm_eps)
    want = br.landmark_grad(st, a, bk, n, s.bandwidth, kernel, norm, alpha)
    want.update(dweight=a["dweight"], dbias=a["dbias"])
    groups = b * h
    parts = dict(pdm=_partials(gen, a["dm"], groups), pg=_partials(gen, a["g_sum"], groups), pdw=None)
    if conv:
        pdw = _conv_partials(grad, qs, vv, tokens, st, hw, weight, bias, s.bandwidth, kernel, norm)
        parts["pdw"] = _partials(gen, pdw[None], groups)
    parts_b = None
    if bk is not None:
        parts_b = dict(pdsp=_partials(gen, bk["dsp"], groups), pdkt=_partials(gen, bk["dkt_sum"], groups))
    st32 = br.ForwardState(*(x.float().contiguous().to(DEVICE) for x in st))
    conv_weight = None if weight is None else weight.float().to(DEVICE)
    return (st32, parts, parts_b, n, s.bandwidth, kernel, norm, conv_weight), want


# (norm, kernel, hw, grid, b, h, d, e, tied, conv): m = 49, 16, 6; d = 20, e = 24 and 40 not powers of two
# (e = 40: two chunks of 32 columns, the second partial)
PASS_C_CASES = [
    ("injective", "laplacian", (10, 7), (7, 7), 1, 2, 16, 16, False, True),
    ("injective", "gaussian", (8, 8), (4, 4), 2, 1, 20, 24, True, False),
    ("injective", "laplacian", (6, 5), (2, 3), 2, 2, 16, 8, False, True),
    ("injective", "gaussian", (10, 7), (7, 7), 1, 1, 32, 16, True, False),
    ("inline", "laplacian", (8, 8), (4, 4), 2, 2, 16, 40, False, True),
    ("inline", "gaussian", (6, 5), (2, 3), 1, 2, 20, 8, True, False),
    ("inline", "laplacian", (10, 7), (7, 7), 2, 1, 16, 16, True, False),
    ("inline", "gaussian", (10, 7), (7, 7), 2, 1, 16, 16, True, True),
] + [("injective", spec.name, (8, 8), (4, 4), 1, 1, 40, 16, False, True) for spec in KERNEL_FAMILIES.values()
     if spec.id in TRITON_KERNEL_IDS and not spec.exp_of_accumulation]
PASS_C_KEYS = ("d_mprime", "q_cov", "q_const", "k_const", "v_const", "d_marks", "dweight", "dbias")


def _pass_c_id(c) -> str:
    return f"{c[0]}-{c[1]}-m{c[3][0] * c[3][1]}-d{c[6]}e{c[7]}-{'tied' if c[8] else 'untied'}" \
           f"{'-conv' if c[9] else ''}"


@pytest.mark.triton
@needs_triton
@pytest.mark.parametrize("case", PASS_C_CASES, ids=_pass_c_id)
def test_landmark_grad_equals_reference(seeded, case):
    from laplacianformer.ops.streaming.backward_landmarks_triton import landmark_grad_triton

    _, gen = seeded
    args, want = _pass_c_case(gen, *case)
    got = landmark_grad_triton(*args)
    assert (got["q_cov"] is None) == (not whitens(case[0])) and (got["dweight"] is None) == (not case[9])
    errors = {}
    for key in PASS_C_KEYS:
        if want[key] is None:
            assert got[key] is None, key
            continue
        assert got[key].shape == want[key].shape and got[key].dtype == torch.float32, key
        if not want[key].any():  # a constant the norm does not have: exactly 0
            assert not got[key].any(), key
            continue
        errors[key] = _rel(got[key], want[key])
    assert all(err < 1e-4 for err in errors.values()), errors


# (hw, grid, b, h, d): overlapping bins (10×7 -> 4×3, N = 70: 3 splits of 32 rows, the last partial), exact
# 2×2 bins, the identity, 16×16 -> 7×7 (bins of 3 overlapping by one: 8 splits); d = 24 not a power of two
POOL_CASES = [((10, 7), (4, 3), 1, 2, 16), ((14, 14), (7, 7), 2, 1, 24), ((7, 7), (7, 7), 1, 2, 16),
              ((16, 16), (7, 7), 1, 2, 32)]


def _pool_case(gen, hw, grid, b, h, d):
    """dq (B, H, N, d) a strided view of a (B, N, H, d + 3) buffer (the row stride not d: a column slice),
    dL_W (B, H, m, d), pass D's partials (G, 3, m, d)."""
    n, m = hw[0] * hw[1], grid[0] * grid[1]
    dq = torch.randn(b, n, h, d + 3, generator=gen).to(DEVICE).transpose(1, 2)[..., :d]
    d_marks_w = torch.randn(b, h, m, d, generator=gen).to(DEVICE)
    pdl = torch.randn(b * h, SPLITS, m, d, generator=gen).to(DEVICE)
    return dq, d_marks_w, pdl


@pytest.mark.triton
@needs_triton
@pytest.mark.parametrize("case", POOL_CASES, ids=lambda c: f"{c[0][0]}x{c[0][1]}-to-{c[1][0]}x{c[1][1]}-d{c[4]}")
def test_pool_grad_equals_reference(seeded, case):
    from laplacianformer.ops.streaming.backward_landmarks_triton import pool_grad_triton

    _, gen = seeded
    hw, grid, b, h, d = case
    dq, d_marks_w, pdl = _pool_case(gen, *case)
    f64 = lambda t: t.cpu().double()  # noqa: E731
    d_marks = f64(d_marks_w) + f64(pdl).sum(1).reshape(d_marks_w.shape)
    want = br.pool_grad(f64(dq), d_marks, torch.zeros(dq.shape, dtype=torch.float64), hw, grid)
    assert not dq.is_contiguous() and dq.stride(-1) == 1
    beside = dq.as_strided((b, h, dq.shape[2], 3), dq.stride(), dq.storage_offset() + d).clone()
    pool_grad_triton(dq, d_marks_w, pdl, hw, grid)
    assert _rel(dq, want) < 1e-5
    assert torch.equal(dq.as_strided(beside.shape, dq.stride(), dq.storage_offset() + d), beside)  # untouched


@pytest.mark.triton
@needs_triton
def test_pool_grad_1d_without_partials(seeded):
    """A 1-D sequence (hw None: 45 tokens pooled to 7, overlapping bins) and no partials of pass D (pdl None);
    d = 80: two chunks of 64 columns, the second partial."""
    from laplacianformer.ops.streaming.backward_landmarks_triton import pool_grad_triton

    _, gen = seeded
    dq = torch.randn(2, 45, 2, 80, generator=gen).to(DEVICE).transpose(1, 2)
    d_marks_w = torch.randn(2, 2, 7, 80, generator=gen).to(DEVICE)
    want = br.pool_grad(dq.cpu().double(), d_marks_w.cpu().double(), torch.zeros(dq.shape, dtype=torch.float64),
                        None, 7)
    pool_grad_triton(dq, d_marks_w, None, None, 7)
    assert _rel(dq, want) < 1e-5


@pytest.mark.triton
@needs_triton
@pytest.mark.parametrize("case,power", [(PASS_C_CASES[2], 0.5), (("injective", "gaussian", (8, 8), (4, 4), 1, 2, 16,
                                                                 8, False, True), 1.0)],
                         ids=["injective-m6-p0.5", "injective-m16-p1"])
def test_landmark_grad_with_output_scale(seeded, case, power):
    """α = N^-p: pass C equals ``landmark_grad(..., alpha=)`` on pass A's α-scaled dM (q_const reads M = α W⁺ M');
    a float16 conv weight is accepted (only its shape is read), dweight and dbias float32."""
    from laplacianformer.ops.streaming.backward_landmarks_triton import landmark_grad_triton

    _, gen = seeded
    n = case[2][0] * case[2][1]
    alpha = output_alpha(case[0], power, float(n))
    assert alpha < 1.0
    args, want = _pass_c_case(gen, *case, alpha=alpha)
    got = landmark_grad_triton(*args[:-1], args[-1].half(), alpha=alpha)
    errors = {}
    for key in PASS_C_KEYS:
        assert got[key].dtype == torch.float32, key
        if want[key].any():
            errors[key] = _rel(got[key], want[key])
    assert "q_const" in errors or not whitens(case[0])
    assert all(err < 1e-4 for err in errors.values()), errors


@pytest.mark.triton
@needs_triton
@pytest.mark.parametrize("dtype,tol", [(torch.float16, 2e-3), (torch.bfloat16, 1e-2)], ids=["fp16", "bf16"])
def test_pool_grad_half_dq(seeded, dtype, tol):
    """A float16 / bfloat16 dq (a strided view of a (B, N, H, d + 3) buffer) is read, added to in float32 and
    stored once in its dtype: the reference on its values in float64 to the dtype's rounding of each element
    (unit roundoff u: 2⁻¹¹, 2⁻⁸; 2⁻⁷ for bfloat16 under the interpreter, whose float32 -> bfloat16 cast
    truncates where the GPU's rounds to nearest even), and within ``tol`` of the largest; the columns beside it
    untouched."""
    from laplacianformer.ops.streaming.backward_landmarks_triton import pool_grad_triton

    _, gen = seeded
    hw, grid, b, h, d = POOL_CASES[0]
    _, d_marks_w, pdl = _pool_case(gen, *POOL_CASES[0])
    buf = torch.randn(b, hw[0] * hw[1], h, d + 3, generator=gen).to(DEVICE, dtype)
    dq, beside = buf.transpose(1, 2)[..., :d], buf[..., d:].clone()
    f64 = lambda t: t.cpu().double()  # noqa: E731
    d_marks = f64(d_marks_w) + f64(pdl).sum(1).reshape(d_marks_w.shape)
    want = br.pool_grad(f64(dq), d_marks, torch.zeros(dq.shape, dtype=torch.float64), hw, grid)
    pool_grad_triton(dq, d_marks_w, pdl, hw, grid)
    assert dq.dtype == dtype and torch.equal(buf[..., d:], beside)
    assert _rel(dq, want) < tol
    unit = 2.0 ** -11 if dtype == torch.float16 else 2.0 ** (-8 if torch.cuda.is_available() else -7)
    assert ((f64(dq) - want).abs() <= unit * want.abs() + 1e-5 * want.abs().max()).all()


@pytest.mark.triton
@needs_triton
def test_determinism(seeded):
    """Two calls of each launcher give the same bits (the partials summed in split order, no atomics)."""
    from laplacianformer.ops.streaming.backward_landmarks_triton import landmark_grad_triton, pool_grad_triton

    _, gen = seeded
    args, _ = _pass_c_case(gen, *PASS_C_CASES[0])
    first, second = landmark_grad_triton(*args), landmark_grad_triton(*args)
    for key in PASS_C_KEYS:
        assert torch.equal(first[key], second[key]), key
    dq, d_marks_w, pdl = _pool_case(gen, *POOL_CASES[0])
    copy = dq.clone()
    pool_grad_triton(dq, d_marks_w, pdl, *POOL_CASES[0][:2])
    pool_grad_triton(copy, d_marks_w, pdl, *POOL_CASES[0][:2])
    assert torch.equal(dq, copy)


@pytest.mark.triton
@needs_triton
def test_every_launch_is_enumerated_for_the_aot_check(seeded, record_launches):
    """Each launch of both launchers (kernel, constexprs, options) is among ``aot_specialisations``, the list
    benchmarks/triton_aot.py compiles and checks for spills (a launcher change cannot bypass it)."""
    from laplacianformer.ops.streaming import backward_landmarks_triton as bl

    enumerated = record_launches.enumerated(bl.aot_specialisations())
    half = record_launches.enumerated(spec for spec in bl.aot_specialisations() if spec[1].get("DQ") == "*fp16")
    launched = record_launches(bl, "landmark_grad_kernel", "pool_grad_kernel")
    _, gen = seeded
    for case in (PASS_C_CASES[0], PASS_C_CASES[7]):
        args, _ = _pass_c_case(gen, *case)
        bl.landmark_grad_triton(*args)
    bl.pool_grad_triton(*_pool_case(gen, *POOL_CASES[1]), *POOL_CASES[1][:2])
    assert len(launched) == 3 and set(launched) <= enumerated, set(launched) - enumerated
    dq, d_marks_w, pdl = _pool_case(gen, *POOL_CASES[0])
    bl.pool_grad_triton(dq.half(), d_marks_w, pdl, *POOL_CASES[0][:2])  # a float16 dq: the *fp16 specialisation
    assert len(launched) == 4 and launched[3] in half, launched[3]
    assert any(("CONV", "True") in meta for name, meta, *_ in launched if name == "landmark_grad_kernel")
    for _, _, warps, _, maxnreg in launched:  # the block's registers fit the register file (65536)
        assert 32 * warps * maxnreg <= 65536 + 32 * warps


def test_refusals_name_the_argument(seeded):
    """Sizes the kernels do not serve: ValueError naming the argument, before any launch (no Triton run)."""
    pytest.importorskip("triton")
    from laplacianformer.ops.streaming.backward_landmarks_triton import landmark_grad_triton, pool_grad_triton

    _, gen = seeded
    args, _ = _pass_c_case(gen, *PASS_C_CASES[2])  # injective, m = 6, with a conv
    st, a, b = args[:3]
    with pytest.raises(ValueError, match="b: norm 'injective' whitens"):
        landmark_grad_triton(st, a, None, *args[3:])
    with pytest.raises(ValueError, match=r"a\['pdm'\]: expected shape"):
        landmark_grad_triton(st, dict(a, pdm=a["pdm"][:, :, :5]), b, *args[3:])
    with pytest.raises(ValueError, match=r"a\['pdw'\] \(with conv_weight\)"):
        landmark_grad_triton(st, dict(a, pdw=None), b, *args[3:])
    with pytest.raises(ValueError, match="st: dtype torch.float64"):
        landmark_grad_triton(br.ForwardState(*(x.double() for x in st)), a, b, *args[3:])
    with pytest.raises(ValueError, match=r"st.marks: expected float32"):
        landmark_grad_triton(st._replace(marks=st.marks.half()), a, b, *args[3:])
    with pytest.raises(ValueError, match=r"landmark_grad_triton: alpha=0.5: norm 'inline' has no whitened part"):
        landmark_grad_triton(st, a, None, *args[3:6], "inline", alpha=0.5)
    with pytest.raises(ValueError, match=r"landmark_grad_triton: st: norm 'rowsum' has no streaming form"):
        landmark_grad_triton(st, a, None, *args[3:6], "rowsum")
    big = br.ForwardState(*(torch.zeros(1, 1, 65, 65) if x.shape[-2:] == (6, 6) else x for x in st))
    big = big._replace(marks=torch.zeros(1, 1, 65, 16))
    with pytest.raises(ValueError, match=r"m=65 > 64 \(the most the streaming passes take"):
        landmark_grad_triton(big, a, b, *args[3:])
    dq, d_marks_w, pdl = _pool_case(gen, (6, 5), (2, 3), 1, 1, 8)
    with pytest.raises(ValueError, match=r"hw=\(5, 5\) is not a grid of the N=30 tokens"):
        pool_grad_triton(dq, d_marks_w, pdl, (5, 5), (2, 3))
    with pytest.raises(ValueError, match="pool_grad_triton: d_marks_w: expected shape"):
        pool_grad_triton(dq, d_marks_w, pdl, (6, 5), (3, 3))
    with pytest.raises(ValueError, match="dq: expected a float32, float16 or bfloat16"):
        pool_grad_triton(dq.double(), d_marks_w, pdl, (6, 5), (2, 3))


def test_triton_suite_under_interpreter(triton_interpreter):
    if TRITON_HERE:
        pytest.skip("the Triton tests run in this process")
    pytest.importorskip("triton")
    triton_interpreter("tests/ops/test_backward_landmarks_triton.py", timeout=300.0)

"""Pass D of the fused backward in Triton (``ops/streaming/backward_rows_triton.py``) against its float64
specification ``backward_reference.row_grad_pass``.

The inputs: random float32 q, k, v and G in token layout (B, N, H·d), read as (B, H, N, ·) head views (strided,
several (batch, head) groups); the landmarks, W and W⁺ from ``landmark_solve_reference`` and the forward state
from ``backward_reference.forward_state``, both in float64; pass C's dict from the float64 reference
``landmark_grad`` on the reference passes A and B. The kernel gets them cast to float32 and writes dq, dk, dv into
head views of one (B, N, ·) buffer (filled with NaN first: every row is written, nothing else is). float16 and
bfloat16 inputs (q, k, v, G and the conv weight) are read as such and dq, dk, dv written in their dtype: against
the reference on the same half values in float64, to about the output dtype's half-ulp (pdl, float32, to the
float32 tolerance). The output scale α of the whitened norms (``limits.output_alpha``, p = ½ and 1) enters as
M = α W⁺ M' (``row_grad_pass(..., alpha=)``, passes A and C of the reference run with the same α). Marked
``triton``: CUDA, or TRITON_INTERPRET=1, which ``test_triton_suite_under_interpreter`` sets in a subprocess.
"""

from __future__ import annotations

import os

import pytest
import torch

from laplacianformer.ops.kernel.limits import TRITON_KERNEL_IDS
from laplacianformer.ops.kernel_families import KERNEL_FAMILIES
from laplacianformer.ops.settings import AttentionSettings
from laplacianformer.ops.streaming import backward_reference as ref
from laplacianformer.ops.streaming.landmarks import landmark_solve_reference
from laplacianformer.ops.streaming.limits import output_alpha, splits_for, whitens
from laplacianformer.ops.value_conv import ValueConv

TRITON_HERE = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EPS = 1e-3
needs_triton = pytest.mark.skipif(not TRITON_HERE, reason="needs CUDA or TRITON_INTERPRET=1")


def _heads(tokens: torch.Tensor, h: int) -> torch.Tensor:
    """(B, N, H·c) -> the (B, H, N, c) head view (strided)."""
    b, n, width = tokens.shape
    return tokens.view(b, n, h, width // h).transpose(1, 2)


def _case(gen, norm, tied, kernel, conv, b, h, hw, grid, d, e, dtype=torch.float32, alpha=1.0):
    """Float64 inputs and the reference: (inputs, conv64, want, settings). hw (gh, gw) or an int N (1-D),
    grid the landmark grid (lh, lw) or m (1-D); conv "2d" (the (gh, gw) grid), "1d" (hw None) or None. q, k, v,
    G and the conv weight hold values of ``dtype`` (rounded to it), the reference runs passes A, C and D with the
    output scale ``alpha``."""
    n = hw[0] * hw[1] if isinstance(hw, tuple) else hw
    f64 = dict(generator=gen, dtype=torch.float64)
    rand = lambda *shape: torch.randn(*shape, **f64).to(dtype).double()  # noqa: E731
    q = _heads(rand(b, n, h * d), h)
    k = q if tied else _heads(rand(b, n, h * d), h)
    v_tok = rand(b, n, h * e)
    v, grad = _heads(v_tok, h), _heads(rand(b, n, h * e), h)
    s = AttentionSettings(head_dim=d, kernel=kernel)
    marks, w, w_inv = landmark_solve_reference(q, hw if isinstance(hw, tuple) else None, grid, s.bandwidth, kernel,
                                               eps=0.01, iters=30)
    # the kernel reads float32 landmarks: the reference on their values (with half q, k a coordinate of k can lie
    # between a float64 landmark and its float32 rounding, and L1's sign(k − l) flip there)
    marks = marks.float().double()
    st = ref.forward_state(q, k, v, marks, w, w_inv, s.bandwidth, kernel, norm, EPS)
    conv64 = None
    if conv is not None:
        weight = rand(h * e, 1, 3, 3)
        conv64 = ValueConv(v_tok, hw if conv == "2d" else None, weight, None)
    a = ref.query_grad_pass(grad, q, v, st, s.bandwidth, kernel, norm, alpha=alpha)
    bpass = None
    if whitens(norm):
        bpass = ref.key_grad_pass(k, v, st, st.w_inv.transpose(-1, -2) @ a["dm"], s.bandwidth, kernel, EPS)
    c = ref.landmark_grad(st, a, bpass, n, s.bandwidth, kernel, norm, alpha)
    want = ref.row_grad_pass(grad, q, k, v, st, c, s.bandwidth, kernel, norm, EPS, conv64, alpha)
    return (grad, q, k, v, st, c), conv64, want, s


def _to32(t, dtype=torch.float32):
    """A copy of ``dtype`` (float32: the state and pass C's dict) on DEVICE keeping a head view's token layout
    (a (B, H, N, c) view of (B, N, H·c))."""
    if t is None:
        return None
    if t.dim() == 4 and t.stride(1) < t.stride(2):  # a head view: copy its token buffer
        b, h, n, c = t.shape
        return _heads(t.transpose(1, 2).reshape(b, n, h * c).to(DEVICE, dtype), h)
    return t.to(DEVICE, dtype).contiguous()


def _run(inputs, conv64, s, kernel, norm, tied, dtype=torch.float32, alpha=1.0):
    """The kernel on the inputs cast to ``dtype`` (the conv weight too; the state and pass C's dict float32), dq,
    dk, dv head views of one NaN-filled (B, N, ·) buffer of ``dtype``: (dq, dk, dv, pdl, the buffer's untouched dk
    part when tied)."""
    from laplacianformer.ops.streaming.backward_rows_triton import row_grad_triton

    grad, q, k, v, st, c = inputs
    b, h, n, d = q.shape
    e = v.shape[-1]
    q32 = _to32(q, dtype)
    k32 = q32 if tied else _to32(k, dtype)
    st32 = ref.ForwardState(*(_to32(t) for t in st))
    c32 = {key: _to32(val) for key, val in c.items()}
    conv32 = None if conv64 is None else conv64._replace(tokens=_to32(conv64.tokens, dtype),
                                                         weight=_to32(conv64.weight, dtype))
    buf = torch.full((b, n, 2 * h * d + h * e), float("nan"), device=DEVICE, dtype=dtype)
    dq = _heads(buf[..., :h * d], h)
    dk = _heads(buf[..., h * d:2 * h * d], h)
    dv = _heads(buf[..., 2 * h * d:], h)
    pdl = row_grad_triton(_to32(grad, dtype), q32, k32, _to32(v, dtype), st32, c32, s.bandwidth, kernel, norm, EPS,
                          conv32, dq, None if tied else dk, dv, alpha=alpha)
    return dq, None if tied else dk, dv, pdl, buf[..., h * d:2 * h * d] if tied else None


def _close(got: torch.Tensor, want: torch.Tensor, name: str, tol: float = 1e-4):
    assert torch.isfinite(got).all(), f"{name}: not written everywhere (NaN left)"
    err = ((got.double().cpu() - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()
    assert err < tol, f"{name}: relative max error {err:.2e}"


# (norm, tied, kernel, conv, b, h, hw (grid or N), landmark grid (or m), d, e): every streamed norm, K = Q and K ≠ Q, both
# kernels, m in {4, 6, 16, 49}, N = 70 (10 × 7 and 7 × 10 grids, not a multiple of 32: three splits of one tile),
# d and e not powers of two, e over several 16-column chunks, the conv on 2-D grids that are not square, on a 1-D
# sequence and off
CASES = [
    ("injective", True, "laplacian", "2d", 2, 2, (10, 7), (4, 4), 16, 16),
    ("injective", False, "gaussian", None, 1, 2, (10, 7), (2, 3), 20, 24),
    ("injective", True, "gaussian", "1d", 1, 2, 70, 16, 16, 8),
    ("injective", False, "laplacian", "2d", 1, 1, (7, 10), (7, 7), 16, 16),
    ("inline", True, "laplacian", None, 2, 1, (7, 10), (7, 7), 32, 40),
    ("inline", False, "gaussian", "2d", 1, 2, (10, 7), (2, 2), 16, 16),
    ("inline", True, "gaussian", "1d", 1, 2, 70, 6, 12, 16),
    ("inline", False, "laplacian", None, 2, 1, (10, 7), (2, 2), 16, 24),
    ("inline", False, "gaussian", "1d", 1, 1, 70, 16, 24, 16),
    ("injective", True, "laplacian", "2d", 1, 1, (10, 7), (7, 7), 16, 24),  # the crowded spec: BLOCK_EC = 8
]
PROFILE_CASES = [case for spec in KERNEL_FAMILIES.values()
                 if spec.id in TRITON_KERNEL_IDS and not spec.exp_of_accumulation
                 for case in (("injective", True, spec.name, "2d", 1, 1, (8, 5), (2, 3), 20, 16),
                              ("inline", False, spec.name, None, 1, 1, (8, 5), (2, 3), 16, 8),
                              ("injective", True, spec.name, "2d", 1, 1, (8, 5), (6, 6), 8, 24))]
"""The other kernel families of the Triton profile: K = Q (one A for both factors) with a whitened norm and the
conv, K ≠ Q (two, each with its own distance) without; K = Q whitened with the conv at m = 36 (BLOCK_M = 64,
``row_grad_spec``'s crowded case: e in chunks of 8, three of them at e = 24)."""


def _id(case):
    norm, tied, kernel, conv, b, h, hw, grid, d, e = case
    m = grid[0] * grid[1] if isinstance(grid, tuple) else grid
    return f"{norm}-{'tied' if tied else 'untied'}-{kernel}-conv{conv}-m{m}-d{d}-e{e}"


HALF_TOL = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1e-2}
"""The tolerance of dq, dk, dv written in each dtype (about its half-ulp; pdl stays float32: 1e-4)."""


def _check(case, gen, dtype=torch.float32, alpha=1.0):
    norm, tied, kernel = case[:3]
    inputs, conv64, want, s = _case(gen, *case, dtype=dtype, alpha=alpha)
    dq, dk, dv, pdl, untouched = _run(inputs, conv64, s, kernel, norm, tied, dtype, alpha)
    b, h, n, d = dq.shape
    assert pdl.shape[0] == b * h and pdl.shape[2:] == want["d_marks"].shape[-2:] and pdl.is_contiguous()
    assert dq.dtype == dv.dtype == dtype and pdl.dtype == torch.float32
    _close(dq, want["dq"], "dq", HALF_TOL[dtype])
    _close(dv, want["dv"], "dv", HALF_TOL[dtype])
    _close(pdl.sum(1).view(want["d_marks"].shape), want["d_marks"], "d_marks")
    if tied:
        assert want["dk"] is None and torch.isnan(untouched).all(), "K = Q: the dk part of the buffer was written"
    else:
        _close(dk, want["dk"], "dk", HALF_TOL[dtype])
    return pdl


@pytest.mark.triton
@needs_triton
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_row_grad_equals_the_reference(seeded, case):
    _, gen = seeded
    pdl = _check(case, gen)
    n = case[6][0] * case[6][1] if isinstance(case[6], tuple) else case[6]
    assert pdl.shape[1] == splits_for(n, case[4] * case[5])[0] == 3  # 70 rows: three splits


@pytest.mark.triton
@needs_triton
@pytest.mark.parametrize("case", PROFILE_CASES, ids=_id)
def test_row_grad_of_the_kernel_families(seeded, case):
    """The other families' slope (``_triton_common.kernel_chain`` on the tiles' distances): 40 rows, two splits."""
    _, gen = seeded
    _check(case, gen)


@pytest.mark.triton
@needs_triton
@pytest.mark.parametrize("case", [CASES[1], CASES[6]], ids=_id)
def test_several_tiles_per_split(seeded, monkeypatch, case):
    """Splits of two and three tiles (70 rows, 64-row splits; 100 rows, 96-row splits): the slab of dL added to
    tile after tile (``limits.splits_for`` gives one tile per split to groups this few)."""
    from laplacianformer.ops.streaming import backward_rows_triton as module

    _, gen = seeded
    monkeypatch.setattr(module, "splits_for", lambda n, groups: (-(-n // 64), 64))
    pdl = _check(case, gen)
    assert pdl.shape[1] == 2
    monkeypatch.setattr(module, "splits_for", lambda n, groups: (-(-n // 96), 96))
    norm, tied, kernel, conv, b, h, _, grid, d, e = case
    pdl = _check((norm, tied, kernel, conv if conv != "2d" else None, b, h, 100, 7, d, e), gen)
    assert pdl.shape[1] == 2


# (dtype, case): a whitened norm with K ≠ Q and the conv, a plain one with K = Q, each in float16 and bfloat16
HALF_CASES = [(dtype, case) for dtype in (torch.float16, torch.bfloat16)
              for case in (("injective", False, "laplacian", "2d", 1, 2, (10, 7), (4, 4), 16, 16),
                           ("inline", True, "gaussian", None, 1, 2, (10, 7), (2, 3), 16, 8))]


@pytest.mark.triton
@needs_triton
@pytest.mark.parametrize("dtype,case", HALF_CASES, ids=lambda x: str(x)[6:] if isinstance(x, torch.dtype) else _id(x))
def test_half_inputs_and_outputs(seeded, dtype, case):
    """float16 / bfloat16 G, q, k, v and conv weight read as such, dq, dk, dv written in their dtype: the float64
    reference on the same half values, to about the output dtype's half-ulp (``HALF_TOL``)."""
    _, gen = seeded
    _check(case, gen, dtype)


@pytest.mark.triton
@needs_triton
@pytest.mark.parametrize("case,power", [(CASES[0], 0.5), (CASES[3], 1.0)], ids=lambda x: f"p{x}"
                         if isinstance(x, float) else _id(x))
def test_output_scale_alpha(seeded, case, power):
    """α = N^-p (p = ½ and 1, injective, K = Q and K ≠ Q, with the conv): the reference's passes A, C, D with
    the same α (M = α W⁺ M' in dC_q)."""
    _, gen = seeded
    alpha = output_alpha(case[0], power, 70.0)
    assert alpha < 1.0
    _check(case, gen, alpha=alpha)


@pytest.mark.triton
@needs_triton
def test_deterministic(seeded):
    """Two calls give the same bits (partials per split, no atomics)."""
    _, gen = seeded
    case = ("injective", False, "laplacian", "2d", 1, 2, (10, 7), (4, 4), 16, 16)
    inputs, conv64, _, s = _case(gen, *case)
    first = _run(inputs, conv64, s, "laplacian", "injective", False)[:4]
    second = _run(inputs, conv64, s, "laplacian", "injective", False)[:4]
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.triton
@needs_triton
def test_every_launch_is_enumerated_for_the_aot_check(seeded, record_launches):
    """Each launch of ``row_grad_triton`` (kernel, constexprs, options) is among ``aot_specialisations``, the list
    benchmarks/triton_aot.py compiles and checks for spills (a launcher change cannot bypass it)."""
    from laplacianformer.ops.streaming import backward_rows_triton as module

    enumerated = record_launches.enumerated(module.aot_specialisations())
    half = record_launches.enumerated(spec for spec in module.aot_specialisations() if spec[1]["DQ"] == "*bf16")
    launched = record_launches(module, "row_grad_kernel")
    _, gen = seeded
    for case in [("injective", False, "laplacian", "2d", 1, 1, (5, 8), (2, 3), 8, 24),
                 ("inline", True, "gaussian", None, 1, 1, 40, 33, 16, 8)]:
        inputs, conv64, _, s = _case(gen, *case)
        _run(inputs, conv64, s, case[2], case[0], case[1])
    assert len(launched) == 2 and set(launched) <= enumerated, set(launched) - enumerated
    case = ("injective", True, "gaussian", "1d", 1, 1, 40, 6, 8, 8)  # bfloat16: the *bf16 specialisation
    inputs, conv64, _, s = _case(gen, *case, dtype=torch.bfloat16)
    _run(inputs, conv64, s, case[2], case[0], case[1], torch.bfloat16, alpha=0.5)
    assert len(launched) == 3 and launched[2] in half, launched[2]


def _float32_inline_case(gen):
    """(grad, q, k, v, st, c, settings) of a small inline case (K ≠ Q, 5 × 8 grid, 4 landmarks) in float32: the
    launcher's own inputs for the refusal tests."""
    (grad, q, k, v, st, c), _, _, s = _case(gen, "inline", False, "laplacian", None, 1, 1, (5, 8), (2, 2), 8, 8)
    grad, q, k, v = (t.float() for t in (grad, q, k, v))
    st = ref.ForwardState(*(t.float() for t in st))
    c = {key: None if val is None else val.float() for key, val in c.items()}
    return grad, q, k, v, st, c, s


def test_refusals(seeded):
    """ValueError naming the argument for what the launcher does not serve (raised before any launch)."""
    pytest.importorskip("triton")
    from laplacianformer.ops.streaming.backward_rows_triton import row_grad_triton

    grad, q, k, v, st, c, s = _float32_inline_case(seeded[1])
    out = lambda shape=(1, 1, 40, 8): torch.empty(shape)  # noqa: E731
    args = lambda **kw: dict(dict(grad=grad, qs=q, ks=k, vv=v, st=st, c=c, bandwidth=s.bandwidth,  # noqa: E731
                                  kernel="laplacian", norm="inline", eps=EPS, conv=None, dq=out(), dk=out(),
                                  dv=out()), **kw)
    cases = [
        (args(norm="softmax"), "norm 'softmax' has no streaming form"),
        (args(qs=q.double(), ks=q.double()), "dtype torch.float64"),
        (args(grad=grad.half()), r"grad: expected float32 \(qs's dtype\)"),
        (args(qs=q.bfloat16(), ks=k.bfloat16(), grad=grad.bfloat16(), vv=v.bfloat16()),
         r"dq: expected bfloat16 \(the inputs' dtype\)"),
        (args(alpha=0.5), r"alpha=0.5: norm 'inline' has no whitened part"),
        (args(kernel="cosine"), "kernel 'cosine'"),
        (args(dk=None), "dk: expected None exactly when ks is qs"),
        (args(dq=out((1, 1, 40, 9))), r"dq: expected a \(1, 1, 40, 8\) output"),
        (args(dv=out().transpose(-1, -2).contiguous().transpose(-1, -2)), "dv: expected float32 .* contiguous last"),
        (args(norm="injective"), "c: norm 'injective' whitens"),
        (args(conv=ValueConv(None, (5, 8), torch.zeros(4, 1, 3, 3), None)), r"conv: expected a \(H·e, 1, 3, 3\)"),
        (args(conv=ValueConv(None, (4, 8), torch.zeros(8, 1, 3, 3), None)), r"conv: hw=\(4, 8\) is not a grid"),
    ]
    for kwargs, reason in cases:
        with pytest.raises(ValueError, match="row_grad_triton: " + reason):
            row_grad_triton(**kwargs)


def test_offsets_past_int32_are_refused(seeded, monkeypatch):
    """The kernel addresses each data tensor by one int32 element offset: a tensor spanning more elements is a
    ValueError naming it (the limit lowered here to the test's sizes)."""
    pytest.importorskip("triton")
    from laplacianformer.ops.streaming import backward_rows_triton as module

    grad, q, k, v, st, c, s = _float32_inline_case(seeded[1])
    dv = torch.empty(1, 40, 2, 8)[:, :, 1].unsqueeze(1)  # (1, 1, 40, 8), row stride 16: spans 40·16 − 8 elements
    monkeypatch.setattr(module, "MAX_OFFSET", 40 * 8 - 1)
    with pytest.raises(ValueError, match=r"row_grad_triton: dv: its elements span 631 > 319"):
        module.row_grad_triton(grad, q, k, v, st, c, s.bandwidth, "laplacian", "inline", EPS, None,
                               torch.empty(1, 1, 40, 8), torch.empty(1, 1, 40, 8), dv)


def test_triton_suite_under_interpreter(triton_interpreter):
    if TRITON_HERE:
        pytest.skip("the Triton tests run in this process")
    pytest.importorskip("triton")
    triton_interpreter("tests/ops/test_backward_rows_triton.py", timeout=300.0)

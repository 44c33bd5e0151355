"""Passes A and B of the fused backward in Triton (``ops/streaming/backward_stats_triton.py``) against their
specification, ``backward_reference.query_grad_pass`` and ``key_grad_pass`` run in float64 on the same inputs.

The Triton tests (marked ``triton``: CUDA, or TRITON_INTERPRET=1, which ``test_triton_suite_under_interpreter``
sets in a subprocess) take float32 q, k, v and G as strided head views of (B, N, H·d) token buffers, the float64
forward state (landmark solve and ``forward_state``) cast to float32, and check: the per-split partials summed
over the splits equal dM and Σ G (pass A) and dS', Σ dk̃ (pass B, fed pass A's own partials) for every streamed norm,
the Laplacian and the Gaussian (the other kernel families of the Triton profile: a K ≠ Q injective case each),
K = Q and K ≠ Q, m in {4, 6, 16, 49}, N not a multiple of 32, splits of several tiles, d and e not
powers of two; the conv weight's partials equal the reference's DWConv weight gradient (a 2-D grid that is not
square, a 1-D sequence); two runs are bitwise equal; every launch is among ``aot_specialisations``; sizes the
kernels do not serve are refused with the argument named. float16 and bfloat16 q, k, v, G (and conv tokens and
weight) are read as such: against the reference on the same half values upcast to float64, the float32 partials
keep the float32 tolerance. The output scale α of the whitened norms (``limits.output_alpha``, p = ½ and 1)
scales pass A's dM (and through it pass B); α = 1 is bitwise the call without it.
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
TOL = 1e-4
"""Largest error relative to the float64 reference's largest magnitude."""

needs_triton = pytest.mark.skipif(not TRITON_HERE, reason="needs CUDA or TRITON_INTERPRET=1")


def _heads(gen, b, n, h, width, dtype=torch.float32):
    """A fresh (B, H, N, width) head view of a (B, N, H·width) token buffer of ``dtype`` (strided, last dim
    contiguous)."""
    return torch.randn(b, n, h * width, generator=gen).to(DEVICE, dtype).view(b, n, h, width).transpose(1, 2)


def _case(gen, norm, kernel, tied, b, h, hw, grid, d, e, dtype=torch.float32):
    """Inputs and states: ((grad, qs, ks, vv) of ``dtype``, float32 state, float64 (grad, qs, ks, vv) (the same
    values), float64 state, settings). N = gh·gw (hw a (gh, gw) grid) or hw[1] with hw = (1, N) for a 1-D sequence
    pooled to grid = m."""
    n = hw[0] * hw[1]
    qs = _heads(gen, b, n, h, d, dtype)
    ks = qs if tied else _heads(gen, b, n, h, d, dtype)
    vv = _heads(gen, b, n, h, e, dtype)
    grad = _heads(gen, b, n, h, e, dtype)
    s = AttentionSettings(head_dim=d, kernel=kernel, norm=norm, landmarks=grid)
    f64 = lambda t: t.cpu().double()  # noqa: E731
    q64 = f64(qs)
    k64 = q64 if tied else f64(ks)
    v64 = f64(vv)
    pool_hw = None if isinstance(grid, int) else hw
    marks, w, w_inv = landmark_solve_reference(q64, pool_hw, grid, s.bandwidth, kernel, eps=0.01, iters=30)
    st64 = ref.forward_state(q64, k64, v64, marks, w, w_inv, s.bandwidth, kernel, norm, s.norm_eps)
    st32 = ref.ForwardState(*(t.float().contiguous().to(DEVICE) for t in st64))
    return (grad, qs, ks, vv), st32, (f64(grad), q64, k64, v64), st64, s


def _err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.cpu().double() - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


def _split_sum(part: torch.Tensor, b: int, h: int) -> torch.Tensor:
    """(G, S, ...) partials -> (B, H, ...) sums over the splits."""
    return part.sum(1).reshape(b, h, *part.shape[2:])


# (norm, kernel, tied, b, h, hw, grid, d, e): N = 70 (10 × 7), 150, 300 (splits of two tiles at 32 groups)
CASES = [
    ("injective", "laplacian", True, 2, 2, (10, 7), (2, 3), 16, 8),
    ("injective", "gaussian", False, 1, 2, (10, 7), (4, 4), 20, 20),  # d = 20: the distance loop's tail
    ("injective", "laplacian", False, 1, 1, (15, 10), (7, 7), 16, 16),
    ("injective", "gaussian", True, 8, 4, (20, 15), (2, 2), 8, 8),
    ("inline", "laplacian", False, 1, 2, (10, 7), (4, 4), 16, 16),
    ("inline", "laplacian", True, 2, 1, (10, 7), (4, 4), 16, 8),
    ("inline", "gaussian", False, 1, 1, (15, 10), (7, 7), 16, 12),
    ("inline", "gaussian", True, 1, 2, (8, 5), (2, 3), 16, 8),
] + [("injective", spec.name, False, 1, 1, (8, 5), (2, 3), 20, 8) for spec in KERNEL_FAMILIES.values()
     if spec.id in TRITON_KERNEL_IDS and not spec.exp_of_accumulation]  # the other families: both passes, a case each
CASES.append(("injective", "cauchy", False, 1, 1, (10, 7), (6, 6), 16, 8))  # m = 36: pass B's 16-row tiles (crowded)


def _case_id(c):
    norm, kernel, tied, b, h, hw, grid, d, e = c
    return f"{norm}-{kernel}-{'tied' if tied else 'untied'}-g{b * h}-n{hw[0] * hw[1]}-m{_m(grid)}-d{d}-e{e}"


def _m(grid):
    return grid if isinstance(grid, int) else grid[0] * grid[1]


@pytest.mark.triton
@needs_triton
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_passes_a_and_b_equal_the_reference(seeded, case):
    """Pass A's partials summed over the splits are dM and Σ G; pass B fed them gives dS' and Σ dk̃."""
    from laplacianformer.ops.streaming.backward_stats_triton import key_grad_triton, query_grad_triton

    _, gen = seeded
    norm, kernel, tied, b, h, hw, grid, d, e = case
    (grad, qs, ks, vv), st32, (g64, q64, k64, v64), st64, s = _case(gen, *case)
    assert h == 1 or not (qs.is_contiguous() or vv.is_contiguous() or grad.is_contiguous())  # read in place
    n, m, groups = qs.shape[2], _m(grid), b * h
    splits = splits_for(n, groups)[0]
    a = query_grad_triton(grad, qs, vv, st32, s.bandwidth, kernel, norm)
    want = ref.query_grad_pass(g64, q64, v64, st64, s.bandwidth, kernel, norm)
    assert a["pdm"].shape == (groups, splits, m, e) and a["pg"].shape == (groups, splits, e)
    assert all(t.dtype == torch.float32 for t in (a["pdm"], a["pg"])) and a["pdw"] is None
    assert _err(_split_sum(a["pdm"], b, h), want["dm"]) < TOL
    assert _err(_split_sum(a["pg"], b, h), want["g_sum"]) < TOL
    if not whitens(norm):
        return
    key = key_grad_triton(qs if tied else ks, vv, st32, a["pdm"], s.bandwidth, kernel, s.norm_eps)
    d_mprime = st64.w_inv.transpose(-1, -2) @ want["dm"]
    want_b = ref.key_grad_pass(k64, v64, st64, d_mprime, s.bandwidth, kernel, s.norm_eps)
    assert key["pdsp"].shape == (groups, splits, m, m) and key["pdkt"].shape == (groups, splits, m)
    assert _err(_split_sum(key["pdsp"], b, h), want_b["dsp"]) < TOL
    assert _err(_split_sum(key["pdkt"], b, h), want_b["dkt_sum"]) < TOL


@pytest.mark.triton
@needs_triton
def test_key_pass_takes_dm_in_any_number_of_splits(seeded):
    """Pass B's prologue sums whatever splits dM comes in: the float64 reference's dM in one split (cast to
    float32), and the same in split 0 of three with zeros elsewhere, give the reference's dS' and Σ dk̃."""
    from laplacianformer.ops.streaming.backward_stats_triton import key_grad_triton

    _, gen = seeded
    case = ("injective", "laplacian", False, 1, 2, (10, 7), (4, 4), 16, 8)
    (_, qs, ks, vv), st32, (g64, q64, k64, v64), st64, s = _case(gen, *case)
    dm = ref.query_grad_pass(g64, q64, v64, st64, s.bandwidth, "laplacian", "injective")["dm"]
    want = ref.key_grad_pass(k64, v64, st64, st64.w_inv.transpose(-1, -2) @ dm, s.bandwidth, "laplacian",
                             s.norm_eps)
    one = dm.float().reshape(2, 1, 16, 8).to(DEVICE)
    three = torch.cat([one, torch.zeros(2, 2, 16, 8, device=DEVICE)], dim=1)
    for pdm in (one, three):
        got = key_grad_triton(ks, vv, st32, pdm, s.bandwidth, "laplacian", s.norm_eps)
        assert _err(_split_sum(got["pdsp"], 1, 2), want["dsp"]) < TOL
        assert _err(_split_sum(got["pdkt"], 1, 2), want["dkt_sum"]) < TOL


def _conv_case(gen, hw, n, b, h, e, bias, dtype=torch.float32):
    """V as the head view of (B, N, H·e) tokens and its ValueConv (tokens, weight and bias of ``dtype``), and the
    same values in float64."""
    tokens = torch.randn(b, n, h * e, generator=gen).to(DEVICE, dtype)
    weight = torch.randn(h * e, 1, 3, 3, generator=gen).to(DEVICE, dtype)
    conv_bias = torch.randn(h * e, generator=gen).to(DEVICE, dtype) if bias else None
    vv = tokens.view(b, n, h, e).transpose(1, 2)
    t64 = tokens.cpu().double()
    conv64 = ValueConv(t64, hw, weight.cpu().double(), None if conv_bias is None else conv_bias.cpu().double())
    return vv, ValueConv(tokens, hw, weight, conv_bias), t64.view(b, n, h, e).transpose(1, 2), conv64


@pytest.mark.triton
@needs_triton
@pytest.mark.parametrize("norm,hw,n,grid", [("injective", (10, 7), 70, (2, 3)), ("inline", None, 40, 4)],
                         ids=["injective-10x7", "inline-1d"])
def test_conv_weight_partials_equal_the_reference(seeded, norm, hw, n, grid):
    """dweight[h·e + j, 0, t // 3, t % 3] = Σ_b Σ_s pdw[b·H + h, s, t, j] equals the reference's DWConv weight
    gradient (the (1, N) grid for a 1-D sequence, where the taps of the top and bottom rows are 0), and the
    other partials are those of the call without a conv."""
    from laplacianformer.ops.streaming.backward_stats_triton import query_grad_triton

    _, gen = seeded
    b, h, d, e = 2, 2, 16, 8
    qs = _heads(gen, b, n, h, d)
    grad = _heads(gen, b, n, h, e)
    vv, conv, v64, conv64 = _conv_case(gen, hw, n, b, h, e, bias=hw is not None)
    s = AttentionSettings(head_dim=d, norm=norm, landmarks=grid)
    q64, g64 = qs.cpu().double(), grad.cpu().double()
    marks, w, w_inv = landmark_solve_reference(q64, hw, grid, s.bandwidth, s.kernel, eps=0.01, iters=30)
    st64 = ref.forward_state(q64, q64, v64, marks, w, w_inv, s.bandwidth, s.kernel, norm, s.norm_eps)
    st32 = ref.ForwardState(*(t.float().contiguous().to(DEVICE) for t in st64))
    got = query_grad_triton(grad, qs, vv, st32, s.bandwidth, s.kernel, norm, conv)
    want = ref.query_grad_pass(g64, q64, v64, st64, s.bandwidth, s.kernel, norm, conv64)
    pdw = got["pdw"]
    assert pdw.shape == (b * h, splits_for(n, b * h)[0], 9, e)
    dweight = pdw.reshape(b, h, -1, 9, e).sum((0, 2)).permute(0, 2, 1).reshape(h * e, 1, 3, 3)
    assert _err(dweight, want["dweight"]) < TOL
    if hw is None:
        assert not dweight[:, :, 0::2].any()  # the (1, N) grid: no neighbour above or below
    plain = query_grad_triton(grad, qs, vv, st32, s.bandwidth, s.kernel, norm)
    for name in ("pdm", "pg"):
        assert (got[name] is None and plain[name] is None) or torch.equal(got[name], plain[name])


@pytest.mark.triton
@needs_triton
def test_two_runs_are_bitwise_equal(seeded):
    """Fixed splits summed in a fixed order, no atomics: the same bits twice (pass A of both norms with the conv,
    pass B)."""
    from laplacianformer.ops.streaming.backward_stats_triton import key_grad_triton, query_grad_triton

    _, gen = seeded
    (grad, qs, ks, _), st32, *_rest, s = _case(gen, "injective", "gaussian", False, 1, 2, (10, 7), (4, 4), 16, 8)
    vv, conv, *_ = _conv_case(gen, (10, 7), 70, 1, 2, 8, bias=True)
    runs = [query_grad_triton(grad, qs, vv, st32, s.bandwidth, "gaussian", norm, conv)
            for norm in ("injective", "injective", "inline", "inline")]
    for one, two in (runs[:2], runs[2:]):
        for name, t in one.items():
            assert (t is None and two[name] is None) or torch.equal(t, two[name]), name
    keys = [key_grad_triton(ks, vv, st32, runs[0]["pdm"], s.bandwidth, "gaussian", s.norm_eps) for _ in range(2)]
    assert all(torch.equal(keys[0][name], keys[1][name]) for name in keys[0])


@pytest.mark.triton
@needs_triton
def test_every_launch_is_enumerated_for_the_aot_check(seeded, record_launches):
    """Each launch of both launchers (kernel, constexprs, options) is among ``aot_specialisations``, the list
    benchmarks/triton_aot.py compiles and checks for spills (a launcher change cannot bypass it)."""
    from laplacianformer.ops.streaming import backward_stats_triton as bw

    enumerated = record_launches.enumerated(bw.aot_specialisations())
    half = record_launches.enumerated(spec for spec in bw.aot_specialisations() if spec[1]["V"] == "*bf16")
    launched = record_launches(bw, "query_grad_kernel", "key_grad_kernel")
    _, gen = seeded
    for case in [("injective", "laplacian", False, 1, 1, (8, 5), (7, 7), 16, 24),
                 ("inline", "gaussian", True, 1, 1, (8, 5), (2, 2), 16, 8)]:
        (grad, qs, ks, vv), st32, *_rest, s = _case(gen, *case)
        a = bw.query_grad_triton(grad, qs, vv, st32, s.bandwidth, case[1], case[0])
        if whitens(case[0]):
            bw.key_grad_triton(ks, vv, st32, a["pdm"], s.bandwidth, case[1], s.norm_eps)
    (grad, qs, _, _), st32, *_rest, s = _case(gen, "inline", "laplacian", True, 1, 2, (8, 5), (2, 2), 16, 8)
    vv, conv, *_ = _conv_case(gen, (8, 5), 40, 1, 2, 8, bias=False)
    bw.query_grad_triton(grad, qs, vv, st32, s.bandwidth, "laplacian", "inline", conv)
    assert len(launched) == 4 and set(launched) <= enumerated, set(launched) - enumerated
    assert any(("CONV", "True") in meta for name, meta, *_ in launched if name == "query_grad_kernel")
    # bfloat16 data: both kernels' launches among the specialisations whose data pointers are typed *bf16
    case = ("injective", "gaussian", False, 1, 1, (8, 5), (2, 2), 16, 8)
    (grad, qs, ks, vv), st32, *_rest, s = _case(gen, *case, dtype=torch.bfloat16)
    a = bw.query_grad_triton(grad, qs, vv, st32, s.bandwidth, "gaussian", case[0], alpha=0.5)
    bw.key_grad_triton(ks, vv, st32, a["pdm"], s.bandwidth, "gaussian", s.norm_eps)
    assert len(launched) == 6 and set(launched[4:]) <= half, set(launched[4:]) - half


@pytest.mark.triton
@needs_triton
def test_sizes_not_served_are_refused(seeded):
    """ValueError naming the argument (nothing launched)."""
    from laplacianformer.ops.streaming.backward_stats_triton import key_grad_triton, query_grad_triton

    _, gen = seeded
    (grad, qs, ks, vv), st32, *_rest, s = _case(gen, "injective", "laplacian", False, 1, 1, (8, 5), (2, 2), 16, 8)
    args = (s.bandwidth, "laplacian")
    with pytest.raises(ValueError, match="norm 'bogus'"):
        query_grad_triton(grad, qs, vv, st32, *args, "bogus")
    with pytest.raises(ValueError, match="query_grad_triton: grad must be float32"):
        query_grad_triton(grad[..., :4], qs, vv, st32, *args, "injective")
    with pytest.raises(ValueError, match=r"query_grad_triton: grad must be float32 .*qs's dtype"):
        query_grad_triton(grad.half(), qs, vv, st32, *args, "injective")
    with pytest.raises(ValueError, match="query_grad_triton: vv must be bfloat16"):
        query_grad_triton(grad.bfloat16(), qs.bfloat16(), vv, st32, *args, "injective")
    with pytest.raises(ValueError, match="key_grad_triton: vv must be float16"):
        key_grad_triton(ks.half(), vv, st32, torch.zeros(1, 2, 4, 8, device=DEVICE), *args, s.norm_eps)
    with pytest.raises(ValueError, match=r"query_grad_triton: alpha=0.5: norm 'inline' has no whitened part"):
        query_grad_triton(grad, qs, vv, st32, *args, "inline", alpha=0.5)
    with pytest.raises(ValueError, match=r"query_grad_triton: alpha=nan"):
        query_grad_triton(grad, qs, vv, st32, *args, "injective", alpha=float("nan"))
    with pytest.raises(ValueError, match="dtype torch.float64"):
        query_grad_triton(grad.double(), qs.double(), vv.double(), st32, *args, "injective")
    with pytest.raises(ValueError, match="st.w_inv must be float32"):
        query_grad_triton(grad, qs, vv, st32._replace(w_inv=st32.w_inv.double()), *args, "injective")
    copy = ValueConv(torch.randn(1, 40, 8), (8, 5), torch.randn(8, 1, 3, 3), None)  # vv is not its head view
    with pytest.raises(ValueError, match="not the head view of the conv's tokens"):
        query_grad_triton(grad, qs, vv, st32, *args, "injective", copy)
    pdm = torch.zeros(1, 2, 4, 8, device=DEVICE)
    with pytest.raises(ValueError, match="key_grad_triton: pdm must be float32"):
        key_grad_triton(ks, vv, st32, pdm[..., :3], *args, s.norm_eps)
    with pytest.raises(ValueError, match="d=129"):
        key_grad_triton(torch.zeros(1, 1, 40, 129, device=DEVICE), vv, st32, pdm, *args, s.norm_eps)


# (dtype, norm, kernel, tied, conv): K ≠ Q with the whitened norm (pass B) and the conv, K = Q with inline
HALF_CASES = [(dtype, *case) for dtype in (torch.float16, torch.bfloat16)
              for case in (("injective", "laplacian", False, True), ("inline", "gaussian", True, False))]


@pytest.mark.triton
@needs_triton
@pytest.mark.parametrize("case", HALF_CASES, ids=lambda c: f"{str(c[0])[6:]}-{c[1]}-{'tied' if c[3] else 'untied'}"
                         f"{'-conv' if c[4] else ''}")
def test_half_inputs_equal_the_reference_on_their_values(seeded, case):
    """float16 / bfloat16 G, q, k, v (and the conv's tokens and weight) read as such: the partials (float32)
    equal the float64 reference on the same half values to the float32 tolerance (no rounding to half anywhere:
    the products and sums run in float32)."""
    from laplacianformer.ops.streaming.backward_stats_triton import key_grad_triton, query_grad_triton

    _, gen = seeded
    dtype, norm, kernel, tied, with_conv = case
    b, h, hw, grid, d, e = 1, 2, (10, 7), (2, 3), 16, 8
    (grad, qs, ks, vv), st32, (g64, q64, k64, v64), st64, s = _case(gen, norm, kernel, tied, b, h, hw, grid, d, e,
                                                                   dtype)
    conv = conv64 = None
    if with_conv:  # V the head view of the conv's half tokens, the state from those values
        vv, conv, v64, conv64 = _conv_case(gen, hw, 70, b, h, e, bias=True, dtype=dtype)
        st64 = ref.forward_state(q64, k64, v64, st64.marks, st64.w, st64.w_inv, s.bandwidth, kernel, norm,
                                 s.norm_eps)
        st32 = ref.ForwardState(*(t.float().contiguous().to(DEVICE) for t in st64))
    assert all(t.dtype == dtype for t in (grad, qs, ks, vv))
    a = query_grad_triton(grad, qs, vv, st32, s.bandwidth, kernel, norm, conv)
    want = ref.query_grad_pass(g64, q64, v64, st64, s.bandwidth, kernel, norm, conv64)
    assert all(t is None or t.dtype == torch.float32 for t in a.values())
    assert _err(_split_sum(a["pdm"], b, h), want["dm"]) < TOL
    assert _err(_split_sum(a["pg"], b, h), want["g_sum"]) < TOL
    if with_conv:
        dweight = a["pdw"].reshape(b, h, -1, 9, e).sum((0, 2)).permute(0, 2, 1).reshape(h * e, 1, 3, 3)
        assert _err(dweight, want["dweight"]) < TOL
    if whitens(norm):
        key = key_grad_triton(ks, vv, st32, a["pdm"], s.bandwidth, kernel, s.norm_eps)
        want_b = ref.key_grad_pass(k64, v64, st64, st64.w_inv.transpose(-1, -2) @ want["dm"], s.bandwidth, kernel,
                                   s.norm_eps)
        assert _err(_split_sum(key["pdsp"], b, h), want_b["dsp"]) < TOL
        assert _err(_split_sum(key["pdkt"], b, h), want_b["dkt_sum"]) < TOL


@pytest.mark.triton
@needs_triton
@pytest.mark.parametrize("norm,power", [("injective", 0.5), ("injective", 1.0)])
def test_output_scale_alpha(seeded, norm, power):
    """α = N^-p (p = ½, 1): pass A's dM is α Σ cᵀ dt (``query_grad_pass(..., alpha=)``), the conv's and Σ G's
    partials unchanged; pass B fed it gives the reference's dS' and Σ dk̃ of that dM. α = 1 (p = 0) is bitwise the
    call without ``alpha``."""
    from laplacianformer.ops.streaming.backward_stats_triton import key_grad_triton, query_grad_triton

    _, gen = seeded
    b, h, hw, grid, d, e = 1, 2, (10, 7), (2, 3), 16, 8
    (grad, qs, ks, _), _, (g64, q64, k64, _), st64, s = _case(gen, norm, "laplacian", False, b, h, hw, grid, d, e)
    vv, conv, v64, conv64 = _conv_case(gen, hw, 70, b, h, e, bias=True)
    st64 = ref.forward_state(q64, k64, v64, st64.marks, st64.w, st64.w_inv, s.bandwidth, "laplacian", norm, s.norm_eps)
    st32 = ref.ForwardState(*(t.float().contiguous().to(DEVICE) for t in st64))
    alpha = output_alpha(norm, power, 70.0)
    assert alpha < 1.0 and output_alpha(norm, 0.0, 70.0) == 1.0
    a = query_grad_triton(grad, qs, vv, st32, s.bandwidth, "laplacian", norm, conv, alpha=alpha)
    want = ref.query_grad_pass(g64, q64, v64, st64, s.bandwidth, "laplacian", norm, conv64, alpha=alpha)
    assert _err(_split_sum(a["pdm"], b, h), want["dm"]) < TOL
    one = query_grad_triton(grad, qs, vv, st32, s.bandwidth, "laplacian", norm, conv, alpha=1.0)
    plain = query_grad_triton(grad, qs, vv, st32, s.bandwidth, "laplacian", norm, conv)
    for name in ("pg", "pdw"):
        assert torch.equal(a[name], plain[name]), name
    assert all(torch.equal(one[name], plain[name]) for name in ("pdm", "pg", "pdw"))
    key = key_grad_triton(ks, vv, st32, a["pdm"], s.bandwidth, "laplacian", s.norm_eps)
    want_b = ref.key_grad_pass(k64, v64, st64, st64.w_inv.transpose(-1, -2) @ want["dm"], s.bandwidth, "laplacian",
                               s.norm_eps)
    assert _err(_split_sum(key["pdsp"], b, h), want_b["dsp"]) < TOL
    assert _err(_split_sum(key["pdkt"], b, h), want_b["dkt_sum"]) < TOL


def test_triton_suite_under_interpreter(triton_interpreter):
    if TRITON_HERE:
        pytest.skip("the Triton tests run in this process")
    pytest.importorskip("triton")
    triton_interpreter("tests/ops/test_backward_stats_triton.py", timeout=300.0)

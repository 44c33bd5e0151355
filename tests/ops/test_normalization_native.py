"""The C (``ops/normalization/cpu.py``) and Triton (``ops/normalization/triton.py``) backends of the op
``normalization`` against the plain PyTorch composite ``normalize_nystrom_reference``: values, every
gradient (C_q, C_k or B, W⁺, V), gradcheck, second backward, thread count, dispatch.

The Triton tests are marked ``triton``: they run for real on CUDA, and on a CPU machine
``test_triton_suite_under_interpreter`` reruns them under TRITON_INTERPRET=1 in a subprocess.
"""

from __future__ import annotations

import inspect
import os

import pytest
import torch

from laplacianformer.ops import explain, use
from laplacianformer.ops.normalization import (NORMALIZATION, normalize_nystrom, normalize_nystrom_reference,
                                               normalize_nystrom_scaled)

TRITON_HERE = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NORMS = ["injective", "inline"]
# (groups, n_q, n_k, m, e): odd sizes, n past the C sub-block (32 rows) and chunk sizes, m past a vector
SHAPES = [((2, 3), 11, 13, 5, 4), ((2,), 70, 45, 20, 17), ((1,), 300, 257, 49, 33), ((3,), 9, 9, 1, 1)]


def _cpu_available() -> bool:
    from laplacianformer.ops.normalization import cpu as normalization_cpu

    return normalization_cpu.available()


needs_c = pytest.mark.skipif(not _cpu_available(), reason="no C compiler")


def _factors(seeded, groups, n_q, n_k, m, e, with_w, dtype=torch.float64, device="cpu"):
    _, gen = seeded
    c = torch.rand(*groups, n_q, m, generator=gen, dtype=torch.float64)
    k = torch.rand(*groups, n_k, m, generator=gen, dtype=torch.float64)
    v = torch.randn(*groups, n_k, e, generator=gen, dtype=torch.float64)
    w = torch.randn(*groups, m, m, generator=gen, dtype=torch.float64) / m**0.5 if with_w else None
    return [None if t is None else t.to(device, dtype).requires_grad_() for t in (c, k, v, w)]


def _compare(backend, seeded, shape, norm, with_w, dtype=torch.float64, device="cpu", rtol=1e-9):
    c, k, v, w = _factors(seeded, *shape, with_w, dtype, device)
    with use(normalization=backend):
        out = normalize_nystrom(c, k, v, norm, w_inv=w)
    leaves = [t for t in (c, k, v, w) if t is not None]
    ref_leaves = [t.detach().double().cpu().requires_grad_() for t in leaves]
    rc, rk, rv, *rw = ref_leaves
    ref = normalize_nystrom_reference(rc, rk @ rw[0].transpose(-1, -2) if rw else rk, rv, norm)
    probe = torch.randn(ref.shape, generator=seeded[1], dtype=torch.float64)
    grads = torch.autograd.grad(out, leaves, probe.to(device, dtype))
    ref_grads = torch.autograd.grad(ref, ref_leaves, probe)
    for name, a, r in zip(["out", "dc", "dk", "dv", "dw"], [out, *grads], [ref, *ref_grads]):
        err = ((a.double().cpu() - r).norm() / r.norm().clamp_min(1e-30)).item()
        assert err < rtol, f"{backend} {name}: relative error {err:.2e} (seed {seeded[0]})"


@needs_c
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("with_w", [True, False], ids=["w_inv", "b"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, (*s[0], *s[1:]))))
def test_cpu_equals_reference_float64(seeded, shape, norm, with_w):
    _compare("cpu", seeded, shape, norm, with_w)


@needs_c
@pytest.mark.parametrize("norm", NORMS)
def test_cpu_float32_and_large_n(seeded, norm):
    _compare("cpu", seeded, ((2,), 3000, 2100, 49, 32), norm, True, dtype=torch.float32, rtol=2e-5)


@needs_c
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("with_w", [True, False], ids=["w_inv", "b"])
def test_cpu_gradcheck(seeded, norm, with_w):
    c, k, v, w = _factors(seeded, (2,), 7, 8, 4, 3, with_w)
    args = [t for t in (c, k, v, w) if t is not None]

    def f(c, k, v, *w):
        with use(normalization="cpu"):
            return normalize_nystrom(c, k, v, norm, 1e-3, w_inv=w[0] if w else None)

    assert torch.autograd.gradcheck(f, args)


@needs_c
def test_cpu_second_backward_recomputes_and_threads_do_not_matter(seeded):
    """t = k̃ S' kept by the forward becomes dC_k in place: a second backward (retain_graph) recomputes it
    and gives the same gradients; one and two threads give bit-identical results (fixed summation order)."""
    c, k, v, w = _factors(seeded, (2,), 700, 650, 49, 32, True, dtype=torch.float32)
    probe = torch.randn(2, 700, 32, generator=seeded[1])
    results = []
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            with use(normalization="cpu"):
                out = normalize_nystrom(c, k, v, "injective", w_inv=w)
            first = torch.autograd.grad(out, (c, k, v, w), probe, retain_graph=True)
            second = torch.autograd.grad(out, (c, k, v, w), probe)
            for a, b in zip(first, second):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
            results.append([out, *first])
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(*results):
        assert torch.equal(a, b)


@needs_c
def test_cpu_broadcast_w_and_strided_rows(seeded):
    """One W⁺ for all heads (stride-0 batch) and V a strided view: no copies needed, same as the reference."""
    _, gen = seeded
    c = torch.rand(2, 3, 40, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.rand(2, 3, 40, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    w = torch.randn(1, 1, 6, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    vv = torch.randn(2, 40, 3, 10, generator=gen, dtype=torch.float64, requires_grad=True)
    v = vv.transpose(1, 2)[..., :7]
    with use(normalization="cpu"):
        out = normalize_nystrom(c, k, v, "injective", w_inv=w)
    ref = normalize_nystrom_reference(c, k @ w.transpose(-1, -2), v, "injective")
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-12)
    for a, b in zip(torch.autograd.grad(out.sum(), (c, k, w, vv)), torch.autograd.grad(ref.sum(), (c, k, w, vv))):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


@needs_c
def test_cpu_constant_keys_and_nearly_constant_queries():
    """All keys equal (s_j = 0, r = eps^-1/2) and c = const + 1e-3 noise in float32 (the covariance is
    shifted, not E[ccᵀ] − c̄c̄ᵀ): as close to the float64 reference as the float32 composite."""
    gen = torch.Generator().manual_seed(0)
    c = torch.rand(1, 11, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.rand(1, 1, 5, generator=gen, dtype=torch.float64).expand(1, 11, 5).clone().requires_grad_()
    v = torch.randn(1, 11, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    with use(normalization="cpu"):
        out = normalize_nystrom(c, k, v, "injective")
    ref = normalize_nystrom_reference(c, k, v, "injective")
    torch.testing.assert_close(out, ref, rtol=1e-8, atol=1e-10)
    for a, b in zip(torch.autograd.grad(out.sum(), (c, k, v)), torch.autograd.grad(ref.sum(), (c, k, v))):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-9)
    c = 0.7 + 1e-3 * torch.rand(2, 3000, 6, generator=gen, dtype=torch.float64)
    k = torch.rand(2, 3000, 6, generator=gen, dtype=torch.float64)
    v = torch.randn(2, 3000, 5, generator=gen, dtype=torch.float64)
    ref = normalize_nystrom_reference(c, k, v, "injective")
    with use(normalization="cpu"):
        out = normalize_nystrom(c.float(), k.float(), v.float(), "injective")
    composite = normalize_nystrom_reference(c.float(), k.float(), v.float(), "injective")
    rel = lambda x: ((x.double() - ref).norm() / ref.norm()).item()  # noqa: E731
    assert rel(out) < 1e-3 and rel(out) <= 2 * rel(composite)


@needs_c
def test_cpu_is_chosen_automatically_and_refusals():
    x = torch.rand(2, 9, 4)
    assert NORMALIZATION.select(x, x, x, "injective", 1e-6, None).name == "cpu"
    assert NORMALIZATION.select(x, x, x, "rowsum", 1e-6, None).name == "composite"
    with use(normalization="cpu"), pytest.raises(ValueError, match="dtype torch.float16"):
        normalize_nystrom(x.half(), x.half(), x.half(), "injective")
    with use(normalization="cpu"), pytest.raises(ValueError, match="mixed dtypes"):
        normalize_nystrom(x, x.double(), x, "injective")
    if not TRITON_HERE:
        with use(normalization="triton"), pytest.raises(ValueError, match="not cuda"):
            normalize_nystrom(x, x, x, "injective")


@needs_c
def test_attention_default_runs_cpu_backend_and_equals_reference():
    from laplacianformer import laplacian_attention
    from laplacianformer.ops import use

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 64, 8, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out = laplacian_attention(q, k, v, hw=(8, 8), landmarks=(3, 3))
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    with use(normalization="composite"):
        ref = laplacian_attention(q, k, v, hw=(8, 8), landmarks=(3, 3))
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-11)
    for a, b in zip(grads, torch.autograd.grad(ref.sum(), (q, k, v))):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


@needs_c
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("with_w", [True, False], ids=["w_inv", "b"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, (*s[0], *s[1:]))))
def test_cpu_scale_in_the_pass_equals_the_scaled_reference(seeded, shape, norm, with_w):
    """``normalize_nystrom_scaled`` (the §4.6 scale in the C pass, alpha M) against v̄ + alpha (Z V − v̄) of the
    reference, float64; a gradient refuses alpha."""
    c, k, v, w = (None if t is None else t.detach() for t in _factors(seeded, *shape, with_w))
    alpha = 1.0 / v.shape[-2]
    out, in_pass = normalize_nystrom_scaled(c, k, v, norm, w_inv=w, alpha=alpha)
    assert in_pass
    ref = normalize_nystrom_reference(c, k @ w.transpose(-1, -2) if w is not None else k, v, norm)
    v_bar = v.mean(-2, keepdim=True)
    torch.testing.assert_close(out, v_bar + alpha * (ref - v_bar), rtol=1e-9, atol=1e-12)
    with use(normalization="composite"):
        unscaled, in_pass = normalize_nystrom_scaled(c, k, v, norm, w_inv=w, alpha=alpha)
    assert not in_pass  # a backend without a scaled form returns Z V for the caller to scale
    torch.testing.assert_close(unscaled, ref, rtol=1e-9, atol=1e-12)
    from laplacianformer.ops.normalization.cpu import normalize_cpu

    flat = [t.reshape(-1, *t.shape[-2:]).requires_grad_() for t in (c, k, v)]
    with pytest.raises(ValueError, match="alpha"):
        normalize_cpu(*flat, norm, 1e-6, None, alpha=alpha)


@needs_c
@pytest.mark.parametrize("norm_scale", ["inv_n", "inv_sqrt_n", "one"])
def test_inference_with_the_scale_in_the_pass_equals_the_composite(norm_scale):
    """The operator without a gradient, whose C normalisation applies the §4.6 scale in its pass, against the
    composite normalisation scaled by ``scale_whitened`` (float64)."""
    from laplacianformer import laplacian_attention

    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, 64, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    kw = dict(hw=(8, 8), landmarks=(3, 3), norm_scale=norm_scale)
    with torch.no_grad():
        out = laplacian_attention(q, k, v, **kw)
        with use(normalization="composite"):
            ref = laplacian_attention(q, k, v, **kw)
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-11)


# --- Triton (marked; CUDA or TRITON_INTERPRET=1) ---

needs_triton = pytest.mark.skipif(not TRITON_HERE, reason="needs CUDA or TRITON_INTERPRET=1")


@pytest.mark.triton
@needs_triton
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("with_w", [True, False], ids=["w_inv", "b"])
@pytest.mark.parametrize("shape", SHAPES[:3], ids=lambda s: "x".join(map(str, (*s[0], *s[1:]))))
def test_triton_equals_reference(seeded, shape, norm, with_w):
    _compare("triton", seeded, shape, norm, with_w, torch.float64, DEVICE)
    _compare("triton", seeded, shape, norm, with_w, torch.float32, DEVICE, rtol=2e-5)


@pytest.mark.triton
@needs_triton
@pytest.mark.parametrize("norm", NORMS)
def test_triton_gradcheck_and_second_backward(seeded, norm):
    c, k, v, w = _factors(seeded, (2,), 7, 8, 4, 3, True, device=DEVICE)

    def f(c, k, v, w):
        with use(normalization="triton"):
            return normalize_nystrom(c, k, v, norm, 1e-3, w_inv=w)

    assert torch.autograd.gradcheck(f, (c, k, v, w), fast_mode=True)  # fast: the interpreter is slow
    out = f(c, k, v, w)
    probe = torch.randn_like(out)
    first = torch.autograd.grad(out, (c, k, v, w), probe, retain_graph=True)
    for a, b in zip(first, torch.autograd.grad(out, (c, k, v, w), probe)):
        torch.testing.assert_close(a, b)


@pytest.mark.triton
@needs_triton
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_triton_half_inputs(seeded, dtype, norm):
    """float16 / bfloat16 inputs (float32 accumulation): output and gradients in the input dtype, within
    the dtype's rounding of the float64 reference on the same (rounded) inputs, values and every gradient."""
    c, k, v, w = _factors(seeded, (2,), 40, 33, 9, 8, True, dtype=dtype, device=DEVICE)
    with use(normalization="triton"):
        out = normalize_nystrom(c, k, v, norm, w_inv=w)
    assert out.dtype == dtype
    leaves = (c, k, v, w)
    probe = torch.randn(out.shape, generator=seeded[1], dtype=torch.float64)
    grads = torch.autograd.grad(out, leaves, probe.to(DEVICE, dtype))
    assert all(g.dtype == dtype for g in grads)
    ref_leaves = [t.detach().double().cpu().requires_grad_() for t in leaves]
    rc, rk, rv, rw = ref_leaves
    ref = normalize_nystrom_reference(rc, rk @ rw.transpose(-1, -2), rv, norm)
    tol = 2e-3 if dtype == torch.float16 else 1.5e-2  # measured 3e-4 and 4e-3 (seeds 0-2): the output rounding
    for name, a, r in zip(["out", "dc", "dk", "dv", "dw"], [out, *grads],
                          [ref, *torch.autograd.grad(ref, ref_leaves, probe)]):
        err = ((a.double().cpu() - r).norm() / r.norm()).item()
        assert err < tol, f"{dtype} {norm} {name}: relative error {err:.2e} (seed {seeded[0]})"


@pytest.mark.triton
@needs_triton
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
def test_triton_at_the_largest_width(seeded, dtype, norm):
    """m = e = TRITON_MAX_DIM (the widest tiles the registry serves, no column masked) and row counts
    that give the Gram passes several row blocks per split and a partial last split, and the row passes a
    partial last block: against the float64 reference, values and every gradient, for the first backward
    (t kept by the forward), a second one through the same graph (t recomputed) and the forward without
    gradient (t not kept)."""
    from laplacianformer.ops.normalization.limits import TRITON_MAX_DIM

    m = e = TRITON_MAX_DIM
    c, k, v, w = _factors(seeded, (2,), 300, 270, m, e, True, dtype, DEVICE)
    rtol = 1e-9 if dtype == torch.float64 else 2e-5
    leaves = (c, k, v, w)
    ref_leaves = [t.detach().double().cpu().requires_grad_() for t in leaves]
    rc, rk, rv, rw = ref_leaves
    ref = normalize_nystrom_reference(rc, rk @ rw.transpose(-1, -2), rv, norm)
    probe = torch.randn(ref.shape, generator=seeded[1], dtype=torch.float64)
    ref_grads = torch.autograd.grad(ref, ref_leaves, probe)
    with use(normalization="triton"):
        out = normalize_nystrom(c, k, v, norm, w_inv=w)
        with torch.no_grad():
            out_no_grad = normalize_nystrom(c, k, v, norm, w_inv=w)
    first = torch.autograd.grad(out, leaves, probe.to(DEVICE, dtype), retain_graph=True)
    second = torch.autograd.grad(out, leaves, probe.to(DEVICE, dtype))

    def check(what, a, r):
        err = ((a.double().cpu() - r).norm() / r.norm()).item()
        assert err < rtol, f"{dtype} {norm} {what}: relative error {err:.2e} (seed {seeded[0]})"

    check("out", out, ref)
    check("out without gradient", out_no_grad, ref)
    for name, a, b, r in zip(["dc", "dk", "dv", "dw"], first, second, ref_grads):
        check(name, a, r)
        check(f"{name} (second backward)", b, r)


@pytest.mark.triton
@needs_triton
def test_triton_launches_are_among_the_aot_specialisations(seeded, monkeypatch):
    """Every launch configuration of a forward + backward and a forward without gradient (both norms,
    float32 and float64, m and e between powers of two) is one that ``aot_specialisations`` enumerates."""
    from laplacianformer.ops.normalization import triton as nt

    launched = []
    real = nt._launch

    def record(spec):
        launched.append(spec)
        return real(spec)

    monkeypatch.setattr(nt, "_launch", record)
    for dtype, (m, e), norm in ((torch.float32, (49, 33), "injective"), (torch.float64, (5, 40), "inline")):
        c, k, v, w = _factors(seeded, (1,), 5, 6, m, e, True, dtype, DEVICE)
        with use(normalization="triton"):
            normalize_nystrom(c, k, v, norm, w_inv=w).sum().backward()
            with torch.no_grad():
                normalize_nystrom(c, k, v, norm)

    def key(spec):
        meta, opts = real(spec)
        return (tuple(sorted((n, str(x)) for n, x in meta.items())), opts["num_warps"], opts["num_stages"],
                opts["maxnreg"])

    enumerated = {(tuple(sorted((n, str(x)) for n, x in meta.items())), warps, stages, options["maxnreg"])
                  for _, _, meta, warps, stages, _, options in nt.aot_specialisations()}
    missing = [s for s in launched if key(s) not in enumerated]
    assert len(launched) > 15 and not missing, missing


def test_triton_aot_specialisations_cover_the_launchers():
    pytest.importorskip("triton")
    from laplacianformer.ops.normalization import triton as nt
    from laplacianformer.ops.normalization.limits import TRITON_MAX_DIM

    specs = list(nt.aot_specialisations())
    labels = [s[5] for s in specs]
    assert len(labels) == len(set(labels))
    assert {x.split()[0] for x in labels} == {"norm_gram", "norm_key_fwd", "norm_key_bwd", "norm_rows"}
    fields = [dict(w.split("=") for w in x.split()[1:]) for x in labels]
    assert {f["dtype"] for f in fields} == {"fp32", "fp16", "bf16", "fp64"}
    assert max(int(f["m"]) for f in fields) == max(int(f.get("e", 0)) for f in fields) == TRITON_MAX_DIM
    # the model's call (m = 49 landmarks, head dim 64, float32) is the launcher's configuration
    model = [s for s in specs if s[5] == "norm_key_bwd dtype=fp32 m=64 e=64 inj=1 has_t=1"]
    meta, opts = nt._launch(nt.key_bwd_spec(49, 64, torch.float32, True, True))
    assert len(model) == 1 and model[0][2] == meta
    assert model[0][3:5] == (opts["num_warps"], opts["num_stages"]) and model[0][6] == {"maxnreg": opts["maxnreg"]}
    for kernel, sig, constexprs, warps, stages, label, _ in specs:
        # a JITFunction's parameters; under TRITON_INTERPRET=1 an InterpretedFunction, which has only the function
        params = [p.name for p in kernel.params] if hasattr(kernel, "params") else list(
            inspect.signature(kernel.fn).parameters)
        assert set(sig) | set(constexprs) == set(params), label
        assert warps in (4, 8) and stages in (1, 3), label
    small = list(nt.aot_specialisations(d_max=32, m_max=16))
    assert small and all("m=16" in s[5].split() and "e=64" not in s[5] for s in small)


def test_triton_refuses_m_or_e_beyond_the_compiled_range(monkeypatch):
    """Beyond TRITON_MAX_DIM the registry's Triton refusal gives the reason, "auto" takes the next backend,
    forcing Triton raises it, and so does the launcher itself."""
    from laplacianformer.ops import _runtime
    from laplacianformer.ops.normalization.limits import TRITON_MAX_DIM, triton_unfit

    monkeypatch.setattr(_runtime, "triton_interpreted", lambda: True)  # CPU tensors pass the device check
    big = TRITON_MAX_DIM + 1
    c, v = torch.rand(2, 20, 16), torch.rand(2, 20, 8)
    c_big, v_big = torch.rand(2, 20, big), torch.rand(2, 20, big)
    refusal = NORMALIZATION.by_name["triton"].refusal
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        assert refusal(c.to(dtype), c.to(dtype), v.to(dtype), "injective", 1e-6, None) in (
            None, _runtime.triton_available()[1])
        assert triton_unfit(dtype, TRITON_MAX_DIM, TRITON_MAX_DIM) is None
    why = refusal(c, c, v_big, "injective", 1e-6, None)
    assert why == triton_unfit(torch.float32, 16, big) and f"e={big}" in why and f"<= {TRITON_MAX_DIM}" in why
    assert f"m={big}" in refusal(c_big, c_big, v, "inline", 1e-6, None)
    assert NORMALIZATION.select(c, c, v_big, "injective", 1e-6, None).name != "triton"
    # where the C loops do not serve either (float16 here, CUDA tensors on a GPU) "auto" runs PyTorch
    half = (c.half(), c.half(), v_big.half())
    assert NORMALIZATION.select(*half, "injective", 1e-6, None).name == "fused"
    assert f"triton: {why}" in explain("normalization", *half, "injective", 1e-6, None)
    with use(normalization="triton"), pytest.raises(ValueError, match=f"e={big}"):
        normalize_nystrom(c, c, v_big, "injective")
    if _runtime.triton_available()[0]:
        from laplacianformer.ops.normalization.triton import normalize_triton

        with pytest.raises(ValueError, match=f"m={big}"):
            normalize_triton(c_big, c_big, v, "injective", 1e-6, None)


def test_triton_suite_under_interpreter(triton_interpreter):
    if TRITON_HERE:
        pytest.skip("the Triton tests run in this process")
    pytest.importorskip("triton")
    triton_interpreter("tests/ops/test_normalization_native.py", timeout=600.0)

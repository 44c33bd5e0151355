"""The backend registry (ops/dispatch.py) and the runtime switch (ops/_runtime.py), for every op:
forcing a backend that cannot serve raises ValueError with the reason, automatic selection runs the
first serving backend, ``explain`` names every backend, ``explain_all`` reports the operator's calls;
and the ops package has no import cycle."""

from __future__ import annotations

import ast
import threading
from pathlib import Path

import pytest
import torch

import laplacianformer.ops as ops
from laplacianformer.ops import _runtime, dispatch, grid_cpu
from laplacianformer.ops.pooling import POOLING, pool_landmarks
from laplacianformer.ops.kernel import KERNEL, KERNEL_MATMUL, laplace_kernel, laplace_kernel_matmul, native
from laplacianformer.ops.newton_schulz import NEWTON_SCHULZ, NEWTON_SCHULZ_GRAD, implicit_grad, newton_schulz_iterate
from laplacianformer.ops.newton_schulz import native as ns_native
from laplacianformer.ops.newton_schulz import regularise, regularised_inverse
from laplacianformer.ops.normalization import NORMALIZATION, normalize_nystrom

OPS_DIR = Path(ops.__file__).parent
ALL_OPS = ("kernel", "kernel_matmul", "newton_schulz", "newton_schulz_grad", "normalization", "pooling")


def _spd(batch, m, dtype=torch.float64, seed=0):
    x = torch.randn(batch, m, 8, generator=torch.Generator().manual_seed(seed), dtype=dtype) * 0.3
    return regularise(torch.exp(-torch.cdist(x, x, p=1.0) / 4.0), 0.01)


@pytest.fixture
def no_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


@pytest.fixture
def interpreter_env(monkeypatch):
    """TRITON_INTERPRET=1 for the refusal checks only (no Triton kernel is defined or run here)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def test_every_op_is_registered_with_its_reference_last():
    assert set(ALL_OPS) <= set(ops.op_names())
    refs = {"kernel": "composite", "kernel_matmul": "composite", "newton_schulz": "torch",
            "newton_schulz_grad": "torch", "normalization": "composite", "pooling": "adaptive_avg_pool"}
    for name, ref in refs.items():
        op = dispatch.get_op(name)
        assert op.reference == ref == op.backends[-1].name
        assert _runtime.ops()[name] == (tuple(b.name for b in op.backends), ref)
    with pytest.raises(ValueError, match="^op: expected one of"):
        dispatch.get_op("softmax")


# --- forcing a backend that cannot serve raises ValueError with the reason, for every op -----------------


def test_kernel_forced_refusals(no_interpreter):
    x = torch.randn(1, 2, 10, 4)
    with ops.use(kernel="triton"), pytest.raises(ValueError, match=r"^backend: 'triton' cannot run this kernel call: .*not cuda"):
        laplace_kernel(x, x)
    with ops.use(kernel="cpu"), pytest.raises(ValueError, match=r"cannot run this kernel call: dtype torch.float16"):
        laplace_kernel(x.half(), x.half())
    with ops.use(kernel="cpu"), pytest.raises(ValueError, match=r"mixed dtypes"):
        laplace_kernel_matmul(x, x, x.double())


def test_kernel_triton_size_limits(interpreter_env):
    x, wide = torch.randn(1, 10, 4), torch.randn(1, 10, 130)
    with ops.use(kernel="triton"):
        with pytest.raises(ValueError, match=r"cannot run this kernel call: d=130 > 128 \(the most the Triton kernels take"):
            laplace_kernel(wide, wide)
        with pytest.raises(ValueError, match=r"cannot run this kernel_matmul call: e=200 > 128 .*spills"):
            laplace_kernel_matmul(x, x, torch.randn(1, 10, 200))
        with pytest.raises(ValueError, match=r"cannot run this kernel call: dtype torch.float64"):
            laplace_kernel(x.double(), x.double())


def test_kernel_onnx_export_refuses_custom_kernels(monkeypatch):
    monkeypatch.setattr(torch.onnx, "is_in_onnx_export", lambda: True)
    x = torch.randn(1, 10, 4)
    with ops.use(kernel="cpu"), pytest.raises(ValueError, match="torch.onnx export in progress"):
        laplace_kernel(x, x)
    assert KERNEL.select(x, x, 4.0, "laplacian").name == "composite"


def test_newton_schulz_forced_refusals(no_interpreter, interpreter_env):
    p = _spd(2, 6)
    with ops.use(newton_schulz="triton"):
        with pytest.raises(ValueError, match=r"^backend: 'triton' cannot run this newton_schulz call: m=130 > 128"):
            newton_schulz_iterate(_spd(1, 130, torch.float32), 20)
        with pytest.raises(ValueError, match=r"newton_schulz call: tol given"):
            newton_schulz_iterate(p.float(), 20, 1e-3)
        with pytest.raises(ValueError, match=r"newton_schulz call: symmetric=False"):
            newton_schulz_iterate(p.float(), 20, None, False)
        # through the public solver too: forcing Triton with m > 128 raises, like the kernel with d > 128
        with pytest.raises(ValueError, match=r"m=130 > 128"):
            regularised_inverse(_spd(1, 130, torch.float32), iters=5)
    with ops.use(newton_schulz="cpu"):
        with pytest.raises(ValueError, match=r"^backend: 'cpu' cannot run this newton_schulz call: dtype torch.float16"):
            newton_schulz_iterate(p.half(), 20)
        with pytest.raises(ValueError, match=r"requires grad"):
            newton_schulz_iterate(p.clone().requires_grad_(), 20)
        with pytest.raises(ValueError, match=r"symmetric=False"):
            newton_schulz_iterate(p, 20, None, False)


def test_newton_schulz_triton_refused_on_cpu_without_interpreter(no_interpreter):
    p = _spd(2, 6, torch.float32)
    with ops.use(newton_schulz="triton"), pytest.raises(ValueError, match="not cuda"):
        newton_schulz_iterate(p, 20)
    with ops.use(newton_schulz_grad="triton"), pytest.raises(
            ValueError, match=r"^backend: 'triton' cannot run this newton_schulz_grad call: .*not cuda"):
        implicit_grad(p, p)


def test_newton_schulz_cpu_refused_without_the_library(monkeypatch):
    monkeypatch.setattr(ns_native.LIBRARY, "load", lambda: None)
    monkeypatch.setattr(ns_native.LIBRARY, "_error", "no C compiler (cc/gcc) on PATH")
    with ops.use(newton_schulz="cpu"), pytest.raises(ValueError, match=r"C loop unavailable \(no C compiler"):
        newton_schulz_iterate(_spd(2, 6), 20)


def test_normalization_forced_refusals():
    c, b, v = (torch.randn(2, 9, 4) for _ in range(3))
    with ops.use(normalization="fused"):
        with pytest.raises(ValueError, match=r"^backend: 'fused' cannot run this normalization call: norm 'rowsum'"):
            normalize_nystrom(c, b, v, "rowsum")
        with pytest.raises(ValueError, match="empty input"):
            normalize_nystrom(c[:, :0], b[:, :0], v[:, :0], "injective")
        assert normalize_nystrom(c, b, v, "inline").shape == (2, 9, 4)


def test_pooling_backends_always_serve_and_agree():
    x = torch.randn(2, 3, 6 * 8, 5, dtype=torch.float64)
    outs = []
    for name in ("matmul", "adaptive_avg_pool"):
        with ops.use(pooling=name):
            outs.append(pool_landmarks(x, (6, 8), (3, 4)))
        assert POOLING.reasons(x, (6, 8), (3, 4))[name] is None
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-12, atol=1e-12)


# --- automatic selection runs the first backend that serves -------------------------------------------


from laplacianformer.ops.normalization import cpu as norm_native  # noqa: E402


def _first_serving(op, *inputs):
    return next(b.name for b in op.backends if b.refusal(*inputs) is None and b.auto_refusal(*inputs) is None)


def test_auto_picks_the_first_serving_backend(no_interpreter):
    x = torch.randn(1, 2, 10, 4)
    fast = "cpu" if native.available() else "composite"
    cases = [
        (KERNEL, (x, x, 4.0, "laplacian"), fast),
        (KERNEL, (x.half(), x.half(), 4.0, "laplacian"), "composite"),
        (KERNEL_MATMUL, (x, x, x, 4.0, "laplacian"), fast),
        (NEWTON_SCHULZ, (_spd(2, 6), 20, None, True), "cpu" if ns_native.available() else "torch"),
        (NEWTON_SCHULZ, (_spd(2, 6), 20, None, False), "torch"),
        (NEWTON_SCHULZ_GRAD, (_spd(2, 6), _spd(2, 6)), "torch"),
        (NORMALIZATION, (x, x, x, "injective", 1e-6, None), "cpu" if norm_native.available() else "fused"),
        (NORMALIZATION, (x.half(), x.half(), x.half(), "injective", 1e-6, None), "fused"),
        (NORMALIZATION, (x, x, x, "rowsum", 1e-6, None), "composite"),
        (POOLING, (x, None, 5), "cpu" if grid_cpu.available() else "matmul"),
        (POOLING, (x.detach().requires_grad_(), None, 5), "matmul"),  # the C loop is forward only
    ]
    for op, inputs, expected in cases:
        assert op.select(*inputs).name == expected == _first_serving(op, *inputs), (op.name, expected)


def test_auto_skips_the_triton_interpreter_and_naive(interpreter_env):
    x = torch.randn(1, 10, 4)
    reasons = KERNEL.reasons(x, x, 4.0, "laplacian")
    assert "only chosen automatically for CUDA" in reasons["triton"]
    assert "ground truth for tests" in reasons["naive"]
    assert KERNEL.select(x, x, 4.0, "laplacian").name != "triton"


def test_auto_fallback_logs_once(caplog):
    import logging

    _runtime.forget_logged()
    x = torch.randn(1, 7, 3, dtype=torch.float16)
    with caplog.at_level(logging.INFO, logger="laplacianformer.ops.kernel"):
        laplace_kernel(x, x)
        laplace_kernel(x, x)
    assert len([r for r in caplog.records if "falling back" in r.getMessage()]) == 1


# --- explain -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL_OPS)
def test_explain_names_every_backend(name):
    x, m = torch.randn(1, 2, 16, 4), _spd(2, 5, torch.float32)
    inputs = {
        "kernel": (x, x), "kernel_matmul": (x, x, x), "newton_schulz": (m,), "newton_schulz_grad": (m, m),
        "normalization": (x, x, x, "injective"), "pooling": (x, (4, 4), (2, 2)),
    }[name]
    op = dispatch.get_op(name)
    text = ops.explain(name, *inputs)
    chosen = op.select(*inputs).name
    assert text.splitlines()[0] == f"{name}: selection 'auto' runs {chosen!r}"
    for b in op.backends:
        assert (f"  {b.name}: " in text) or b.name == chosen, text
    with ops.use(reference=True):
        assert ops.explain(name, *inputs).splitlines()[0] == f"{name}: selection {op.reference!r} runs {op.reference!r}"


def test_explain_reports_a_refused_forced_backend(no_interpreter):
    x = torch.randn(1, 10, 4)
    with ops.use(kernel="triton"):
        text = ops.explain("kernel", x, x)
    assert text.startswith("kernel: selection 'triton' refused: backend: 'triton' cannot run") and "not cuda" in text


def test_explain_all_reports_every_call_of_the_operator():
    q, k, v = (torch.randn(1, 2, 36, 8) for _ in range(3))
    text = ops.explain_all(q, k, v, hw=(6, 6), landmarks=(3, 3))
    for name in ("pooling", "kernel", "newton_schulz", "normalization"):
        assert f"] {name}: selection 'auto' runs" in text, text
    # landmark_solve, pool, W, solve, streaming, C_k, C_q, norm
    assert "newton_schulz_grad" not in text and " 8 dispatched calls" in text
    assert "] landmark_solve: selection 'auto' runs 'steps'" in text, text
    assert "] streaming: selection 'auto' runs 'steps'" in text, text
    text = ops.explain_all(q.requires_grad_(), k, v, hw=(6, 6), landmarks=(3, 3))
    assert "newton_schulz_grad: selection 'auto' runs" in text and q.grad is None
    with ops.use(reference=True):
        text = ops.explain_all(q, k, v, hw=(6, 6), landmarks=(3, 3))
    for name, ref in (("pooling", "adaptive_avg_pool"), ("kernel", "composite"), ("newton_schulz", "torch"),
                      ("normalization", "composite")):
        assert f"{name}: selection {ref!r} runs {ref!r}" in text, text
    with ops.use(kernel="naive", normalization="fused"):
        text = ops.explain_all(q, k, v, hw=(6, 6), landmarks=(3, 3), norm="rowsum")
    assert text.splitlines()[-1].startswith("stopped: backend: 'fused' cannot run this normalization call: norm 'rowsum'")


# --- the runtime switch --------------------------------------------------------------------------------


def test_use_nests_and_reference_mode_covers_every_op():
    assert all(_runtime.choice(op) == "auto" for op in ALL_OPS)
    with ops.use(reference=True):
        assert [_runtime.choice(op) for op in ALL_OPS] == [dispatch.get_op(op).reference for op in ALL_OPS]
        with ops.use(kernel="cpu"):
            assert _runtime.choice("kernel") == _runtime.choice("kernel_matmul") == "cpu"
            assert _runtime.choice("pooling") == "adaptive_avg_pool"
            with ops.use(reference=False):
                assert all(_runtime.choice(op) == "auto" for op in ALL_OPS)
        assert _runtime.choice("kernel") == "composite"
    assert all(_runtime.choice(op) == "auto" for op in ALL_OPS)
    with pytest.raises(ValueError, match=r"^kernel: expected one of \['auto', 'triton', 'cpu', 'naive', 'composite'\]"):
        with ops.use(kernel="fast"):
            pass
    with pytest.raises(ValueError, match="^softmax: expected an op among"):
        with ops.use(softmax="auto"):
            pass


def test_use_is_thread_local():
    seen = {}
    with ops.use(normalization="composite"):
        worker = threading.Thread(target=lambda: seen.update(choice=_runtime.choice("normalization")))
        worker.start()
        worker.join()
        assert _runtime.choice("normalization") == "composite"
    assert seen["choice"] == "auto"


def test_use_is_the_one_way_to_force_a_backend():
    """No op keeps a switch of its own (docs/DESIGN.md §6.4): the selection API of earlier releases is gone."""
    import laplacianformer.ops.attention as attention
    import laplacianformer.ops.kernel as kernel
    import laplacianformer.ops.normalization as normalization

    for module, name in ((kernel, "set_backend"), (kernel, "backend"), (kernel, "explain_dispatch"),
                         (attention, "reference_pooling"), (normalization, "reference_normalization")):
        assert not hasattr(module, name), name
    assert not (OPS_DIR / "kernel" / "backend.py").exists()
    with ops.use(kernel="composite", normalization="composite", pooling="adaptive_avg_pool"):
        assert [_runtime.choice(op) for op in ("kernel", "kernel_matmul", "newton_schulz", "normalization",
                                               "pooling")] == ["composite", "composite", "auto", "composite",
                                                               "adaptive_avg_pool"]


def test_capture_reason_names_the_mode(monkeypatch):
    from torch.utils.flop_counter import FlopCounterMode

    assert _runtime.capture_reason() is None
    with FlopCounterMode(display=False):
        assert "dispatch or function mode" in _runtime.capture_reason()
        assert _runtime.capture_reason(modes=False) is None
    monkeypatch.setattr(torch.onnx, "is_in_onnx_export", lambda: True)
    assert _runtime.capture_reason(modes=False) == "torch.onnx export in progress" and _runtime.capturing()


def test_stream_capture_is_a_capture_reason_and_skips_the_data_dependent_checks(monkeypatch):
    """Under CUDA-graph stream capture (faked here: no GPU) the data-dependent mask check, a host
    synchronisation that capture forbids, is skipped; ``streams=False`` callers still run eagerly."""
    from laplacianformer.ops.validation import check_key_padding_mask

    all_padding = torch.tensor([[True, True], [False, True]])
    with pytest.raises(ValueError, match="all padding"):
        check_key_padding_mask(all_padding, 2, 2)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert "CUDA graph" in _runtime.capture_reason() and _runtime.capturing(modes=False)
    assert _runtime.capture_reason(streams=False) is None
    assert check_key_padding_mask(all_padding, 2, 2) is all_padding


# --- no import cycles inside ops -----------------------------------------------------------------------


def _module_name(path: Path) -> str:
    rel = path.relative_to(OPS_DIR.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["laplacianformer", *parts])


def _import_graph() -> dict[str, set[str]]:
    """Module -> the ops modules it imports explicitly, anywhere in its code (lazy imports included)."""
    files = {_module_name(p): p for p in OPS_DIR.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package
                for _ in range(node.level - 1):
                    base = base.rsplit(".", 1)[0]
                base = (base + "." + node.module if node.module else base) if node.level else node.module
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            graph[name].update(t for t in targets if t in files and t != name)
    return graph


def test_no_import_cycles_inside_ops():
    graph = _import_graph()
    assert "laplacianformer.ops._runtime" in graph and not graph["laplacianformer.ops._runtime"]
    state: dict[str, int] = {}

    def visit(node, path):
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    # the direction of the former wrong-way imports
    assert not any(m.startswith("laplacianformer.ops.normalization") or m.startswith("laplacianformer.ops.kernel")
                   for m in graph["laplacianformer.ops.newton_schulz"] | graph["laplacianformer.ops.newton_schulz.naive"])
    assert graph["laplacianformer.ops.kernel.triton"] <= {"laplacianformer.ops.layout", "laplacianformer.ops.kernel._autograd",
                                                          "laplacianformer.ops.kernel.limits",
                                                          "laplacianformer.ops._triton_common"}
    assert not graph["laplacianformer.ops._triton_common"]  # the shared @triton.jit blocks: a leaf
    assert not graph["laplacianformer.ops.kernel.limits"]  # pure Python: the registry reads it without Triton


def test_nested_recordings_both_see_the_calls():
    x = torch.randn(1, 8, 3)
    with _runtime.recording() as outer:
        with _runtime.recording() as inner:
            laplace_kernel(x, x)
        laplace_kernel(x, x)
    assert len(inner) == 1 and len(outer) == 2 and not _runtime.is_recording()


def test_kernel_matmul_triton_refuses_the_unfit_backward(interpreter_env):
    """benchmarks/triton_aot.py found no spill-free configuration for one backward: the registry refuses it
    when a gradient may be needed, and serves the forward alone."""
    pytest.importorskip("triton")
    from laplacianformer.ops.kernel import KERNEL_MATMUL

    x = torch.randn(1, 10, 50, dtype=torch.bfloat16)  # d in (32, 64], e in (64, 128]: ops/kernel/limits.py
    v = torch.randn(1, 10, 100, dtype=torch.bfloat16)
    assert KERNEL_MATMUL.reasons(x, x, v, 4.0, "gaussian")["triton"].startswith("not chosen automatically")
    wide = torch.randn(1, 10, 100, dtype=torch.bfloat16, requires_grad=True)  # d = 100 fits since the d chunks
    assert KERNEL_MATMUL.reasons(wide, wide, v, 4.0, "gaussian")["triton"].startswith("not chosen automatically")
    xg = x.clone().requires_grad_()
    why = KERNEL_MATMUL.reasons(xg, x, v, 4.0, "gaussian")["triton"]
    assert "no launch configuration compiles without register spills" in why
    assert KERNEL_MATMUL.reasons(xg, x, v, 4.0, "laplacian")["triton"].startswith("not chosen automatically")
    with torch.no_grad():
        assert KERNEL_MATMUL.reasons(xg, x, v, 4.0, "gaussian")["triton"].startswith("not chosen automatically")

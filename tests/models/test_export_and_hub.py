"""torch.compile and ONNX (onnxruntime) against eager, and the save_pretrained/from_pretrained round trip."""

import laplacianformer

import json

import numpy as np
import pytest
import torch

from laplacianformer.hub import from_pretrained, read_config, save_pretrained
from laplacianformer.models import create_model, list_models
from laplacianformer.ops import use


def _small(**kw):
    torch.manual_seed(0)
    return create_model("laplacianformer_micro", num_classes=6, depths=(1, 1, 1, 1), **kw).eval()


@pytest.mark.parametrize(
    "compile_backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)]
)
def test_torch_compile_fullgraph_matches_eager_on_plain_pytorch_path(compile_backend):
    """Dynamo captures the whole model in one graph; inductor codegen (minutes on 2 cores) is slow-marked."""
    torch._dynamo.reset()
    model = _small()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad(), use(kernel="composite", newton_schulz="torch", newton_schulz_grad="torch"):
        ref = model(x)
        out = torch.compile(model, fullgraph=True, backend=compile_backend)(x)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


def _graph_targets(gm: torch.fx.GraphModule) -> set[str]:
    """Every call_function target of a graph module and its nested graph modules (HOP bodies)."""
    return {str(n.target) for m in gm.modules() if isinstance(m, torch.fx.GraphModule)
            for n in m.graph.nodes if n.op == "call_function"}


GRAPH_OPS = {"laplacianformer.laplace_kernel.default", "laplacianformer.regularised_inverse.default"}


def test_torch_compile_fullgraph_default_runtime_uses_the_custom_ops():
    """No backend forced: the compiler sees ``laplacianformer::laplace_kernel`` / ``regularised_inverse``
    (not the dispatch code nor the C kernels' own ops) and the output equals eager within 1e-4."""
    torch._dynamo.reset()
    model = _small()
    x = torch.randn(2, 3, 64, 64)
    seen: set[str] = set()

    def backend(gm, example_inputs):
        seen.update(_graph_targets(gm))
        return gm.forward

    with torch.no_grad():
        ref = model(x)
        torch.compile(model, fullgraph=True, backend=backend)(x)
        torch._dynamo.reset()
        out = torch.compile(model, fullgraph=True, backend="aot_eager")(x)
    assert GRAPH_OPS <= seen, seen
    assert not any("laplace_kernel_cpu" in t for t in seen), seen
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


def test_torch_compile_training_step_matches_eager():
    """Gradients through the custom ops' backward (``..._backward`` ops) match eager (float64, so the
    comparison sees formulas, not float32 rounding of the compiled graph's composite normalisation)."""
    torch._dynamo.reset()
    model = _small().train().double()
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64)
    grads = []
    for fn in (model, torch.compile(model, fullgraph=True, backend="aot_eager")):
        model.zero_grad()
        fn(x).square().sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.slow) if n in ("laplacianformer_large", "laplacianformer_huge") else n
    for n in list_models()
])  # large and huge repeat medium's blocks and take minutes to trace on 2 cores: in the slow set
def test_torch_export_of_every_registered_model(name):
    """``torch.export.export`` at a small input; the exported program runs the custom ops and equals eager
    (float64: the deep sizes' float32 logits differ by the rounding of the traced composite normalisation)."""
    torch.manual_seed(0)
    model = create_model(name, num_classes=5).eval().double()
    x = torch.randn(1, 3, 64, 64, dtype=torch.float64)
    program = torch.export.export(model, (x,))
    assert any("laplace_kernel" in t for t in _graph_targets(program.graph_module))
    with torch.no_grad():
        torch.testing.assert_close(program.module()(x), model(x), rtol=1e-9, atol=1e-9)


def _ort_run(path, x):
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]


def test_onnx_export_dynamic_hw_where_the_model_supports_it(tmp_path):
    """The exact kernel (landmarks=None) makes no per-size choice: batch, H and W are all dynamic."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from laplacianformer.models.export import export_onnx, static_hw_reason

    model = _small(attn_kwargs=dict(landmarks=None))
    assert static_hw_reason(model) is None
    path = tmp_path / "exact.onnx"
    export_onnx(model, path, torch.randn(1, 3, 64, 64), dynamic_hw=True)
    x = torch.randn(3, 3, 96, 80)
    with torch.no_grad():
        ref = model(x).numpy()
    np.testing.assert_allclose(_ort_run(path, x), ref, rtol=1e-4, atol=1e-4)


def test_save_load_round_trip_is_identical(tmp_path):
    model = _small(attn_kwargs=dict(lam=2.0, landmarks=(3, 3)), stem_stride=2, in_chans=1)
    x = torch.randn(2, 1, 32, 48)
    laplacianformer.save_pretrained(model, tmp_path / "m")
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["config.json", "model.safetensors"]
    loaded = laplacianformer.from_pretrained(tmp_path / "m").eval()
    assert read_config(tmp_path / "m") == json.loads(json.dumps(model.config))
    assert loaded.config["attn_kwargs"] == {"lam": 2.0, "landmarks": (3, 3), "norm_scale": "inv_n"}
    assert loaded.config["stem_stride"] == 2
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
    assert list(model.state_dict()) == list(loaded.state_dict())
    for (ka, va), (kb, vb) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert ka == kb and torch.equal(va, vb)
    # the name's cfg travels with the weights, describing them (6 classes, 1 channel)
    assert loaded.pretrained_cfg == dict(model.pretrained_cfg, num_classes=6, input_size=(1, 224, 224), label_names=None)
    again = laplacianformer.from_pretrained(laplacianformer.save_pretrained(loaded, tmp_path / "m2"))
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), again.state_dict().values()))


def test_models_have_no_save_load_methods():
    """Saving/loading is a layer above the models (docs/MODELS.md): functions of ``laplacianformer.hub``;
    tests/test_architecture.py checks that no module of ``models`` imports it."""
    model = _small()
    assert not hasattr(model, "save_pretrained") and not hasattr(model, "from_pretrained")


def test_from_pretrained_overrides_for_finetuning_and_variants(tmp_path):
    model = _small()
    save_pretrained(model, tmp_path)
    assert read_config(tmp_path)["num_classes"] == 6
    ft = from_pretrained(tmp_path, num_classes=2)
    assert ft.head.out_features == 2
    assert torch.equal(ft.stages[0].blocks[0].mlp.fc1.weight, model.stages[0].blocks[0].mlp.fc1.weight)
    assert ft.pretrained_cfg["num_classes"] == 2
    soft = from_pretrained(tmp_path, attn="softmax")
    assert soft.attn == "softmax" and torch.equal(soft.head.weight, model.head.weight)


def test_hub_errors_name_the_argument(tmp_path):
    with pytest.raises(FileNotFoundError, match="^path: no config.json"):
        from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text('{"format": "other"}')
    with pytest.raises(ValueError, match="^path: "):
        from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(ValueError, match="^path: .*config.json is not valid JSON"):
        from_pretrained(tmp_path)
    with pytest.raises(TypeError, match="^model: expected a LaplacianFormer"):
        save_pretrained(torch.nn.Linear(2, 2), tmp_path / "x")

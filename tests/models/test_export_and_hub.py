"""torch.compile and ONNX (onnxruntime) against eager, and the save_pretrained/from_pretrained round trip."""

import laplacianformer

import json

import numpy as np
import pytest
import torch

from laplacianformer.hub import from_pretrained, read_config, save_pretrained
from laplacianformer.models import create_model
from laplacianformer.ops.kernel.backend import backend as kernel_backend


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
    with torch.no_grad(), kernel_backend("composite"):
        ref = model(x)
        out = torch.compile(model, fullgraph=True, backend=compile_backend)(x)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


def test_onnx_export_matches_eager(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from laplacianformer.models.export import export_onnx

    model = _small()
    x = torch.randn(1, 3, 64, 64)
    path = tmp_path / "micro.onnx"
    export_onnx(model, path, x)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    out = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    with torch.no_grad():
        ref = model(x).numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_save_load_round_trip_is_identical(tmp_path):
    model = _small(attn_kwargs=dict(lam=2.0, landmarks=(3, 3)), stem_stride=2, in_chans=1)
    x = torch.randn(2, 1, 32, 48)
    laplacianformer.save_pretrained(model, tmp_path / "m")
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["config.json", "model.safetensors"]
    loaded = laplacianformer.from_pretrained(tmp_path / "m").eval()
    assert read_config(tmp_path / "m") == json.loads(json.dumps(model.config))
    assert loaded.config["attn_kwargs"] == {"lam": 2.0, "landmarks": (3, 3)} and loaded.config["stem_stride"] == 2
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
    tests/models/test_layering.py checks that no module of ``models`` imports it."""
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
    with pytest.raises(TypeError, match="^model: expected a LaplacianFormer"):
        save_pretrained(torch.nn.Linear(2, 2), tmp_path / "x")

"""ONNX export of the default (landmark) models with dynamic batch, height and width (TorchScript exporter):
onnxruntime equals eager mode within 1e-4 relative (max|ort - eager| / max|eager|) at the export size and at
sizes where the landmark grid is cut (a stage smaller than 7x7), where the exact kernel replaces it, and
non-multiples of 7 (models/export.py); the features_only backbone: test_export_backbone_onnx.py."""

import numpy as np
import pytest
import torch

from laplacianformer.models import create_model

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

SMALL = dict(depths=(1, 1, 1, 1), embed_dims=(16, 32, 64, 128), num_heads=(1, 2, 2, 4))
# (B, H, W): export size; stage 4 of 2x2 and stage 3 of 3x3 tokens (landmarks cover them: exact kernel);
# 16x25 tokens at stage 1 (non-multiples of 7) and stage 4 of 2x4; stage 4 of 4x4 (128 px); a grid cut
# to (4, 7) at stage 4 (4x8 tokens, Nyström) and 30x57 tokens at stage 1
SIZES = [(1, 96, 96), (2, 40, 48), (3, 64, 100), (1, 128, 128), (1, 120, 230)]


def _relative(out, ref) -> float:
    return float(np.abs(out - ref).max() / np.abs(ref).max())


def _session(path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _check(model, path, sizes):
    session = _session(path)
    name = session.get_inputs()[0].name
    for b, h, w in sizes:
        x = torch.randn(b, 3, h, w)
        with torch.no_grad():
            refs = model(x)
        refs = [t.numpy() for t in (refs if isinstance(refs, (list, tuple)) else [refs])]
        outs = session.run(None, {name: x.numpy()})
        assert len(outs) == len(refs)
        for out, ref in zip(outs, refs):
            assert out.shape == ref.shape, (h, w)
            assert _relative(out, ref) < 1e-4, ((b, h, w), _relative(out, ref))


def test_classifier_exports_with_dynamic_batch_height_width_by_default(tmp_path):
    from laplacianformer.models.export import export_onnx, static_hw_reason

    torch.manual_seed(0)
    model = create_model("laplacianformer_micro", num_classes=5, **SMALL).eval()
    assert static_hw_reason(model) is None
    path = tmp_path / "micro.onnx"
    export_onnx(model, path, torch.randn(1, 3, 96, 96))
    _check(model, path, SIZES)


def test_static_export_and_refusals(tmp_path):
    from laplacianformer.models.export import export_onnx

    torch.manual_seed(0)
    model = create_model("laplacianformer_micro", num_classes=5, attn="softmax", **SMALL).eval()
    with pytest.raises(ValueError, match="^example: expected a \\(B, C, H, W\\) tensor"):
        export_onnx(model, tmp_path / "x.onnx", torch.randn(3, 64, 64))
    path = tmp_path / "static.onnx"
    export_onnx(model, path, torch.randn(2, 3, 64, 64), dynamic_batch=False, dynamic_hw=False)
    session = _session(path)
    assert [d for d in session.get_inputs()[0].shape] == [2, 3, 64, 64]
    _check(model, path, [(2, 64, 64)])


def test_accurate_reductions_rewrites_means_and_brings_onnxruntime_to_torch_accuracy():
    """A mean over 5120 values: onnxruntime's own ReduceMean is several times further from float64 than torch's;
    after ``accurate_reductions`` it is within 3x of torch's (same graph output otherwise)."""
    import onnx
    from onnx import TensorProto, helper

    from laplacianformer.models.export import accurate_reductions

    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [-2])
    graph = helper.make_graph([helper.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=1)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5120, 49])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 1, 49])], [axes])
    plain = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    better = onnx.ModelProto()
    better.CopyFrom(plain)
    assert accurate_reductions(better) == 1
    onnx.checker.check_model(better)
    x = (np.random.default_rng(0).random((2, 5120, 49)) * 0.5 + 0.3).astype(np.float32)
    truth = x.astype(np.float64).mean(-2, keepdims=True)
    errors = {}
    for name, m in (("plain", plain), ("better", better)):
        y = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        errors[name] = _relative(y, truth)
    errors["torch"] = _relative(torch.from_numpy(x).mean(-2, keepdim=True).numpy(), truth)
    assert errors["plain"] > 3 * errors["torch"], errors
    assert errors["better"] < 3 * errors["torch"], errors


@pytest.mark.slow
def test_dynamo_exporter_also_exports_every_size(tmp_path):
    """``dynamo=True`` (torch.export-based; minutes on 2 cores): the same sizes within 1e-4."""
    pytest.importorskip("onnxscript")
    from laplacianformer.models.export import export_onnx

    torch.manual_seed(0)
    model = create_model("laplacianformer_micro", num_classes=5, **SMALL).eval()
    path = tmp_path / "dynamo.onnx"
    export_onnx(model, path, torch.randn(1, 3, 96, 96), dynamo=True)
    _check(model, path, SIZES)

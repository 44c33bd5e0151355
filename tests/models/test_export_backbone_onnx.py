"""The features_only backbone (timm's feature extraction, as the detectors use it) exports with dynamic batch,
height and width: every feature map from onnxruntime within 1e-4 relative of eager mode (relative:
max|ort - eager| / max|eager|) at the export size, a non-multiple of 7 and a grid cut at stage 4."""

import numpy as np
import pytest
import torch

from laplacianformer.models import create_model

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

SMALL = dict(depths=(1, 1, 1, 1), embed_dims=(16, 32, 64, 128), num_heads=(1, 2, 2, 4))


def _check(model, path, sizes):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for b, h, w in sizes:
        x = torch.randn(b, 3, h, w)
        with torch.no_grad():
            refs = [t.numpy() for t in model(x)]
        outs = session.run(None, {session.get_inputs()[0].name: x.numpy()})
        assert len(outs) == len(refs) == 4
        for out, ref in zip(outs, refs):
            assert out.shape == ref.shape
            assert np.abs(out - ref).max() / np.abs(ref).max() < 1e-4, (b, h, w)


def test_features_only_backbone_exports_every_map_dynamically(tmp_path):
    pytest.importorskip("timm")
    from laplacianformer.models.export import export_onnx

    torch.manual_seed(0)
    model = create_model("laplacianformer_micro", features_only=True, **SMALL).eval()
    path = tmp_path / "backbone.onnx"
    export_onnx(model, path, torch.randn(1, 3, 96, 96))
    _check(model, path, [(1, 96, 96), (2, 64, 100), (1, 120, 230)])


@pytest.mark.slow
def test_tiny_tuned_backbone_is_within_1e4_of_eager_up_to_detection_sizes(tmp_path):
    """laplacianformer_tiny's features_only backbone with ``attn_preset="tuned"`` (inline normalisation) at
    224², 320×480 and 800×1344 (about 40 s on 2 idle cores). The paper default's injective whitening is not
    held to this: float32 eager mode itself is 1e-4 to 3e-3 from float64 there (docs/MODELS.md)."""
    pytest.importorskip("timm")
    from laplacianformer.models.export import export_onnx

    torch.manual_seed(0)
    model = create_model("laplacianformer_tiny", features_only=True, attn_preset="tuned").eval()
    path = tmp_path / "tiny_tuned.onnx"
    export_onnx(model, path, torch.randn(1, 3, 224, 224))
    _check(model, path, [(1, 224, 224), (1, 320, 480), (1, 800, 1344)])

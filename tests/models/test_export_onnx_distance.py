"""The distance of the kernel rows in an ONNX export (issue 42 item 1): ``composite.export_distance`` forms no
(..., N, M, d) tensor in the graph, for the L1 and the L2 accumulations, and the exported layer equals eager
mode at several sizes of one dynamic graph. Time and memory of whole models: ``bench/onnx_deploy.py``."""

import numpy as np
import pytest
import torch

from laplacianformer import LaplacianAttention
from laplacianformer.ops.kernel import composite

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

DIM, HEADS = 64, 2  # head dim 32: four steps of EXPORT_CHUNK = 8


class _Layer(torch.nn.Module):
    """A LaplacianAttention layer on an image-shaped input (B, C, H, W) -> (B, N, C), as export_onnx takes."""

    def __init__(self, kernel: str):
        super().__init__()
        self.attn = LaplacianAttention(DIM, HEADS, landmarks=(7, 7), kernel=kernel)

    def forward(self, x):
        return self.attn(x.flatten(2).transpose(1, 2), (x.shape[2], x.shape[3]))


@pytest.mark.parametrize("l1", [True, False])
def test_export_distance_equals_cdist_and_is_never_negative(l1):
    """Σ|x - y| and Σ(x - y)² over d = 20 (steps of 8, 8, 4; and of 3) with batch dims; rows equal to a
    landmark give a distance ≥ 0 (the L1 form's cancellation is clamped)."""
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(2, 3, 50, 20, generator=gen), torch.randn(2, 3, 7, 20, generator=gen)
    x[:, :, :7] = y
    ref = torch.cdist(x.double(), y.double(), p=1.0 if l1 else 2.0)
    ref = ref if l1 else ref.square()
    for chunk in (None, 3):
        out = composite.export_distance(x, y, l1, chunk)
        assert out.shape == (2, 3, 50, 7)
        torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
        assert (out >= 0).all()


def _largest_intermediate(path, x: np.ndarray) -> tuple[int, str]:
    """(elements, name) of the largest tensor the graph computes for input ``x`` (onnx's reference evaluator)."""
    from onnx.reference import ReferenceEvaluator

    model = onnx.load(str(path))
    values = ReferenceEvaluator(model).run(None, {model.graph.input[0].name: x}, intermediate=True)
    return max((v.size, k) for k, v in values.items() if isinstance(v, np.ndarray))


@pytest.mark.parametrize("kernel", ["laplacian"])
def test_exported_kernel_rows_form_no_tokens_by_landmarks_by_features_tensor(tmp_path, kernel):
    """The L1 family (the slow set: the others): the largest tensor of the graph at 20×24
    tokens is below B·H·N·M·d (the broadcast the cdist translation formed), and onnxruntime equals eager mode
    at the export size and at another size of the same graph."""
    from laplacianformer.models.export import export_onnx

    torch.manual_seed(0)
    layer = _Layer(kernel).eval()
    path = tmp_path / "layer.onnx"
    export_onnx(layer, path, torch.randn(1, DIM, 20, 24))
    x = torch.randn(1, DIM, 20, 24)
    size, name = _largest_intermediate(path, x.numpy())
    assert size < HEADS * 20 * 24 * 49 * (DIM // HEADS), (size, name)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for shape in ((1, DIM, 20, 24), (2, DIM, 33, 17)):
        x = torch.randn(shape)
        with torch.no_grad():
            ref = layer(x).numpy()
        out = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
        assert np.abs(out - ref).max() <= 1e-5 * np.abs(ref).max(), shape


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["exponential", "gaussian", "matern32", "cauchy"])
def test_other_families_export_without_the_broadcast(tmp_path, kernel):
    """L2 (exponential, matern32: √ of the chunked sum) and squared-L2 families (gaussian, cauchy: the Gram
    expansion, unchanged)."""
    test_exported_kernel_rows_form_no_tokens_by_landmarks_by_features_tensor(tmp_path, kernel)

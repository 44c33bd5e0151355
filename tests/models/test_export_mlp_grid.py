"""The MLP's channels-first form in an ONNX export (issue 42): ``Mlp._forward_grid`` equals the token form, and an
export records it (the two linears as 1×1 Conv nodes beside the depthwise one), so the graph transposes the
C-channel tokens instead of the hidden-width activations. Time: docs/DEPLOY.md."""

import pytest
import torch

from laplacianformer import create_model
from laplacianformer.models.export import export_onnx
from laplacianformer.models.laplacianformer import Mlp

onnx = pytest.importorskip("onnx")


@pytest.mark.parametrize("hw", [(5, 7), (1, 9)])
def test_grid_form_equals_token_form(hw):
    torch.manual_seed(0)
    mlp = Mlp(12, 48).double().eval()
    x = torch.randn(2, hw[0] * hw[1], 12, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(mlp._forward_grid(x, hw), mlp(x, hw), rtol=1e-12, atol=1e-12)


def test_export_records_the_grid_form(tmp_path, monkeypatch):
    """An export runs each block's MLP in the grid form, whose linears are 1×1 Conv nodes of the graph (beside the
    depthwise 3×3 one); eager mode never takes the grid form."""
    model = create_model("laplacianformer_micro").eval()
    grid_calls = []
    real = Mlp._forward_grid
    monkeypatch.setattr(Mlp, "_forward_grid", lambda self, x, hw: grid_calls.append(1) or real(self, x, hw))
    with torch.no_grad():
        model(torch.randn(1, 3, 64, 64))
    assert grid_calls == []
    path = export_onnx(model, tmp_path / "micro.onnx", torch.randn(1, 3, 64, 64))
    blocks = sum(1 for m in model.modules() if isinstance(m, Mlp))
    assert len(grid_calls) == blocks
    graph = onnx.load(str(path)).graph
    kernels = []
    for node in graph.node:
        if node.op_type == "Conv":
            shape = [a.ints for a in node.attribute if a.name == "kernel_shape"]
            kernels.append(tuple(shape[0]) if shape else None)
    assert kernels.count((1, 1)) >= 2 * blocks, kernels

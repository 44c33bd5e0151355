"""A layer exported by the TorchScript ONNX exporter under ``no_grad`` (the way most users call
``torch.onnx.export``): the heads are added to DWConv(V) out of place while ``torch.jit`` traces, since the
exporter misrecords the in-place add into a view (onnxruntime was ~100 % off)."""

from __future__ import annotations

import io
import warnings

import pytest
import torch

from laplacianformer.layers import LaplacianAttention

ort = pytest.importorskip("onnxruntime")


class _OnGrid(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = LaplacianAttention(32, 2)

    def forward(self, x):
        return self.attn(x, hw=(8, 8))


def test_onnx_export_under_no_grad_equals_eager():
    from laplacianformer.models.export import _cdist_translation

    torch.manual_seed(0)
    net = _OnGrid().eval()
    x = torch.randn(2, 64, 32)
    buf = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings(), _cdist_translation(17):
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (x,), buf, dynamo=False, opset_version=17)
    sess = ort.InferenceSession(buf.getvalue())
    got = torch.from_numpy(sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0])
    with torch.no_grad():
        want = net(x)
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()

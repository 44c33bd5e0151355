"""``laplacianformer.cuda_graphed``: its refusals on any machine; on CUDA, replays equal to eager for the
Tiny backbone (classifier and features_only), a new input each call, another shape refused."""

from __future__ import annotations

import pytest
import torch

import laplacianformer
from laplacianformer import cuda_graphed

CUDA = torch.cuda.is_available()


def _micro():
    return laplacianformer.create_model("laplacianformer_micro", num_classes=10).eval()


def test_refusals_name_the_argument():
    model = _micro()
    with pytest.raises(ValueError, match="example_input: expected a CUDA tensor"):
        cuda_graphed(model, torch.randn(1, 3, 32, 32))
    with pytest.raises(TypeError, match="model: expected an nn.Module"):
        cuda_graphed(lambda x: x, torch.randn(1, 3, 32, 32))
    with pytest.raises(TypeError, match="example_input: expected a tensor"):
        cuda_graphed(model, [1, 2])


@pytest.mark.triton
@pytest.mark.skipif(not CUDA, reason="needs a GPU (benchmarks/gpu_check.sh runs it)")
@pytest.mark.parametrize("features_only", [False, True])
def test_replay_equals_eager(features_only):
    torch.manual_seed(0)
    kw = {"features_only": True} if features_only else {"num_classes": 10}
    model = laplacianformer.create_model("laplacianformer_tiny", **kw).cuda().eval()
    x = torch.randn(2, 3, 224, 224, device="cuda")
    graphed = cuda_graphed(model, x)
    for _ in range(2):
        y = torch.randn_like(x)
        with torch.no_grad():
            want = model(y)
        got = graphed(y)
        for a, b in zip(want if features_only else [want], got if features_only else [got]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="captured for"):
        graphed(torch.randn(2, 3, 256, 256, device="cuda"))
    model.train()
    with pytest.raises(ValueError, match="model.eval"):
        cuda_graphed(model, x)

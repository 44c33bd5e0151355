"""bench/layer_floor.py: the compute steps of a layer's inference call are the layer's own computation (their
last output is the layer's), each callable alone on the outputs of the steps before it."""

import pytest
import torch

from laplacianformer.bench.layer_floor import check_floor_steps, floor_steps
from laplacianformer.layers import LaplacianAttention
from laplacianformer.layers.spatial_reduction_attention import SpatialReductionAttention

NYSTROM = ["q, k projections", "v projection", "landmark pooling", "W = k(L, L)", "Newton-Schulz solve",
           "C_k = k(K, L)", "C_q = k(Q, L)", "C normalisation", "DWConv(V) + heads",
           "output projection"]


def _layer(dim=32, heads=2, **kwargs):
    torch.manual_seed(0)
    return LaplacianAttention(dim, heads, **kwargs).eval()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kernel", ["laplacian", "gaussian", "matern32"])
def test_laplacian_steps_give_the_layer_output(kernel, dtype):
    layer = _layer(kernel=kernel).to(dtype)
    x = torch.randn(2, 100, 32, dtype=dtype)
    with torch.no_grad():
        steps = check_floor_steps(layer, x, (10, 10))
        assert [name for name, _ in steps] == NYSTROM
        first = steps[-1][1]()
        for _, fn in steps:  # every step alone, again: the last output is unchanged (no step works in place
            fn()             # on another step's output)
        torch.testing.assert_close(steps[-1][1](), first, rtol=0, atol=0)


def test_laplacian_steps_of_the_wide_tied_and_exact_forms():
    """C >= ONE_PRODUCT_MIN_WIDTH: one q/k/v product; K = Q: one kernel matrix; 3×3 tokens under 7×7
    landmarks: the exact kernel's steps."""
    with torch.no_grad():
        wide = _layer(256, 4)
        names = [n for n, _ in check_floor_steps(wide, torch.randn(1, 64, 256), (8, 8))]
        assert names[0] == "q, k, v projection" and "C_q = k(Q, L)" in names
        tied = _layer(tie_qk=True)
        names = [n for n, _ in check_floor_steps(tied, torch.randn(1, 64, 32), (8, 8))]
        assert "C_q = k(Q, L)" not in names and "C_k = k(K, L)" in names
        names = [n for n, _ in check_floor_steps(_layer(), torch.randn(1, 9, 32), (3, 3))]
        assert names[2:4] == ["k(Q, K)", "dense normalisation"]


@pytest.mark.parametrize("sr_ratio", [1, 2])
def test_softmax_steps_give_the_layer_output(sr_ratio):
    torch.manual_seed(0)
    layer = SpatialReductionAttention(32, 2, sr_ratio=sr_ratio).eval()
    with torch.no_grad():
        names = [n for n, _ in check_floor_steps(layer, torch.randn(2, 36, 32), (6, 6))]
    assert ("reduction conv" in names) == (sr_ratio > 1) and names[-1] == "output projection"


def test_floor_steps_refuse_other_layers_and_paths():
    with pytest.raises(TypeError, match="layer: expected"):
        floor_steps(torch.nn.Linear(4, 4), torch.randn(1, 4, 4), (2, 2))
    with pytest.raises(TypeError, match="layer: floor_steps times"):
        floor_steps(_layer(qk_norm=True), torch.randn(1, 16, 32), (4, 4))


def test_a_wrong_step_is_caught(monkeypatch):
    """check_floor_steps fails when the steps do not compute the layer: here without the §4.6 scale."""
    from laplacianformer.bench import layer_floor

    monkeypatch.setattr(layer_floor, "plain_scale", lambda norm, norm_scale, n: None)  # the C pass unscaled
    with torch.no_grad(), pytest.raises(AssertionError):
        check_floor_steps(_layer(), torch.randn(1, 64, 32), (8, 8))

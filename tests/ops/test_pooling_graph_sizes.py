"""Landmark pooling on graph sizes: torch.jit.trace (the TorchScript ONNX exporter's sizes are 0-dim tensors)
keeps the grid cut and the adaptive-pooling bins as shape arithmetic, so the traced function pools every size
as ``F.adaptive_avg_pool2d`` to the cut grid does (values and shapes), including grids smaller than 7x7."""

import warnings

import torch
import torch.nn.functional as F

from laplacianformer.ops.pooling import pool_landmarks
from laplacianformer.ops.validation import landmark_grid, resolve_landmarks


def _pool(x):  # x: (B, H, h, w, d) -> landmarks (B, H, m, d) of the 7x7 grid cut to (h, w)
    b, heads, h, w, d = x.shape
    return pool_landmarks(x.reshape(b, heads, h * w, d), (h, w), landmark_grid((7, 7), (h, w)))


def _reference(x):
    b, heads, h, w, d = x.shape
    grid = (min(7, h), min(7, w))
    flat = x.permute(0, 1, 4, 2, 3).reshape(b * heads, d, h, w).double()
    return F.adaptive_avg_pool2d(flat, grid).reshape(b, heads, d, -1).transpose(-1, -2)


def test_traced_pooling_keeps_bins_and_cut_for_every_size():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        traced = torch.jit.trace(_pool, torch.randn(2, 2, 12, 9, 4, dtype=torch.float64), check_trace=False)
    for shape in [(2, 2, 12, 9, 4), (1, 3, 4, 4, 5), (1, 1, 20, 13, 3), (2, 2, 4, 30, 4), (1, 1, 1, 9, 2), (1, 1, 57, 8, 2)]:
        x = torch.randn(*shape, dtype=torch.float64)
        out = traced(x)
        torch.testing.assert_close(out, _reference(x), rtol=1e-12, atol=1e-12)


def test_landmark_grid_and_resolve_on_ints_match_the_rule():
    assert landmark_grid((7, 7), (4, 30)) == (4, 7)
    assert resolve_landmarks((7, 7), (4, 30), 120) == (4, 7)
    assert resolve_landmarks((7, 7), (4, 4), 16) is None  # covers every token: exact kernel
    assert landmark_grid(49, None) == 49 and resolve_landmarks(49, None, 40) is None


class _StridedPool(torch.nn.Module):
    """(B, 8, H, W) image -> a stride-4 grid of (2 heads, d = 4) tokens (ceil(H / 4) sides, as a patch embedding
    gives) -> its landmarks (B, 2, m, 4) of the 7x7 grid cut to the token grid."""

    def forward(self, x):
        x = F.avg_pool2d(x, 7, 4, 3, count_include_pad=False)
        b, c, h, w = x.shape
        q = x.flatten(2).transpose(1, 2).reshape(b, h * w, 2, c // 2).transpose(1, 2)  # a strided (B, 2, N, 4)
        return pool_landmarks(q, (h, w), landmark_grid((7, 7), (h, w)))


def test_torch_export_pools_every_size_of_a_dim_range_with_a_fixed_batch():
    """torch.export with a fixed batch and Dim ranges of H, W: the reshape (B, H, gh·gw, d) -> (B·H·gh, gw, d)
    made torch.export guard on ``B·H % (B·H·gh) != 0`` (true, not provable: "Constraints violated")."""
    dims = {2: torch.export.Dim("h", min=64, max=512), 3: torch.export.Dim("w", min=64, max=512)}
    module = _StridedPool()
    example = torch.randn(2, 8, 96, 80, dtype=torch.float64)
    run = torch.export.export(module, (example,), dynamic_shapes=(dims,)).module()
    for h, w in [(64, 64), (301, 97), (512, 509)]:
        x = torch.randn(2, 8, h, w, dtype=torch.float64)
        grid = F.avg_pool2d(x, 7, 4, 3, count_include_pad=False)
        ref = F.adaptive_avg_pool2d(grid, (7, 7)).reshape(2, 2, 4, 49).transpose(-1, -2)
        torch.testing.assert_close(run(x), ref, rtol=1e-12, atol=1e-12)

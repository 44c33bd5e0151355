"""``LaplacianAttention`` with a key_padding_mask keeps its promise for every valid count (issue 43, item 3;
docs/DESIGN.md §2.5): a sequence padded in a batch gives what it gives alone, below, at and above the landmark
count, forward and input gradients, on the plain and the recompute paths."""

import pytest
import torch

from laplacianformer.layers import LaplacianAttention

LENGTHS = [30, 49, 50, 60, 200]  # the issue's 30 and 60, the default m = 49 and m + 1, no padding


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("options", [{}, {"recompute": True}, {"tie_qk": True}], ids=["plain", "recompute", "tied"])
def test_issue_example_padded_equals_alone_in_float32(options):
    torch.manual_seed(0)
    layer = LaplacianAttention(dim=32, num_heads=2, **options)
    mask = torch.arange(200)[None] >= torch.tensor(LENGTHS)[:, None]
    x = torch.randn(len(LENGTHS), 200, 32).masked_fill(mask[..., None], 1e3).requires_grad_(True)
    out = layer(x, key_padding_mask=mask)
    weight = torch.randn_like(out)
    (grad,) = torch.autograd.grad((out * weight).sum(), x)
    assert not out[mask].any() and not grad[mask].any()
    for b, n_valid in enumerate(LENGTHS):
        alone = x[b:b + 1, :n_valid].detach().requires_grad_(True)
        ref = layer(alone)
        (ref_grad,) = torch.autograd.grad((ref * weight[b:b + 1, :n_valid]).sum(), alone)
        assert rel(out[b:b + 1, :n_valid], ref) <= 1e-5, n_valid
        assert rel(grad[b:b + 1, :n_valid], ref_grad) <= 1e-5, n_valid


def test_inference_of_a_padded_batch_equals_alone():
    torch.manual_seed(1)
    layer = LaplacianAttention(dim=32, num_heads=2, landmarks=16).eval()
    lengths = [3, 16, 17, 40]
    mask = torch.arange(40)[None] >= torch.tensor(lengths)[:, None]
    x = torch.randn(len(lengths), 40, 32)
    with torch.no_grad():
        out = layer(x, key_padding_mask=mask)
        for b, n_valid in enumerate(lengths):
            assert rel(out[b:b + 1, :n_valid], layer(x[b:b + 1, :n_valid])) <= 1e-5, n_valid

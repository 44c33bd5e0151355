"""key_padding_mask of the baseline ops (docs/DESIGN.md §2.5): each real token gets what its sequence gets
alone (float64), padded inputs get zero gradient, padded output rows are 0."""

import pytest
import torch

from laplacianformer.baselines import (
    nystrom_attention,
    orthogonal_random_features,
    performer_attention,
    soft_attention,
    softmax_attention,
)

PROJ = orthogonal_random_features(32, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
OPS = {
    "softmax": lambda q, k, v, **kw: softmax_attention(q, k, v, **kw),
    "performer": lambda q, k, v, **kw: performer_attention(q, k, v, PROJ, **kw),
    "nystromformer": lambda q, k, v, **kw: nystrom_attention(q, k, v, num_landmarks=6, **kw),
    "soft": lambda q, k, v, **kw: soft_attention(q, v, landmarks=6, **kw),
}


@pytest.mark.parametrize("name", list(OPS))
def test_padded_batch_matches_each_sequence_alone(name, randn):
    op = OPS[name]
    lengths = [33, 20, 27]
    mask = torch.arange(33)[None] >= torch.tensor(lengths)[:, None]
    q, k, v = (randn(3, 2, 33, 6).masked_fill(mask[:, None, :, None], 1e4).requires_grad_(True) for _ in range(3))
    out = op(q, k, v, key_padding_mask=mask)
    weight = randn(*out.shape)
    grads = torch.autograd.grad((out * weight).sum(), (q, k, v), allow_unused=True)
    pad = mask[:, None, :, None].expand_as(out)
    assert not out[pad].any()
    for g in grads:
        assert g is None or not g[pad].any()
    for b, n_valid in enumerate(lengths):
        alone = [t[b : b + 1, :, :n_valid].detach().requires_grad_(True) for t in (q, k, v)]
        ref = op(*alone)
        ref_grads = torch.autograd.grad((ref * weight[b : b + 1, :, :n_valid]).sum(), alone, allow_unused=True)
        torch.testing.assert_close(out[b : b + 1, :, :n_valid], ref, rtol=1e-10, atol=1e-10)
        for g, r in zip(grads, ref_grads):
            if r is not None:
                torch.testing.assert_close(g[b : b + 1, :, :n_valid], r, rtol=1e-10, atol=1e-10)

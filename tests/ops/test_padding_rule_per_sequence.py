"""The landmark rule per sequence of a padded batch (docs/DESIGN.md §2.2, §2.5; ``ops/sequence_rule.py``): every
valid count, below, at and above the landmark count, gives what the sequence gives alone, forward and backward
(issue 43, item 3)."""

import pytest
import torch

from laplacianformer.ops import _runtime, laplacian_attention, sequence_rule
from laplacianformer.ops.settings import AttentionSettings

M = 8  # landmarks


def rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def padded(gen, lengths, n, d=6, dtype=torch.float32):
    """q, k, v (B, 2, n, d) with NaN in the padded positions, and the mask."""
    mask = torch.arange(n)[None] >= torch.tensor(lengths)[:, None]
    return [torch.randn(len(lengths), 2, n, d, generator=gen, dtype=dtype).masked_fill(mask[:, None, :, None],
            float("nan")).requires_grad_(True) for _ in range(3)], mask


def check_alone(q, k, v, mask, lengths, tol, **kw):
    """The padded call against each sequence alone: values and the gradients of q, k, v at its valid tokens."""
    tied = k is q
    leaves = (q, v) if tied else (q, k, v)
    out = laplacian_attention(q, k, v, key_padding_mask=mask, **kw)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=out.dtype)
    grads = torch.autograd.grad((out * weight).sum(), leaves)
    assert not out[mask[:, None, :, None].expand_as(out)].any()
    for b, n_valid in enumerate(lengths):
        alone = [t[b:b + 1, :, :n_valid].detach().requires_grad_(True) for t in leaves]
        ref = laplacian_attention(alone[0], alone[0] if tied else alone[1], alone[-1], **kw)
        ref_grads = torch.autograd.grad((ref * weight[b:b + 1, :, :n_valid]).sum(), alone)
        assert rel(out[b:b + 1, :, :n_valid], ref) <= tol, (n_valid, rel(out[b:b + 1, :, :n_valid], ref))
        for g, r in zip(grads, ref_grads):
            assert rel(g[b:b + 1, :, :n_valid], r) <= tol, (n_valid, rel(g[b:b + 1, :, :n_valid], r))


@pytest.mark.parametrize("prefix", [0, 2])
@pytest.mark.parametrize("tied", [False, True])
def test_every_valid_count_matches_the_sequence_alone_in_float32(seeded, prefix, tied):
    _, gen = seeded
    # grid tokens (after the prefix): below, at and just above the landmark count, well above, the whole length
    lengths = [prefix + 3, prefix + M, prefix + M + 1, 30, 40]
    (q, k, v), mask = padded(gen, lengths, 40)
    check_alone(q, q if tied else k, v, mask, lengths, 1e-5, landmarks=M, num_prefix_tokens=prefix)


@pytest.mark.parametrize("norm", ["inline", "rowsum", "none"])
def test_other_norms_and_the_gaussian_kernel_in_float64(seeded, norm):
    _, gen = seeded
    lengths = [5, M, 20]
    (q, k, v), mask = padded(gen, lengths, 24, dtype=torch.float64)
    check_alone(q, k, v, mask, lengths, 1e-10, landmarks=M, norm=norm, kernel="gaussian")


@pytest.mark.parametrize("hw,landmarks", [((6, 6), None), ((6, 6), (7, 7))], ids=["exact", "grid-covers-tokens"])
def test_a_2d_grid_takes_a_mask_where_it_is_allowed(seeded, hw, landmarks):
    """2-D: the exact kernel (landmarks=None, or a landmark grid that covers the padded grid) takes a mask; the
    valid 4×5 tokens give what their grid gives alone."""
    _, gen = seeded
    (q, k, v), mask = padded(gen, [20, 36], 36)
    out = laplacian_attention(q, k, v, hw=hw, landmarks=landmarks, key_padding_mask=mask)
    alone = laplacian_attention(q[:1, :, :20], k[:1, :, :20], v[:1, :, :20], hw=(4, 5), landmarks=landmarks)
    assert rel(out[:1, :, :20], alone) <= 1e-5


def test_a_batch_above_the_landmark_count_is_one_nystrom_call_as_before(seeded, monkeypatch):
    """The common case keeps its cost: no covered sequence, no exact call, one core call on the whole batch, the
    same bits as the core before the rule."""
    _, gen = seeded
    lengths = [M + 1, 20, 40]
    (q, k, v), mask = padded(gen, lengths, 40)
    calls = []
    core = sequence_rule.attention_core
    monkeypatch.setattr(sequence_rule, "attention_core", lambda *a, **kw: calls.append(a[0].shape[0]) or core(*a, **kw))
    monkeypatch.setattr(sequence_rule, "exact_compacted", lambda *a, **kw: pytest.fail("exact side ran"))
    out = laplacian_attention(q, k, v, landmarks=M, key_padding_mask=mask)
    assert calls == [3]
    assert torch.equal(out, core(q, k, v, AttentionSettings(q.shape[-1], landmarks=M), None, M, mask))


def test_a_mixed_batch_runs_each_side_once_on_its_rows(seeded, monkeypatch):
    _, gen = seeded
    (q, k, v), mask = padded(gen, [5, 30, 8, 40], 40)
    rows = []
    exact = sequence_rule.exact_compacted
    monkeypatch.setattr(sequence_rule, "exact_compacted",
                        lambda q, *a, **kw: rows.append(("exact", q.shape[0], kw["slots"])) or exact(q, *a, **kw))
    laplacian_attention(q, k, v, landmarks=M, key_padding_mask=mask)
    assert rows == [("exact", 2, M)]  # the two covered sequences, gathered into m slots


def test_graph_capture_keeps_each_sequence_side_with_where(seeded, monkeypatch):
    """While a graph is captured (no host sync) both sides run on the whole batch; the result is the split's."""
    _, gen = seeded
    lengths = [5, 30, 8, 40]
    (q, k, v), mask = padded(gen, lengths, 40)
    q, k, v = (t.detach().nan_to_num() for t in (q, k, v))
    eager = laplacian_attention(q, k, v, landmarks=M, key_padding_mask=mask)
    monkeypatch.setattr(_runtime, "capturing", lambda **kw: True)
    assert torch.equal(laplacian_attention(q, k, v, landmarks=M, key_padding_mask=mask), eager)


def test_stats_name_the_exact_sequences_with_nan_residuals(seeded):
    _, gen = seeded
    (q, k, v), mask = padded(gen, [5, 30], 40)
    _, stats = laplacian_attention(q, k, v, landmarks=M, key_padding_mask=mask, return_stats=True)
    assert stats["landmarks"] == M and stats["residual"].shape == (2, 2)
    assert stats["residual"][0].isnan().all() and stats["residual"][1].isfinite().all()

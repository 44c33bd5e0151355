"""``recompute=True`` on the modules and models (docs/DESIGN.md §5.5): the lean recompute where it serves, the
checkpoint with its reason elsewhere, gradients equal to the plain module's in float64, and what is kept for
the backward."""

from __future__ import annotations

import logging

import pytest
import torch

from laplacianformer import LaplacianAttention, ops
from laplacianformer.ops import _runtime

TOL = dict(rtol=1e-10, atol=1e-10)
CONFIGS = {
    "default": {},
    "tie_qk": dict(tie_qk=True),
    "inline": dict(norm="inline"),
    "rowsum": dict(norm="rowsum"),
    "none": dict(norm="none"),
    "gaussian": dict(kernel="gaussian"),
    "cg": dict(solver="cg", iters=8),
    "exact_solver": dict(solver="exact"),
    "no_bias_no_dwconv": dict(qkv_bias=False, dwconv=False),
}


def _pair(gen, **kw):
    plain = LaplacianAttention(16, 2, **kw).double()
    with torch.no_grad():
        for p in plain.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.3)
    lean = LaplacianAttention(16, 2, recompute=True, **kw).double()
    lean.load_state_dict(plain.state_dict())
    return plain, lean


def _grads(mod, x, hw, mask, probe):
    xi = x.clone().requires_grad_(True)
    out = mod(xi, hw, key_padding_mask=mask)
    params = list(mod.parameters())
    return [out.detach(), *torch.autograd.grad(out, [xi, *params], probe)]


@pytest.mark.parametrize("masked", [False, True], ids=["grid", "mask"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_module_recompute_equals_plain(name, masked):
    gen = torch.Generator().manual_seed(hash(name) % 1000 + masked)
    if masked:  # a padding mask with pooled landmarks takes a 1-D sequence (docs/DESIGN.md §2.5)
        plain, lean = _pair(gen, landmarks=6, **CONFIGS[name])
        hw, n = None, 40
        mask = torch.zeros(2, n, dtype=torch.bool)
        mask[0, 33:] = True
    else:
        plain, lean = _pair(gen, landmarks=(2, 3), **CONFIGS[name])
        hw, n, mask = (6, 7), 42, None
    x = torch.randn(2, n, 16, generator=gen, dtype=torch.float64)
    assert "runs 'lean'" in lean.explain_recompute(x, hw, mask)
    probe = torch.randn(2, n, 16, generator=gen, dtype=torch.float64)
    want = _grads(plain, x, hw, mask, probe)
    got = _grads(lean, x, hw, mask, probe)
    names = ["out", "x"] + [n for n, _ in plain.named_parameters()]
    for label, a, b in zip(names, got, want):
        torch.testing.assert_close(a, b, **TOL, msg=lambda m: f"{label}: {m}")


def test_module_keeps_no_token_by_landmark_tensor():
    """With recompute=True the layer keeps its (B, N, C) activations (x, V, the output projection's input) and
    otherwise only tensors of landmark size or one or two values per token and head; without, q, k, C_q,
    C_k and the normalisation's scratch (N×m per head) are kept too. The lean path keeps no more than the
    checkpoint up to those per-token statistics."""
    n, c, heads, m = 32 * 32, 48, 2, 16
    token_bytes, nm_bytes, stat_bytes = n * c * 4, heads * n * m * 4, 2 * heads * n * 4
    x = torch.randn(1, n, c)
    kept_by = {}
    variants = (("plain", False, "auto"), ("lean", True, "lean"), ("checkpoint", True, "checkpoint"))
    for label, recompute, choice in variants:
        torch.manual_seed(0)
        attn = LaplacianAttention(c, heads, landmarks=(4, 4), recompute=recompute)
        skip = {p.untyped_storage().data_ptr() for p in attn.parameters()}
        kept = {}

        def pack(t):
            ptr = t.untyped_storage().data_ptr()
            if ptr not in skip:
                kept[ptr] = t.untyped_storage().nbytes()
            return t

        xi = x.clone().requires_grad_(True)
        with ops.use(recompute=choice), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            attn(xi, (32, 32))
        kept_by[label] = sorted(kept.values())
    lean, plain, ckpt = kept_by["lean"], kept_by["plain"], kept_by["checkpoint"]
    assert [b for b in lean if b > stat_bytes] == [token_bytes] * 3, lean
    assert sum(1 for b in plain if b == nm_bytes) >= 2, plain  # C_q, C_k (and t, which autograd does not see)
    assert sum(plain) > sum(lean) + 2 * nm_bytes + 2 * token_bytes, (sum(plain), sum(lean))  # also q, k
    assert sum(lean) <= sum(ckpt) + 2 * stat_bytes + 64 * 1024, (sum(lean), sum(ckpt))


def test_exact_kernel_falls_back_to_checkpoint_with_its_reason(caplog):
    """landmarks=None, or a grid covering every token, has no lean form: checkpointed, the reason logged."""
    gen = torch.Generator().manual_seed(3)
    plain, lean = _pair(gen, landmarks=(7, 7))
    x = torch.randn(1, 36, 16, generator=gen, dtype=torch.float64)
    assert "runs 'checkpoint'" in lean.explain_recompute(x, (6, 6))
    assert "exact kernel" in lean.explain_recompute(x, (6, 6))
    _runtime.forget_logged()
    probe = torch.randn(1, 36, 16, generator=gen, dtype=torch.float64)
    with caplog.at_level(logging.INFO, logger="laplacianformer.ops.recompute"):
        got = _grads(lean, x, (6, 6), None, probe)
    assert any("exact kernel" in r.getMessage() for r in caplog.records)
    for a, b in zip(got, _grads(plain, x, (6, 6), None, probe)):
        torch.testing.assert_close(a, b, **TOL)


def test_baselines_checkpoint():
    """A baseline on the same shell has no lean form: recompute=True checkpoints it."""
    from laplacianformer.baselines import SoftmaxAttention

    attn = SoftmaxAttention(16, 2, recompute=True)
    text = attn.explain_recompute(torch.randn(1, 16, 16), (4, 4))
    assert "runs 'checkpoint'" in text and "no lean settings" in text


def test_model_recompute_gradients_equal():
    """A whole backbone (micro) with recompute=True: lean in the Nyström layers, checkpoint in the exact ones,
    the same loss and gradients as without recompute."""
    from laplacianformer.models import create_model

    torch.manual_seed(0)
    plain = create_model("laplacianformer_micro", num_classes=3).double()
    lean = create_model("laplacianformer_micro", num_classes=3, attn_kwargs=dict(recompute=True)).double()
    lean.load_state_dict(plain.state_dict())
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    grads = []
    for net in (plain, lean):
        net.train()
        with _runtime.recording() as calls:
            loss = net(x).square().sum()
        grads.append([loss.detach(), *torch.autograd.grad(loss, list(net.parameters()))])
    runs = [text.splitlines()[0] for op, _, text in calls if op == "recompute"]
    assert any("runs 'lean'" in r for r in runs) and any("runs 'checkpoint'" in r for r in runs), runs
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, **TOL)


def test_model_recompute_inside_grad_checkpointing():
    """recompute=True inside timm-style block checkpointing (set_grad_checkpointing): the lean Function is
    rerun by the outer checkpoint and the gradients still equal those of the plain model."""
    from laplacianformer.models import create_model

    torch.manual_seed(1)
    plain = create_model("laplacianformer_micro", num_classes=3).double().train()
    lean = create_model("laplacianformer_micro", num_classes=3, attn_kwargs=dict(recompute=True)).double().train()
    lean.load_state_dict(plain.state_dict())
    lean.set_grad_checkpointing(True)
    x = torch.randn(1, 3, 32, 32, dtype=torch.float64)
    want = torch.autograd.grad(plain(x).square().sum(), list(plain.parameters()))
    got = torch.autograd.grad(lean(x).square().sum(), list(lean.parameters()))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **TOL)

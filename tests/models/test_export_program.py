"""``torch.export`` with ``torch.export.Dim``s for the batch, H and W (models/export.export_program): one program
runs every size with eager mode's landmark rule (the grid cut to small grids, the exact kernel where the
landmarks cover the grid). Relative error: max|program - eager| / max|eager|."""

import pytest
import torch
from torch import nn

from laplacianformer.layers import LaplacianAttention
from laplacianformer.models import create_model

SMALL = dict(depths=(1, 1, 1, 1), embed_dims=(16, 32, 64, 128), num_heads=(1, 2, 2, 4))


def _relative(out, ref) -> float:
    return float((out - ref).abs().max() / ref.abs().max())


def _agrees(module, run, sizes):
    """``run`` (an exported program's module) equals eager ``module`` within 1e-4 relative at each (B, H, W)."""
    for b, h, w in sizes:
        x = torch.randn(b, 16, h, w)
        with torch.no_grad():
            ref = module(x)
            out = run(x)
        assert out.shape == ref.shape and _relative(out, ref) < 1e-4, ((b, h, w), _relative(out, ref))


class GridAttention(nn.Module):
    """One LaplacianAttention on the (H, W) grid of an image-like (B, C, H, W) input -> (B, H·W, C)."""

    def __init__(self):
        super().__init__()
        self.attn = LaplacianAttention(16, 2)

    def forward(self, x):
        b, c, h, w = x.shape
        return self.attn(x.flatten(2).transpose(1, 2), (h, w))


def test_one_program_keeps_the_landmark_rule_at_every_grid():
    from laplacianformer.models.export import export_program

    torch.manual_seed(0)
    module = GridAttention().eval()
    program = export_program(module, torch.randn(2, 16, 12, 12))
    run = program.module()
    # 4x4 and 7x3 (covered: exact kernel), 5x9 (grid cut to (5, 7): Nyström), 12x12 and 10x31 (7x7 grid)
    _agrees(module, run, [(1, 4, 4), (3, 7, 3), (2, 5, 9), (1, 12, 12), (1, 10, 31)])


def test_plain_torch_export_with_dims_keeps_the_landmark_rule():
    """No wrapper: ``torch.export.export`` with a Dim range that crosses the rule (4x4 exact, 12x12 Nyström)
    exports, because the operator puts both sides in the graph while it is exported (ops/graph_rule.py)."""
    torch.manual_seed(0)
    module = GridAttention().eval()
    dims = {0: torch.export.Dim("batch"), 2: torch.export.Dim("h", min=2, max=64), 3: torch.export.Dim("w", min=2, max=64)}
    run = torch.export.export(module, (torch.randn(2, 16, 12, 12),), dynamic_shapes=(dims,)).module()
    _agrees(module, run, [(3, 4, 4), (2, 5, 9), (2, 12, 12)])


def test_eager_and_torch_compile_take_one_side_only():
    """Outside an export the rule stays a per-size choice: ``rule_in_graph`` is False in eager mode."""
    from laplacianformer.ops.graph_rule import exporting, rule_in_graph

    assert not exporting()
    assert not rule_in_graph((7, 7), (12, 12), 144, 0, None)


@pytest.mark.slow
def test_export_program_of_the_model_runs_every_size_like_eager():
    """The whole classifier (17 s on an idle 2-core machine, minutes when loaded): down to a 2x2 last stage."""
    from laplacianformer.models.export import export_program

    torch.manual_seed(0)
    model = create_model("laplacianformer_micro", num_classes=5, **SMALL).eval()
    run = export_program(model, torch.randn(1, 3, 96, 96)).module()
    for b, h, w in [(2, 40, 48), (1, 64, 100), (3, 120, 230), (1, 96, 96)]:
        x = torch.randn(b, 3, h, w)
        with torch.no_grad():
            ref = model(x)
            out = run(x)
        assert _relative(out, ref) < 1e-4, ((b, h, w), _relative(out, ref))
    with pytest.raises(Exception, match="33"):  # a last stage of 1 token: torch.export's size-1 specialisation
        run(torch.randn(1, 3, 32, 64))

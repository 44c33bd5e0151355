"""One landmark rule for the operator and the modules (docs/DESIGN.md §2.2): the same input gives the same
result (or the same error) through ``laplacian_attention`` and through ``LaplacianAttention``, at the token
counts where landmarks and tokens meet (N = 1, 2, 7, 48, 49, 50) and on thin grids."""

from __future__ import annotations

import pytest
import torch

from laplacianformer import laplacian_attention
from laplacianformer.layers import LaplacianAttention
from laplacianformer.ops.validation import resolve_landmarks

CASES = [(n, None) for n in (1, 2, 7, 48, 49, 50)] + [
    (100, (2, 50)), (7, (1, 7)), (7, (7, 1)), (48, (4, 12)), (49, (7, 7)), (56, (7, 8))]


@pytest.mark.parametrize("n, hw", CASES)
def test_operator_and_module_agree(n, hw):
    torch.manual_seed(n)
    attn = LaplacianAttention(16, 2).double()
    q, k, v = (torch.randn(2, 2, n, 8, dtype=torch.float64) for _ in range(3))
    module_core = attn.attend(q, k, v, hw)
    operator = laplacian_attention(q, k, v, hw=hw)  # the default landmarks (7, 7), as the module's
    torch.testing.assert_close(operator, module_core, rtol=0, atol=0)
    assert torch.isfinite(operator).all()
    grid = resolve_landmarks((7, 7), hw, n)
    if grid is None:  # landmarks cover every token: the exact kernel, as landmarks=None
        torch.testing.assert_close(operator, laplacian_attention(q, k, v, hw=hw, landmarks=None), rtol=0, atol=0)
    else:
        assert (grid if isinstance(grid, int) else grid[0] * grid[1]) < n


def test_rule_values():
    assert resolve_landmarks((7, 7), None, 48) is None and resolve_landmarks((7, 7), None, 50) == 49
    assert resolve_landmarks((7, 7), (2, 50), 100) == (2, 7)
    assert resolve_landmarks((7, 7), (7, 7), 49) is None and resolve_landmarks(9, (7, 8), 56) == (3, 3)
    for bad in (0, 8, (2, 3, 4)):
        with pytest.raises(ValueError, match="^landmarks: "):
            laplacian_attention(*(torch.randn(1, 1, 64, 4) for _ in range(3)), hw=(8, 8), landmarks=bad)
        with pytest.raises(ValueError, match="^landmarks: "):
            LaplacianAttention(8, 2, landmarks=bad)(torch.randn(1, 64, 8), (8, 8))

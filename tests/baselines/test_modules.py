import inspect

import pytest
import torch

from laplacianformer import LaplacianAttention
from laplacianformer.baselines import NystromAttention, PerformerAttention, SoftAttention, SoftmaxAttention

MODULES = [SoftmaxAttention, PerformerAttention, NystromAttention, SoftAttention]


@pytest.mark.parametrize("cls", MODULES)
@pytest.mark.parametrize("hw", [(6, 10), None])
def test_forward_backward_every_parameter(cls, hw):
    torch.manual_seed(0)
    m = cls(16, 2)
    x = torch.randn(2, 60, 16)
    y = m(x, hw)
    assert y.shape == x.shape and torch.isfinite(y).all()
    y.square().mean().backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("cls", MODULES)
def test_same_interface_as_laplacian_attention(cls):
    assert list(inspect.signature(cls.forward).parameters) == list(inspect.signature(LaplacianAttention.forward).parameters)
    m = cls(8, 2)
    with pytest.raises(ValueError, match="^x:"):
        m(torch.randn(1, 12, 6), (3, 4))
    with pytest.raises(ValueError, match="^hw:"):
        m(torch.randn(1, 12, 8), (3, 5))
    with pytest.raises(ValueError, match="^dim:"):
        cls(10, 3)


def test_nystrom_module_uses_exact_softmax_when_landmarks_cover_tokens():
    torch.manual_seed(0)
    soft = SoftmaxAttention(16, 2)
    nys = NystromAttention(16, 2, num_landmarks=49)
    nys.load_state_dict(soft.state_dict())
    x = torch.randn(2, 30, 16)
    torch.testing.assert_close(nys(x, (5, 6)), soft(x, (5, 6)))

import pytest
import torch


@pytest.fixture
def randn():
    """Seeded normal sampler: randn(*shape, dtype=float64, scale=1.0) -> scale * N(0, 1)."""
    gen = torch.Generator().manual_seed(1234)

    def sample(*shape, dtype=torch.float64, scale=1.0):
        return torch.randn(*shape, generator=gen, dtype=dtype) * scale

    return sample

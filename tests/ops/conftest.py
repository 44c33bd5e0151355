"""Fixtures of the ops tests.

``seeded``: (seed, torch.Generator) for tests drawing random inputs. The seeds are fixed, 0 unless
LAPLACIANFORMER_TEST_SEEDS lists others (e.g. ``LAPLACIANFORMER_TEST_SEEDS=0,1,2`` runs each such test
three times); each test prints its seed and has it in its id, so any failure can be rerun as is.
"""

from __future__ import annotations

import os

import pytest
import torch

SEEDS = [int(s) for s in os.environ.get("LAPLACIANFORMER_TEST_SEEDS", "0").split(",") if s.strip()]


@pytest.fixture(params=SEEDS, ids=lambda s: f"seed{s}")
def seeded(request):
    print(f"seed {request.param}")
    return request.param, torch.Generator().manual_seed(request.param)

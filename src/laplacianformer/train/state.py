"""Training state <-> checkpoint content (tensors, containers, plain scalars only).

RNG states of torch (CPU and CUDA), numpy's legacy global generator and Python's ``random`` are
converted to tensors/lists/ints, the content ``checkpoint.save_training_state`` stores (tensors in the
safetensors file, the rest as JSON).
"""

from __future__ import annotations

import random

import numpy as np
import torch



def capture_rng() -> dict:
    keys, pos, has_gauss, cached = np.random.get_state()[1:]
    py_version, py_state, py_gauss = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos), "has_gauss": int(has_gauss),
                  "cached_gaussian": float(cached)},
        "python": {"version": int(py_version), "state": list(py_state), "gauss_next": py_gauss},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss_next"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def step_seed(seed: int, epoch: int, step: int) -> int:
    """The augmentation seed of one step: a fixed function of (run seed, epoch, step in epoch)."""
    return (seed * 1_000_003 + epoch * 100_003 + step) % (2**63 - 1)

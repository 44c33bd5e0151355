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


_POINTER_TYPES = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.uint8: "*u8"}


def _config(kernel_name: str, constexprs: dict, num_warps: int, num_stages: int, maxnreg, pointers=None) -> tuple:
    key = kernel_name, tuple(sorted((k, str(v)) for k, v in constexprs.items())), num_warps, num_stages, maxnreg
    return key if pointers is None else (*key, tuple(sorted(pointers.items())))


def enumerated_configs(specs, pointers: bool = False) -> set:
    """The launch configurations of a Triton module's ``aot_specialisations()`` tuples, in ``record_launches``'s
    form: (kernel name, sorted constexprs, num_warps, num_stages, maxnreg or None), with ``pointers`` also the
    sorted (argument, Triton pointer type) pairs of the signature."""
    return {_config(s[0].__name__, s[2], s[3], s[4], (s[6] if len(s) > 6 else {}).get("maxnreg"),
                    {k: v for k, v in s[1].items() if v.startswith("*")} if pointers else None) for s in specs}


@pytest.fixture
def record_launches(monkeypatch):
    """record(module, *kernel_names, pointers=False) -> list: each named ``@triton.jit`` kernel of ``module``
    replaced (for the test) by one that appends its launch's configuration, in ``enumerated_configs``'s form
    (with ``pointers``: the types of the tensors passed), and launches it."""

    def record(module, *names, pointers: bool = False) -> list:
        launched = []

        class Recorder:
            def __init__(self, kernel):
                self.kernel = kernel

            def __getitem__(self, grid):
                def launch(*args, **kwargs):
                    meta = {k: v for k, v in kwargs.items() if k not in ("num_warps", "num_stages", "maxnreg")}
                    types = {name: _POINTER_TYPES[a.dtype] for name, a in zip(self.kernel.arg_names, args)
                             if isinstance(a, torch.Tensor)} if pointers else None
                    launched.append(_config(self.kernel.__name__, meta, kwargs["num_warps"], kwargs["num_stages"],
                                            kwargs.get("maxnreg"), types))
                    return self.kernel[grid](*args, **kwargs)

                return launch

        for name in names:
            monkeypatch.setattr(module, name, Recorder(getattr(module, name)))
        return launched

    record.enumerated = enumerated_configs  # the configurations a module's aot_specialisations() lists
    return record

"""The C passes' workspace (``lf_scratch`` in ops/csrc/lf_template.h): one per calling thread, kept between
calls and grown when a call needs more. Calls of growing and shrinking sizes, and the same calls from several
Python threads at once (ctypes releases the GIL), give exactly what one thread computes alone."""

from __future__ import annotations

import threading

import pytest
import torch

from laplacianformer.ops import grid_cpu
from laplacianformer.ops.kernel.cpu import laplace_kernel_cpu
from laplacianformer.ops.normalization import cpu as normalization_cpu

pytestmark = pytest.mark.skipif(not (normalization_cpu.available() and grid_cpu.available()),
                                reason="no C compiler")

# (groups, tokens, landmarks, value width): small, large, then small again (the workspace only grows)
SIZES = [(1, 40, 9, 8), (3, 700, 49, 64), (2, 130, 17, 24), (4, 1200, 64, 32), (1, 33, 5, 3)]


def _inputs(seed: int, size):
    g, n, m, e = size
    gen = torch.Generator().manual_seed(seed)
    c = torch.randn(g, n, m, generator=gen, dtype=torch.float64).abs()
    k = torch.randn(g, n, m, generator=gen, dtype=torch.float64).abs()
    v = torch.randn(g, n, e, generator=gen, dtype=torch.float64)
    w = torch.randn(g, m, m, generator=gen, dtype=torch.float64) / m
    x = torch.randn(g, n, 16, generator=gen, dtype=torch.float64)
    y = torch.randn(g, m, 16, generator=gen, dtype=torch.float64)
    return c, k, v, w, x, y


def _every_pass(seed: int, size) -> list[torch.Tensor]:
    """Each C pass that takes the workspace, forward and backward: the normalisation, the kernel rows and
    their gradient, the grid pooling."""
    c, k, v, w, x, y = (t.requires_grad_() for t in _inputs(seed, size))
    out = normalization_cpu.normalize_cpu(c, k, v, "injective", 1e-6, w)
    grads = torch.autograd.grad(out, (c, k, v, w), torch.ones_like(out))
    kern = laplace_kernel_cpu(x, y, 4.0)
    kgrads = torch.autograd.grad(kern, (x, y), torch.ones_like(kern))
    with torch.no_grad():
        side = int(size[1] ** 0.5)
        pooled = grid_cpu.pool_grid_cpu(x[:, None, : side * side].detach(), (side, side), (3, 3))
    return [out.detach(), *grads, kern.detach(), *kgrads, pooled]


def test_growing_and_shrinking_calls_equal_fresh_ones():
    first = [_every_pass(i, s) for i, s in enumerate(SIZES)]
    again = [_every_pass(i, s) for i, s in reversed(list(enumerate(SIZES)))][::-1]
    for a, b in zip(first, again):
        for x, y in zip(a, b):
            assert torch.equal(x, y)


def test_threads_calling_at_once_get_what_one_thread_gets():
    expected = [_every_pass(i, s) for i, s in enumerate(SIZES)]
    failures: list[str] = []

    def worker(offset: int) -> None:
        try:
            for r in range(3):
                for j in range(len(SIZES)):
                    i = (j + offset + r) % len(SIZES)
                    for a, b in zip(_every_pass(i, SIZES[i]), expected[i]):
                        if not torch.equal(a, b):
                            failures.append(f"thread {offset}, size {SIZES[i]}")
        except Exception as err:  # a failure inside a thread would otherwise pass unseen
            failures.append(f"thread {offset}: {err!r}")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[:5]

"""The op backends a benchmark forces (``ops.use``, thread-local): the kernel primitives on one backend,
and the operator's whole plain-PyTorch composite (the naive implementation the fast paths replace)."""

from __future__ import annotations

from ..ops import use

REFERENCE_KERNELS = ("composite", "naive")


def kernel_backend(name: str):
    """``laplace_kernel`` and ``laplace_kernel_matmul`` on ``name`` ("cpu", "triton", "composite", "naive");
    the reference kernels also run the Newton–Schulz solve and its backward in torch."""
    solver = dict(newton_schulz="torch", newton_schulz_grad="torch") if name in REFERENCE_KERNELS else {}
    return use(kernel=name, **solver)


def composite_operator():
    """The composite kernels, the torch Newton–Schulz solve and the autograd normalisation."""
    return use(kernel="composite", newton_schulz="torch", newton_schulz_grad="torch", normalization="composite")


def composite_normalization():
    """Only the normalisation on its autograd composite."""
    return use(normalization="composite")

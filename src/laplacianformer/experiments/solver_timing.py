"""CG iteration count at Newton–Schulz's wall time, on the model's own landmark matrices (docs/DESIGN.md §7).

For the solver ablation "NS vs CG at equal time": one forward of the recipe's model (at initialisation,
a batch of N(0, 1) images of the recipe's batch size and image size) collects W = k(L, L) of every layer
that runs the Nyström path; the solvers are then timed on exactly those (B·H, m, m) matrices through
``ops.newton_schulz.regularised_inverse`` with the recipe's thread count.  CG time is fitted as
a + b·iters from two iteration counts and solved for NS's time.  Timings on a shared machine are noisy:
the runner measures once per results file and records the numbers with it.
"""

from __future__ import annotations

import statistics
import time
from typing import Any


def model_landmark_matrices(rec: dict, *, batch: int | None = None, seed: int = 0) -> tuple[list, str]:
    """The (B·H, m, m) landmark kernel matrices of one forward of the recipe's model, and how they were made."""
    import torch

    from ..layers import LaplacianAttention
    from ..ops.pooling import pool_landmarks
    from ..ops.kernel import laplace_kernel
    from ..ops.validation import resolve_landmarks
    from ..models import create_model
    from ..train.geometry import in_chans_of as _in_chans

    torch.manual_seed(seed)
    chans, size = _in_chans(rec), rec["img_size"]
    model = create_model(rec["model"], num_classes=10, in_chans=chans, **dict(rec.get("model_kwargs") or {})).eval()
    mats: list = []

    def grab(mod, args):
        x, hw = args[0], args[1] if len(args) > 1 else None
        grid = resolve_landmarks(mod.landmarks, hw, x.shape[1])
        if grid is None:
            return
        q, _ = mod._project_qk(x)
        kw = mod.attn_kwargs
        scale = kw["qk_scale"] if kw.get("qk_scale") is not None else mod.head_dim ** -0.5
        marks = pool_landmarks(q * scale, hw, grid)
        w = laplace_kernel(marks, marks, kw["lam"], kw.get("kernel", "laplacian"))
        mats.append(w.reshape(-1, *w.shape[-2:]).contiguous())

    hooks = [m.register_forward_pre_hook(grab) for m in model.modules() if isinstance(m, LaplacianAttention)]
    try:
        with torch.no_grad():
            model(torch.randn(batch or rec["batch_size"], chans, size, size))
    finally:
        for h in hooks:
            h.remove()
    if not mats:
        raise ValueError("protocol: no layer of the model runs the Nyström path at this image size")
    return mats, f"{rec['model']} at initialisation, {batch or rec['batch_size']} N(0,1) images of {size}²"


def cg_iters_at_ns_time(rec: dict, *, ns_iters: int = 20, probe=(4, 24), repeats: int = 7,
                        batch: int | None = None) -> dict[str, Any]:
    """Measures NS (``ns_iters``) and CG (at the ``probe`` counts) on the model's landmark matrices and
    returns a record with ``cg_iters``, the CG count whose fitted time equals NS's (at least 1)."""
    import torch

    from ..ops.newton_schulz import regularised_inverse

    mats, source = model_landmark_matrices(rec, batch=batch)
    eps = 0.01

    def timed(solver: str, iters: int) -> float:
        def once():
            for w in mats:
                regularised_inverse(w, solver=solver, iters=iters, eps=eps)
        once()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            once()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    threads = torch.get_num_threads()
    torch.set_num_threads(int(rec.get("threads") or threads))
    try:
        with torch.no_grad():
            t_ns = timed("newton_schulz", ns_iters)
            t_cg = {k: timed("cg", k) for k in probe}
    finally:
        torch.set_num_threads(threads)
    (k1, t1), (k2, t2) = sorted(t_cg.items())
    slope = (t2 - t1) / (k2 - k1)
    fitted = slope > 0
    iters = max(1, round((t_ns - (t1 - slope * k1)) / slope)) if fitted else ns_iters
    return {
        "ns_iters": ns_iters, "cg_iters": int(iters), "ns_seconds": t_ns,
        "cg_seconds": {str(k): v for k, v in t_cg.items()}, "cg_seconds_per_iter": slope, "fitted": fitted,
        "matrices": [list(w.shape) for w in mats], "source": source, "repeats": repeats,
        "threads": int(rec.get("threads") or threads),
    }

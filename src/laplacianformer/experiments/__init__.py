"""Experiments of DESIGN.md §7: ablations (``ablate``), the solver study and attention analyses (``analyze``).

    laplacianformer ablate lambda            # or: python -m laplacianformer.experiments.ablate lambda
    laplacianformer analyze solver
    laplacianformer analyze all --checkpoint runs/my-run

Results (JSON + Markdown + PNG) go to results/ablations and results/analysis; docs/RESULTS.md lists them.
"""

from .ablations import ABLATIONS, Ablation, Variant, get_ablation

__all__ = ["ABLATIONS", "Ablation", "Variant", "get_ablation"]

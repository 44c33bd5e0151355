"""Experiments of docs/DESIGN.md §7: ablations (``ablate``), the solver study and attention analyses (``analyze``).

    laplacianformer ablate lambda --target-halfwidth 0.5 --max-seeds 12 --jobs 2
    laplacianformer ablate lambda --report   # summary, paired CIs and verdicts again, no training
    laplacianformer analyze solver
    laplacianformer analyze all --checkpoint runs/my-run

Results (JSON + Markdown + PNG) go to results/ablations and results/analysis; docs/RESULTS.md lists them.
The fixed training recipe is ``protocol.PROTOCOL``; statistics and verdict rules are in ``stats``.
"""

from .ablations import ABLATIONS, Ablation, Variant, get_ablation

__all__ = ["ABLATIONS", "Ablation", "Variant", "get_ablation"]

"""The repository's own benchmarks (``benchmarks/``: not in the wheel, run as ``python -m benchmarks.NAME`` from
the checkout's root) are imported by these tests as ``from benchmarks import NAME``: the root goes on sys.path."""

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

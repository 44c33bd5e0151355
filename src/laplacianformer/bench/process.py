"""Child processes that import this copy of the package (the demo's jobs, the peak-memory subprocess, the
re-exec under the retained-heap allocator), wherever it is installed."""

from __future__ import annotations

import os
from importlib.util import find_spec
from pathlib import Path


def package_env(**extra: str) -> dict[str, str]:
    """This process's environment plus ``extra``, with the directory holding ``laplacianformer`` first on
    PYTHONPATH (a source tree or site-packages: the package's location, not a repository's)."""
    env = {**os.environ, **extra}
    where = str(Path(find_spec("laplacianformer").submodule_search_locations[0]).resolve().parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (where, env.get("PYTHONPATH", "")) if p)
    return env

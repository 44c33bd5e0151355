"""``laplacianformer.heap``: keeping freed memory mapped (glibc). Each case runs in a fresh interpreter, since
the setting is the whole process's and lasts until it exits."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not (sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"),
                                reason="glibc's allocator only")

# A 64 MiB block allocated, touched and freed, round after round: minor faults of rounds 7-9. With the memory
# kept, the first rounds still touch fresh pages while the heap settles into two blocks that the later rounds
# take in turn (seen: faults in rounds 1, 2 and at most 4).
PROBE = """
import json, resource, sys, torch
import laplacianformer
from laplacianformer.bench.allocator import allocator_setting
took = laplacianformer.retain_freed_memory() if sys.argv[1] == "retain" else None
def round_():
    t = torch.empty(16 * 2**20)
    t.fill_(1.0)
    del t
for _ in range(6):
    round_()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    round_()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps(dict(took=took, faults=faults, setting=allocator_setting(),
                      again=laplacianformer.retain_freed_memory() if took else None)))
"""


def _probe(mode: str, env: dict | None = None) -> dict:
    """The probe in a fresh interpreter whose environment holds glibc's tunables only where ``env`` gives them."""
    import os

    from laplacianformer.heap import RETAINED_HEAP_ENV

    base = {k: v for k, v in os.environ.items() if k not in RETAINED_HEAP_ENV}
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True,
                         env={**base, **(env or {})})
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_freed_memory_is_reused_without_page_faults_once_retained():
    default = _probe("default")
    assert default["faults"] > 3 * 16000 and default["setting"] == "default"  # 16,384 fresh 4 KiB pages a round
    kept = _probe("retain")
    assert kept["took"] is True and kept["again"] is True  # idempotent
    assert kept["faults"] < 500 and kept["setting"] == "glibc-retain"


def test_the_environment_setting_is_reported_as_retaining():
    from laplacianformer.heap import RETAINED_HEAP_ENV

    got = _probe("default", RETAINED_HEAP_ENV)
    assert got["setting"] == "glibc-retain" and got["faults"] < 500

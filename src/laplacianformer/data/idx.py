"""Reader for the IDX format of (Fashion-)MNIST, plain or gzip-compressed.

Layout: 2 zero bytes, a type code (0x08 = uint8), the number of dimensions n, then n big-endian uint32
sizes, then the data. Images (3 dims) start at byte 16, labels (1 dim) at byte 8.
"""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np

from .errors import DataError


def read_idx(path: str | Path) -> np.ndarray:
    """Returns the uint8 array stored in an IDX file (shape read from its header)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        raise DataError(f"{path}: cannot read IDX file ({e})") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise DataError(f"{path}: not a uint8 IDX file (bad header)")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path}: truncated IDX header")
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    expected = int(np.prod(shape))
    if len(raw) - header != expected:
        raise DataError(f"{path}: expected {expected} data bytes for shape {shape}, found {len(raw) - header}")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)

"""Crash-safe, integrity-checked checkpoints that never unpickle code.

Two formats, one loader:

* ``save_checkpoint(obj, path)`` writes ``torch.save(obj)`` followed by a 56-byte integrity trailer
  (magic, payload size, SHA-256 of the payload, magic). The content is restricted up front to what
  ``torch.load(weights_only=True)`` accepts, so the file stays loadable by plain
  ``torch.load(path, weights_only=True)`` as well (zip readers ignore trailing bytes).
* ``save_weights(state_dict, path)`` writes a ``.safetensors`` file whose header metadata carries the
  SHA-256 of the tensor data section under ``"laplacianformer.sha256"``.
* ``save_training_state(path, model_state, state, format=...)`` writes a nested training state (optimizer,
  scaler, RNG states, history, ...) as one ``save_weights`` file: the model's tensors under ``model/``, the
  state's tensors under ``state/`` and the state itself as a JSON skeleton in the header metadata (key
  ``"state"``, next to ``"format"``). ``load_training_state`` reads it back.
* ``load_checkpoint(path)`` reads either: ``.safetensors`` files (also their ``.safetensors.prev``
  copies) through ``safetensors`` (no pickle at all), anything else through ``torch.load(weights_only=True)``
  after the trailer check. ``verify=False`` skips the trailer check for files written by plain
  ``torch.save`` (a ``.pth`` state dict, timm's ``train.py`` checkpoints such as ``model_best.pth.tar``);
  the one class allowed beyond ``weights_only``'s own is ``argparse.Namespace``, which holds the ``args``
  of timm's checkpoints and runs no code when rebuilt (its attributes are set, nothing is called).

Every write goes to a temporary file in the destination directory, is flushed and fsynced, renamed over
the destination with ``os.replace`` and followed by an fsync of the directory, so a crash at any point
leaves either the old or the new complete file under ``path``. With ``keep_previous=True`` the old file
is first hard-linked (or copied) to ``<name>.prev`` through the same temp-and-rename step, so the previous
checkpoint also survives. ``load_checkpoint(..., fallback_previous=True)`` reads ``<name>.prev`` when the
latest file is missing or damaged, with a ``RuntimeWarning``; it never does so unless asked.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import io
import json
import os
import pickle
import shutil
import secrets
import struct
import warnings
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import torch

__all__ = [
    "CheckpointError",
    "save_checkpoint",
    "save_weights",
    "save_training_state",
    "load_training_state",
    "TrainingState",
    "load_checkpoint",
    "read_metadata",
    "previous_path",
    "verify_checkpoint",
]

_MAGIC = b"LFCKPT01"
_TRAILER = struct.Struct("<8sQ32s8s")
TRAILER_SIZE = _TRAILER.size
_SHA_KEY = "laplacianformer.sha256"
_SAFETENSORS_SUFFIX = ".safetensors"
_PREV_SUFFIX = ".prev"
_FORMAT_KEY = "format"
_STATE_KEY = "state"
_CHUNK = 1 << 20
_SCALARS = (str, int, float, bool, type(None))
# the classes torch.load(weights_only=True) may rebuild beyond its own: the args of timm's train.py checkpoints
_SAFE_GLOBALS = (argparse.Namespace,)
NO_TRAILER = (
    "no integrity trailer: truncated, or not written by save_checkpoint (a plain torch.save file, e.g. a .pth "
    "state dict or timm's model_best.pth.tar, has none: load it without the integrity check with --no-verify "
    "on the command line, verify=False in Python; it is still read with weights_only=True)"
)
"""The problem ``verify_checkpoint`` reports for a file without the trailer (it names the way out in both
entry points: ``laplacianformer eval --no-verify`` and ``verify=False`` of the Python loaders)."""
_TORCH_ATOMS = (torch.dtype, torch.device)


class CheckpointError(ValueError):
    """A checkpoint could not be read; the message starts with ``checkpoint:`` and names the path."""


def previous_path(path: str | os.PathLike) -> Path:
    """Where ``save_checkpoint(..., keep_previous=True)`` keeps the file it replaced: ``<name>.prev``."""
    path = Path(path)
    return path.with_name(path.name + _PREV_SUFFIX)


def _is_safetensors(path: Path) -> bool:
    """By name: ``*.safetensors`` or the ``*.safetensors.prev`` copy ``keep_previous`` keeps of one."""
    name = path.name[: -len(_PREV_SUFFIX)] if path.name.endswith(_PREV_SUFFIX) else path.name
    return name.endswith(_SAFETENSORS_SUFFIX)


def _check_weights_only(obj: Any, where: str) -> None:
    if isinstance(obj, torch.Tensor):
        if type(obj) not in (torch.Tensor, torch.nn.Parameter):
            raise TypeError(f"{where}: tensor subclass {type(obj).__name__} is not loadable with weights_only=True")
        return
    if type(obj) in _SCALARS or type(obj) in _TORCH_ATOMS:
        return
    if type(obj) in (dict, OrderedDict):
        for key, value in obj.items():
            if type(key) not in (str, int):
                raise TypeError(f"{where}: dict keys must be str or int, got {type(key).__name__} key {key!r}")
            _check_weights_only(value, f"{where}[{key!r}]")
        return
    if type(obj) in (list, tuple, torch.Size):
        for i, value in enumerate(obj):
            _check_weights_only(value, f"{where}[{i}]")
        return
    raise TypeError(
        f"{where}: {type(obj).__module__}.{type(obj).__qualname__} is not allowed in a checkpoint; use tensors, "
        "dict/list/tuple, str/int/float/bool/None (what torch.load(weights_only=True) accepts)"
    )


def _write_payload(f, data: bytes | memoryview) -> None:
    """Write ``data`` to the open binary file ``f`` in 1 MiB chunks (one place for fault injection in tests)."""
    view = memoryview(data)
    for start in range(0, len(view), _CHUNK):
        f.write(view[start : start + _CHUNK])


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _new_temp_file(directory: Path, name: str) -> tuple[int, Path]:
    """(fd, path) of a new, uniquely named temporary file ``.NAME.<random>.tmp`` in ``directory``, opened for
    writing with the mode ``open()`` gives a new file (0o666 less the umask, applied by the OS: mkstemp's
    0600 would make a checkpoint private to its writer, and reading the umask means setting it, which races
    with other threads)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = directory / f".{name}.{secrets.token_hex(6)}.tmp"
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, f"path: no free temporary name for {name!r} in {str(directory)!r}")


def _atomic_write(path: Path, chunks: list[bytes], keep_previous: bool) -> Path:
    """Temp file in ``path``'s directory, fsync, optional ``.prev`` rotation, ``os.replace``, fsync dir."""
    directory = path.parent
    if not directory.is_dir():
        raise FileNotFoundError(errno.ENOENT, f"path: directory {str(directory)!r} does not exist", str(path))
    fd, tmp = _new_temp_file(directory, path.name)
    try:
        try:
            with os.fdopen(fd, "wb") as f:
                for chunk in chunks:
                    _write_payload(f, chunk)
                f.flush()
                os.fsync(f.fileno())
            if keep_previous and path.exists():
                _rotate_previous(path)
            os.replace(tmp, path)
        except OSError as exc:
            raise OSError(
                exc.errno,
                f"checkpoint: {path}: write failed ({exc.strerror or exc}); the file already at this path, "
                "if any, was left untouched",
                str(path),
            ) from exc
    finally:
        if tmp.exists():
            tmp.unlink()
    _fsync_dir(directory)
    return path


def _rotate_previous(path: Path) -> None:
    prev = previous_path(path)
    fd, tmp = _new_temp_file(path.parent, prev.name)
    os.close(fd)
    try:
        tmp.unlink()
        try:
            os.link(path, tmp)
        except OSError:
            shutil.copyfile(path, tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.replace(tmp, prev)
    finally:
        if tmp.exists():
            tmp.unlink()


def save_checkpoint(obj: dict, path: str | os.PathLike, *, keep_previous: bool = True) -> Path:
    """Atomically write ``obj`` (a dict of tensors, containers and plain scalars) to ``path``.

    Args:
        obj: a ``dict``; nested values may be tensors, dict/OrderedDict (str or int keys), list, tuple,
            str, int, float, bool, None, ``torch.dtype``, ``torch.device``. Anything else raises
            ``TypeError`` naming the key path (e.g. ``obj['optimizer']['state'][0]``), before any I/O.
        path: destination file; its directory must exist.
        keep_previous: keep the file being replaced as ``<name>.prev``.

    Returns:
        ``path`` as a ``Path``. A failed write (disk full, ...) raises ``OSError`` with the original errno
        and a message starting ``checkpoint:``; the existing file at ``path`` is untouched.
    """
    if not isinstance(obj, dict):
        raise TypeError(f"obj: expected a dict, got {type(obj).__name__}")
    _check_weights_only(obj, "obj")
    path = Path(path)
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    payload = buffer.getbuffer()
    digest = hashlib.sha256(payload).digest()
    trailer = _TRAILER.pack(_MAGIC, len(payload), digest, _MAGIC)
    return _atomic_write(path, [payload, trailer], keep_previous)


def _safetensors_sections(data: bytes) -> tuple[dict, int]:
    if len(data) < 8:
        raise ValueError("shorter than the 8-byte safetensors header length")
    (header_len,) = struct.unpack("<Q", data[:8])
    if header_len > len(data) - 8:
        raise ValueError(f"header length {header_len} exceeds the file size {len(data)} (truncated)")
    try:
        header = json.loads(data[8 : 8 + header_len])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    return header, 8 + header_len


def save_weights(
    state_dict: Mapping[str, torch.Tensor],
    path: str | os.PathLike,
    metadata: Mapping[str, str] | None = None,
    *,
    keep_previous: bool = False,
) -> Path:
    """Atomically write a flat ``{name: tensor}`` dict as safetensors, with a SHA-256 of the data section.

    Tensors are detached, moved to the CPU and made contiguous; tensors that share storage (tied weights)
    are cloned, since the format stores each tensor separately. ``metadata`` must map str to str.
    """
    from safetensors.torch import save

    if not isinstance(state_dict, Mapping):
        raise TypeError(f"state_dict: expected a mapping of str to Tensor, got {type(state_dict).__name__}")
    meta = {} if metadata is None else metadata
    if not isinstance(meta, Mapping):
        raise TypeError(f"metadata: expected a mapping of str to str, got {type(meta).__name__}")
    for key, value in meta.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"metadata[{key!r}]: expected str keys and str values, got {type(value).__name__}")
    if _SHA_KEY in meta:
        raise ValueError(f"metadata: the key {_SHA_KEY!r} is reserved for the integrity hash")
    tensors: dict[str, torch.Tensor] = {}
    seen: set[tuple[int, int]] = set()
    for key, value in state_dict.items():
        if not isinstance(key, str):
            raise TypeError(f"state_dict: keys must be str, got {type(key).__name__} key {key!r}")
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"state_dict[{key!r}]: expected a torch.Tensor, got {type(value).__name__}")
        tensor = value.detach().to("cpu").contiguous()
        storage = (tensor.untyped_storage().data_ptr(), tensor.untyped_storage().nbytes())
        if tensor.numel() and storage in seen:
            tensor = tensor.clone()
        elif tensor.numel():
            seen.add(storage)
        tensors[key] = tensor
    data = save(tensors, metadata=dict(meta))
    header, start = _safetensors_sections(data)
    body = memoryview(data)[start:]
    # the hash goes into the header; tensor offsets are relative to the data section, which stays as it is
    # (serialised once: a training state is several times the model's size)
    header["__metadata__"] = {**meta, _SHA_KEY: hashlib.sha256(body).hexdigest()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data section stays 8-byte aligned, as safetensors writes it
    return _atomic_write(Path(path), [struct.pack("<Q", len(text)) + text, body], keep_previous)


def read_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The user metadata stored by ``save_weights`` (the integrity hash key is left out)."""
    path = Path(path)
    data = _read_bytes(path)
    try:
        header, _ = _safetensors_sections(data)
    except ValueError as exc:
        raise CheckpointError(f"checkpoint: {path}: not a safetensors file: {exc}") from None
    meta = header.get("__metadata__") or {}
    return {k: v for k, v in meta.items() if k != _SHA_KEY}


def _read_bytes(path: Path) -> bytes:
    if not path.exists():
        raise CheckpointError(f"checkpoint: {path}: missing (no such file)")
    if path.is_dir():
        raise CheckpointError(f"checkpoint: {path}: is a directory, not a checkpoint file")
    data = path.read_bytes()
    if not data:
        raise CheckpointError(f"checkpoint: {path}: empty file (0 bytes)")
    return data


def verify_checkpoint(path: str | os.PathLike) -> memoryview:
    """Check the integrity trailer of a ``save_checkpoint`` file; return the payload bytes.

    Raises ``CheckpointError`` when the file is missing, empty, truncated, extended, or its hash differs.
    """
    path = Path(path)
    data = _read_bytes(path)
    if len(data) < TRAILER_SIZE:
        raise CheckpointError(
            f"checkpoint: {path}: truncated or not a checkpoint ({len(data)} bytes, no integrity trailer)"
        )
    magic, size, digest, magic2 = _TRAILER.unpack_from(data, len(data) - TRAILER_SIZE)
    if magic != _MAGIC or magic2 != _MAGIC:
        raise CheckpointError(f"checkpoint: {path}: " + NO_TRAILER)
    if size != len(data) - TRAILER_SIZE:
        raise CheckpointError(
            f"checkpoint: {path}: truncated or altered: trailer records {size} payload bytes, "
            f"found {len(data) - TRAILER_SIZE}"
        )
    payload = memoryview(data)[:size]
    if hashlib.sha256(payload).digest() != digest:
        raise CheckpointError(f"checkpoint: {path}: hash mismatch (SHA-256 of the payload differs from the trailer)")
    return payload


def _torch_load(path: Path, payload, map_location) -> dict:
    try:
        with torch.serialization.safe_globals(list(_SAFE_GLOBALS)):
            obj = torch.load(io.BytesIO(payload), map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        text = str(exc)
        if "Unsupported global" in text:
            detail = next((line.strip() for line in text.splitlines() if "Unsupported" in line), text[:200])
            raise CheckpointError(
                f"checkpoint: {path}: refused pickle: it needs code that weights_only loading does not run ({detail})"
            ) from None
        detail = next((line.strip() for line in text.splitlines() if "Unsupported" in line), text.splitlines()[0][:200])
        raise CheckpointError(f"checkpoint: {path}: not a checkpoint weights_only loading can read ({detail})") from None
    except (RuntimeError, EOFError, ValueError, OSError) as exc:
        raise CheckpointError(f"checkpoint: {path}: not a readable torch checkpoint ({str(exc)[:200]})") from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"checkpoint: {path}: wrong format: expected a dict at the top level, got {type(obj).__name__}")
    return obj


def _load_safetensors(path: Path, map_location) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load

    data = _read_bytes(path)
    try:
        header, start = _safetensors_sections(data)
    except ValueError as exc:
        raise CheckpointError(f"checkpoint: {path}: wrong format: not a safetensors file: {exc}") from None
    ends = [info.get("data_offsets", [0, 0])[1] for key, info in header.items()
            if key != "__metadata__" and isinstance(info, dict) and isinstance(info.get("data_offsets"), list)]
    size = max((e for e in ends if isinstance(e, int)), default=0)
    if len(data) - start < size:
        raise CheckpointError(f"checkpoint: {path}: truncated: the header describes {size} bytes of tensor data, "
                              f"the file holds {len(data) - start}")
    expected = (header.get("__metadata__") or {}).get(_SHA_KEY)
    if expected is not None and hashlib.sha256(memoryview(data)[start:]).hexdigest() != expected:
        raise CheckpointError(f"checkpoint: {path}: hash mismatch (SHA-256 of the tensor data differs from the header)")
    try:
        tensors = load(data)
    except (SafetensorError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"checkpoint: {path}: truncated or corrupt safetensors file ({exc})") from None
    if map_location is None or str(map_location) == "cpu":
        return tensors
    return {k: v.to(map_location) for k, v in tensors.items()}


def _load_one(path: Path, map_location, verify: bool) -> dict:
    if _is_safetensors(path):
        return _load_safetensors(path, map_location)
    if verify:
        payload = verify_checkpoint(path)
    else:
        payload = _read_bytes(path)
    return _torch_load(path, payload, map_location)


def load_checkpoint(
    path: str | os.PathLike,
    *,
    map_location: Any = "cpu",
    verify: bool = True,
    fallback_previous: bool = False,
) -> dict:
    """Load a checkpoint without ever running pickled code.

    Args:
        path: a ``.safetensors`` file or its ``.safetensors.prev`` copy (returns ``{name: tensor}``) or a
            ``save_checkpoint`` file (returns the saved dict, loaded with ``torch.load(weights_only=True)``).
        map_location: as for ``torch.load``; default ``"cpu"``.
        verify: check the integrity trailer (size + SHA-256). ``False`` accepts plain ``torch.save`` files
            (a ``.pth`` state dict, a timm ``train.py`` checkpoint), still with ``weights_only=True`` (plus
            ``argparse.Namespace``); such a file is then checked only as far as ``torch.load`` checks it
            (a cut zip archive fails to read; altered tensor bytes are not detected).
        fallback_previous: when ``path`` is missing or damaged, load ``<name>.prev`` instead and emit a
            ``RuntimeWarning`` naming the problem. Off by default.

    Raises:
        CheckpointError: message starts with ``checkpoint: <path>:`` and names the problem (missing, empty,
            truncated, hash mismatch, not a checkpoint, refused pickle, wrong format).
    """
    path = Path(path)
    try:
        return _load_one(path, map_location, verify)
    except CheckpointError as exc:
        if not fallback_previous:
            raise
        prev = previous_path(path)
        try:
            obj = _load_one(prev, map_location, verify)
        except CheckpointError as prev_exc:
            raise CheckpointError(f"{exc}; fallback also failed: {prev_exc}") from None
        warnings.warn(f"{exc}; loaded the previous checkpoint {prev} instead", RuntimeWarning, stacklevel=2)
        return obj


# ----------------------------------------------------------------------------------------------------
# Training state <-> safetensors: tensors + a JSON skeleton of everything else in the header metadata
# ----------------------------------------------------------------------------------------------------


class TrainingState(NamedTuple):
    """What ``load_training_state`` read: the model's weights, the rest of the state, the header metadata
    (``"format"`` and the caller's keys) and the file read (``<name>.prev`` after a fallback)."""

    model: dict
    state: dict
    metadata: dict
    path: Path


def _encode(obj: Any, name: str, tensors: dict[str, torch.Tensor]) -> Any:
    """Nested containers -> JSON skeleton; each tensor goes to ``tensors`` under its key path.

    Every dict becomes ``{"__items__": [[key, value], ...]}`` (int keys stay ints), so any other JSON object
    in the skeleton is a marker: ``__tensor__`` (a tensor's name), ``__tuple__``, ``__dtype__``,
    ``__device__``. Floats go through ``json`` unchanged (``repr`` round-trips; inf/nan as ``Infinity``/``NaN``).
    """
    if isinstance(obj, torch.Tensor):
        key, n = name, 1
        while key in tensors:  # "a/b" as one key and as a nested path: keep both
            key, n = f"{name}#{n}", n + 1
        tensors[key] = obj
        return {"__tensor__": key}
    if isinstance(obj, dict):
        return {"__items__": [[k, _encode(v, f"{name}/{k}", tensors)] for k, v in obj.items()]}
    if isinstance(obj, tuple):  # also torch.Size
        return {"__tuple__": [_encode(v, f"{name}/{i}", tensors) for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [_encode(v, f"{name}/{i}", tensors) for i, v in enumerate(obj)]
    if isinstance(obj, torch.dtype):
        return {"__dtype__": str(obj).removeprefix("torch.")}
    if isinstance(obj, torch.device):
        return {"__device__": str(obj)}
    return obj


def _decode(skel: Any, tensors: dict[str, torch.Tensor], path: Path) -> Any:
    if isinstance(skel, list):
        return [_decode(v, tensors, path) for v in skel]
    if not isinstance(skel, dict):
        return skel
    if "__items__" in skel:
        return {k: _decode(v, tensors, path) for k, v in skel["__items__"]}
    if "__tensor__" in skel:
        try:
            return tensors[skel["__tensor__"]]
        except KeyError:
            raise CheckpointError(f"checkpoint: {path}: the state names the tensor {skel['__tensor__']!r}, "
                                  "which the file does not hold") from None
    if "__tuple__" in skel:
        return tuple(_decode(v, tensors, path) for v in skel["__tuple__"])
    if "__dtype__" in skel:
        dtype = getattr(torch, str(skel["__dtype__"]), None)
        if not isinstance(dtype, torch.dtype):
            raise CheckpointError(f"checkpoint: {path}: unknown dtype {skel['__dtype__']!r} in the state")
        return dtype
    if "__device__" in skel:
        return torch.device(skel["__device__"])
    raise CheckpointError(f"checkpoint: {path}: malformed state skeleton (unknown entry {sorted(skel)[:3]})")


def save_training_state(
    path: str | os.PathLike,
    model_state: Mapping[str, torch.Tensor],
    state: dict,
    *,
    format: str,
    metadata: Mapping[str, str] | None = None,
    keep_previous: bool = True,
) -> Path:
    """Atomically write a training state as one safetensors file (``save_weights``: temp file, fsync, rename).

    Args:
        path: destination file (``.safetensors``); its directory must exist.
        model_state: the model's ``{name: tensor}``, stored under ``model/<name>``.
        state: everything else (optimizer, scaler, RNG states, history, ...): nested dict/list/tuple of
            tensors and plain values, the content ``save_checkpoint`` accepts. Its tensors are stored under
            ``state/<key path>``, the rest as a JSON skeleton in the metadata key ``"state"``; anything else
            raises ``TypeError`` naming the key path, before any I/O.
        format: stored under the metadata key ``"format"``; ``load_training_state(format=...)`` checks it.
        metadata: more str -> str header metadata (``read_metadata`` returns it without loading tensors).
        keep_previous: keep the file being replaced as ``<name>.prev``.

    A resumed run needs the state back exactly: tensors are stored bit for bit, ints, strings and floats
    through JSON (exact), tuples stay tuples, dict keys keep their type (str or int).
    """
    if not isinstance(state, dict):
        raise TypeError(f"state: expected a dict, got {type(state).__name__}")
    if not isinstance(format, str) or not format:
        raise TypeError(f"format: expected a non-empty str, got {format!r}")
    _check_weights_only(state, "state")
    meta = dict(metadata or {})
    for key in (_FORMAT_KEY, _STATE_KEY):
        if key in meta:
            raise ValueError(f"metadata: the key {key!r} is reserved for the training state")
    if not isinstance(model_state, Mapping):
        raise TypeError(f"model_state: expected a mapping of str to Tensor, got {type(model_state).__name__}")
    tensors = {f"model/{k}": v for k, v in model_state.items()}
    skeleton = _encode(state, _STATE_KEY, tensors)
    meta.update({_FORMAT_KEY: format, _STATE_KEY: json.dumps(skeleton, separators=(",", ":"))})
    return save_weights(tensors, path, meta, keep_previous=keep_previous)


def _read_training_state(path: Path, map_location) -> TrainingState:
    if not _is_safetensors(path):
        raise CheckpointError(f"checkpoint: {path}: not a training checkpoint (save_training_state writes "
                              f"{_SAFETENSORS_SUFFIX} files)")
    tensors = _load_safetensors(path, map_location)
    meta = read_metadata(path)
    if _STATE_KEY not in meta:
        raise CheckpointError(f"checkpoint: {path}: not a training checkpoint (safetensors weights without the "
                              f"{_STATE_KEY!r} metadata of save_training_state; format {meta.get(_FORMAT_KEY)!r})")
    try:
        skeleton = json.loads(meta[_STATE_KEY])
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"checkpoint: {path}: the {_STATE_KEY!r} metadata is not valid JSON ({exc.msg})") from None
    state = _decode(skeleton, tensors, path)
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint: {path}: the saved state is a {type(state).__name__}, not a dict")
    model = {k[len("model/"):]: v for k, v in tensors.items() if k.startswith("model/")}
    return TrainingState(model, state, meta, path)


def load_training_state(
    path: str | os.PathLike,
    *,
    format: str | None = None,
    map_location: Any = "cpu",
    fallback_previous: bool = False,
) -> TrainingState:
    """Read a ``save_training_state`` file.

    Args:
        path: the file.
        format: when given, the ``"format"`` the file must carry (``CheckpointError`` naming both otherwise).
        map_location: as for ``load_checkpoint``.
        fallback_previous: when ``path`` is missing or damaged (unreadable, truncated, hash mismatch,
            malformed state), read ``<name>.prev`` instead, with a ``RuntimeWarning`` naming the problem.

    Returns:
        ``TrainingState(model, state, metadata, path)``; ``path`` is the file actually read.

    Raises:
        CheckpointError: message ``checkpoint: <path>: <problem>``; after a failed fallback it names both files.
    """
    path = Path(path)
    try:
        loaded = _read_training_state(path, map_location)
    except CheckpointError as exc:
        if not fallback_previous:
            raise
        prev = previous_path(path)
        try:
            loaded = _read_training_state(prev, map_location)
        except CheckpointError as prev_exc:
            raise CheckpointError(f"{exc}; the previous checkpoint is no fallback: {prev_exc}") from None
        warnings.warn(f"{exc}; loaded the previous checkpoint {prev} instead", RuntimeWarning, stacklevel=2)
    got = loaded.metadata.get(_FORMAT_KEY)
    if format is not None and got != format:
        raise CheckpointError(f"checkpoint: {loaded.path}: not a {format!r} training checkpoint (its format is {got!r})")
    return loaded

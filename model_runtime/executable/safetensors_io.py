"""Reading and writing the safetensors container, memory-mapped and defensive.

Writing goes through the ``safetensors`` library, atomically (temp file in the same folder, fsync,
rename). Reading parses the header itself, with a size cap, a strict UTF-8/JSON decode that
rejects duplicate keys and non-finite numbers, and checks every offset before mapping, so a
hostile or truncated file raises :class:`InvalidExecutableError` without allocating anything
large. The data section must be covered exactly by the tensors (no overlaps, no gaps, no trailing
bytes): bytes that belong to no tensor would escape the package hash.

Tensor data is a read-only view of ONE ``mmap`` of the file (one file descriptor per file, not
one per tensor), never copied.

A file replaced on disk after load: the mapping keeps the inode it was opened with, so an atomic
replacement (write elsewhere, then rename over the path; what :func:`write_safetensors` and every
runtime writer does), or a deletion, leaves a loaded executable intact and unchanged. A file that
another program rewrites *in place* is not protected: same-size rewrites show through the shared
mapping, and truncation makes later reads of the vanished pages fail with SIGBUS. Guarding
against that would mean copying every tensor on load, which this format exists to avoid.
"""

from __future__ import annotations

import json
import mmap
import os
import stat
import struct
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
from safetensors.numpy import save_file

from model_runtime.errors import InvalidExecutableError

__all__ = ["MAX_HEADER_BYTES", "MAX_RANK", "read_safetensors", "write_safetensors"]

#: The header is JSON describing tensors; 16 MiB is far beyond any real executable (a model
#: with thousands of tensors and a large metadata document needs well under 1 MiB).
MAX_HEADER_BYTES = 16 << 20
#: No tensor may have more dimensions than this (ONNX models stay far below).
MAX_RANK = 64
_MAX_DIM = 1 << 40

_ST_DTYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype("bool"),
    "U8": np.dtype("uint8"),
    "I8": np.dtype("int8"),
    "U16": np.dtype("uint16"),
    "I16": np.dtype("int16"),
    "U32": np.dtype("uint32"),
    "I32": np.dtype("int32"),
    "U64": np.dtype("uint64"),
    "I64": np.dtype("int64"),
    "F16": np.dtype("float16"),
    "F32": np.dtype("float32"),
    "F64": np.dtype("float64"),
}
_ENTRY_KEYS = frozenset(("dtype", "shape", "data_offsets"))
#: (begin, end, name, dtype, shape) of one tensor, offsets relative to the data section.
_Entry = tuple[int, int, str, np.dtype[Any], tuple[int, ...]]


def write_safetensors(
    path: Path, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str]
) -> None:
    """Write ``tensors`` to ``path`` atomically: a temp file in the same folder, then rename.

    Raises:
        OSError: the folder cannot be created or written.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        save_file(
            {k: np.ascontiguousarray(v) for k, v in tensors.items()}, tmp, metadata=dict(metadata)
        )
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _no_duplicates(where: str) -> Any:
    # json keeps the last of duplicate keys; a second tensor entry or metadata key under the
    # same name would then hide data from the reader (and from the package hash).
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise InvalidExecutableError(f"{where}: JSON has duplicate key {key[:80]!r}")
            out[key] = value
        return out

    return hook


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"non-finite number {name}")


def parse_json_strict(raw: bytes | str, *, where: str, what: str) -> Any:
    """Decode ``raw`` as strict UTF-8 JSON: no duplicate keys, no NaN/Infinity.

    Raises:
        InvalidExecutableError: naming ``where`` and ``what`` (e.g. "header") on any defect.
    """
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        return json.loads(
            text, object_pairs_hook=_no_duplicates(where), parse_constant=_reject_constant
        )
    except InvalidExecutableError:
        raise
    except RecursionError:
        raise InvalidExecutableError(f"{where}: {what} JSON is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, int digit limit
        raise InvalidExecutableError(f"{where}: {what} is not valid JSON: {exc}") from None


def _read_header(path: Path, where: str) -> tuple[int, bytes, mmap.mmap | None]:
    """Return (file size, header bytes, mapping of the whole file) read through one descriptor."""
    try:
        # A FIFO or device would block or never end; only regular files are executables.
        if not stat.S_ISREG(path.stat().st_mode):
            raise InvalidExecutableError(f"{where}: not a regular file")
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            prefix = f.read(8)
            if len(prefix) < 8:
                raise InvalidExecutableError(f"{where}: truncated: {size} bytes, no header")
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len < 2 or header_len > MAX_HEADER_BYTES or header_len > size - 8:
                raise InvalidExecutableError(
                    f"{where}: not an executable (bad magic/header length {header_len} "
                    f"in a file of {size} bytes; truncated or not safetensors)"
                )
            raw = f.read(header_len)
            if len(raw) != header_len:
                raise InvalidExecutableError(f"{where}: truncated while reading the header")
            # mmap keeps its own duplicate of the descriptor, so closing f is fine.
            mm = (
                mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size > 8 + header_len else None
            )
            if mm is not None and len(mm) != size:
                mm.close()
                raise InvalidExecutableError(f"{where}: file changed size while being opened")
            return size, raw, mm
    except FileNotFoundError:
        raise InvalidExecutableError(f"{where}: no such file") from None
    except IsADirectoryError:
        raise InvalidExecutableError(f"{where}: is a directory") from None
    except (OSError, ValueError) as exc:
        raise InvalidExecutableError(f"{where}: cannot read: {exc}") from exc


def _entry(where: str, name: str, info: Any, data_len: int) -> _Entry:
    def fail(what: str) -> InvalidExecutableError:
        return InvalidExecutableError(f"{where}: tensor {name!r}: {what}")

    if not isinstance(info, dict):
        raise fail("entry is not an object")
    if set(info) != _ENTRY_KEYS:
        raise fail(f"entry keys {sorted(info)} are not {sorted(_ENTRY_KEYS)}")
    dt, shape, offs = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(dt, str) or dt not in _ST_DTYPES:
        raise fail(f"unsupported dtype {dt!r}")
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_RANK
        or not all(
            isinstance(d, int) and not isinstance(d, bool) and 0 <= d < _MAX_DIM for d in shape
        )
    ):
        raise fail(f"bad shape {str(shape)[:80]} (dims must be integers in [0, 2**40))")
    if (
        not isinstance(offs, list)
        or len(offs) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) for o in offs)
        or not 0 <= offs[0] <= offs[1] <= data_len
    ):
        raise fail(f"data offsets {str(offs)[:80]} outside the data ({data_len} bytes; truncated?)")
    dtype = _ST_DTYPES[dt]
    n = 1
    for d in shape:
        n *= d
    if n * dtype.itemsize != offs[1] - offs[0]:
        raise fail(
            f"shape {shape} of {dtype.name} needs {n * dtype.itemsize} bytes, "
            f"the file holds {offs[1] - offs[0]}"
        )
    return offs[0], offs[1], name, dtype, tuple(shape)


def read_safetensors(path: Path) -> tuple[dict[str, str], dict[str, np.ndarray]]:
    """Return ``(metadata, tensors)`` of a safetensors file; tensors are read-only mmap views.

    Raises:
        InvalidExecutableError: the file is missing, not a regular file, truncated, or not a
            valid safetensors file (bad header length, JSON, dtype, shape or offsets; data
            not covered exactly by the tensors).
    """
    where = str(path)
    size, raw, mm = _read_header(path, where)
    try:
        entries, meta_raw, data_start = _parse_header(where, raw, size)
    except BaseException:
        if mm is not None:
            mm.close()
        raise
    tensors: dict[str, np.ndarray] = {}
    for begin, end, name, dtype, shape in entries:
        if end == begin or mm is None:
            arr = np.zeros(shape, dtype)
            arr.flags.writeable = False
        else:
            count = (end - begin) // dtype.itemsize
            arr = np.frombuffer(mm, dtype=dtype, count=count, offset=data_start + begin)
            arr = arr.reshape(shape)
        tensors[name] = arr
    return meta_raw, tensors


def _parse_header(where: str, raw: bytes, size: int) -> tuple[list[_Entry], dict[str, str], int]:
    """Check the header against the file size; return sorted entries, metadata, data start."""
    if not raw.lstrip(b" \t\r\n").startswith(b"{"):
        raise InvalidExecutableError(
            f"{where}: not an executable (header is not a JSON object; wrong magic)"
        )
    header = parse_json_strict(raw, where=where, what="header")
    if not isinstance(header, dict):
        raise InvalidExecutableError(f"{where}: header is not a JSON object")
    data_start = 8 + len(raw)
    data_len = size - data_start
    meta_raw = header.pop("__metadata__", {})
    if not isinstance(meta_raw, dict) or not all(isinstance(v, str) for v in meta_raw.values()):
        raise InvalidExecutableError(f"{where}: __metadata__ is not an object of strings")
    entries = sorted(_entry(where, name, info, data_len) for name, info in header.items())
    expected = 0
    for begin, end, name, _, _ in entries:
        if begin < expected:
            raise InvalidExecutableError(f"{where}: tensor {name!r} overlaps another tensor")
        if begin > expected:
            raise InvalidExecutableError(
                f"{where}: {begin - expected} bytes before tensor {name!r} belong to no tensor"
            )
        expected = end
    if expected != data_len:
        raise InvalidExecutableError(
            f"{where}: {data_len - expected} trailing bytes belong to no tensor "
            "(file appended to, or not written by a safetensors writer)"
        )
    return entries, dict(meta_raw), data_start

"""Reading and writing the safetensors container, memory-mapped and defensive.

Writing goes through the ``safetensors`` library. Reading parses the header with a size cap and
checks every offset before mapping, so a hostile or truncated file raises
:class:`InvalidExecutableError` without allocating anything large; tensor data is a read-only
``numpy.memmap`` view, never copied.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

from model_runtime.errors import InvalidExecutableError

__all__ = ["MAX_HEADER_BYTES", "read_safetensors", "write_safetensors"]

#: The header is JSON describing tensors; 64 MiB is far beyond any real executable.
MAX_HEADER_BYTES = 64 << 20

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


def write_safetensors(
    path: Path, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str]
) -> None:
    """Write ``tensors`` to ``path`` atomically: a temp file in the same folder, then rename."""
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


def read_safetensors(path: Path) -> tuple[dict[str, str], dict[str, np.ndarray]]:
    """Return ``(metadata, tensors)`` of a safetensors file; tensors are read-only memmaps.

    Raises:
        InvalidExecutableError: the file is missing, truncated or not a valid safetensors file.
    """
    where = str(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                raise InvalidExecutableError(f"{where}: truncated: {size} bytes, no header")
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len > MAX_HEADER_BYTES or header_len > size - 8:
                raise InvalidExecutableError(
                    f"{where}: not an executable (bad magic/header length {header_len} "
                    f"in a file of {size} bytes)"
                )
            raw = f.read(header_len)
    except FileNotFoundError:
        raise InvalidExecutableError(f"{where}: no such file") from None
    except IsADirectoryError:
        raise InvalidExecutableError(f"{where}: is a directory") from None
    except OSError as exc:
        raise InvalidExecutableError(f"{where}: cannot read: {exc}") from exc
    if not raw.lstrip().startswith(b"{"):
        raise InvalidExecutableError(f"{where}: not an executable (header is not a JSON object)")
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError):
        raise InvalidExecutableError(f"{where}: header is not valid JSON") from None
    if not isinstance(header, dict):
        raise InvalidExecutableError(f"{where}: header is not a JSON object")
    data_start = 8 + header_len
    data_len = size - data_start
    meta_raw = header.pop("__metadata__", {})
    if not isinstance(meta_raw, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in meta_raw.items()
    ):
        raise InvalidExecutableError(f"{where}: __metadata__ is not an object of strings")
    entries: list[tuple[int, int, str, np.dtype[Any], tuple[int, ...]]] = []
    for name, info in header.items():
        if not isinstance(info, dict):
            raise InvalidExecutableError(f"{where}: tensor {name!r}: entry is not an object")
        dt = info.get("dtype")
        shape = info.get("shape")
        offs = info.get("data_offsets")
        if dt not in _ST_DTYPES:
            raise InvalidExecutableError(f"{where}: tensor {name!r}: unsupported dtype {dt!r}")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**40 for d in shape
        ):
            raise InvalidExecutableError(f"{where}: tensor {name!r}: bad shape {shape!r}")
        if (
            not isinstance(offs, list)
            or len(offs) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offs)
            or not 0 <= offs[0] <= offs[1] <= data_len
        ):
            raise InvalidExecutableError(
                f"{where}: tensor {name!r}: data offsets {offs!r} outside the data "
                f"({data_len} bytes; file truncated?)"
            )
        dtype = _ST_DTYPES[dt]
        n = 1
        for d in shape:
            n *= d
        if n * dtype.itemsize != offs[1] - offs[0]:
            raise InvalidExecutableError(
                f"{where}: tensor {name!r}: shape {shape} of {dtype.name} needs "
                f"{n * dtype.itemsize} bytes, the file holds {offs[1] - offs[0]}"
            )
        entries.append((offs[0], offs[1], name, dtype, tuple(shape)))
    entries.sort()
    prev_end = 0
    for begin, end, name, _, _ in entries:
        if begin < prev_end:
            raise InvalidExecutableError(f"{where}: tensor {name!r} overlaps another tensor")
        prev_end = end
    tensors: dict[str, np.ndarray] = {}
    for begin, end, name, dtype, shape in entries:
        if end == begin:
            tensors[name] = np.zeros(shape, dtype)
            tensors[name].flags.writeable = False
            continue
        mm = np.memmap(path, dtype=dtype, mode="r", offset=data_start + begin, shape=shape)
        tensors[name] = mm
    return dict(meta_raw), tensors

"""Reading and writing the safetensors container, defensive, into private memory.

Writing goes through the ``safetensors`` library, atomically (temp file in the same folder, fsync,
rename). Reading parses the header itself, with a size cap, a strict UTF-8/JSON decode that
rejects duplicate keys and non-finite numbers, and checks every offset before reading, so a
hostile or truncated file raises :class:`InvalidExecutableError` without allocating anything
large. The data section must be covered exactly by the tensors (no overlaps, no gaps, no trailing
bytes): bytes that belong to no tensor would escape the package hash.

Loading is two steps through one descriptor: :func:`open_safetensors` reads and checks the
header (the caller learns ``data_bytes`` and can refuse before allocating, see
:mod:`.limits`), then :meth:`SafetensorsFile.read_tensors` reads the whole data section into ONE
private buffer and returns read-only views of it (one allocation per file, no copy per tensor).

Why a private copy and not a memory map of the file: a loaded model must not depend on its file
(DESIGN.md §4). A shared map shows every in-place rewrite of the file (wrong answers after the
next device reset, which reloads from the executable) and turns a truncation into SIGBUS on the
next read of a vanished page, killing the process. ``MAP_PRIVATE`` does not help: pages not yet
copied-on-write still come from the file, so truncation still raises SIGBUS. Once read, the data
is the process's own: the file may be rewritten, truncated or deleted (its disk space is freed at
once, no map keeps the inode alive) and nothing changes until an explicit reload, which reads and
verifies the file again. It also closes a gap: the package hash is computed over exactly the bytes
that will run, not over file pages that could change between the check and their use.

The cost: the tensors are resident anonymous memory (about the file's size per loaded
executable, shared by all its replicas and resets) instead of page cache that the kernel could
share with other processes and evict. Loading reads every byte once, as the hash check did
already. Models here are ONNX programs whose weights the device backend copies anyway, so the
extra resident memory is one more copy of the weights, bounded by the allocation limit.
"""

from __future__ import annotations

import io
import json
import os
import stat
import struct
import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn

import numpy as np
from safetensors.numpy import save_file

from model_runtime.errors import InvalidExecutableError

__all__ = [
    "MAX_HEADER_BYTES",
    "MAX_RANK",
    "SafetensorsFile",
    "open_safetensors",
    "read_safetensors",
    "write_safetensors",
]

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


def _read_exactly(f: io.FileIO, into: memoryview, where: str, what: str) -> None:
    got = 0
    while got < len(into):
        n = f.readinto(into[got:])
        if not n:
            raise InvalidExecutableError(
                f"{where}: file ended while reading the {what} (truncated or changed during load)"
            )
        got += n


def _open(path: Path, where: str) -> tuple[io.FileIO, int, bytes]:
    """Open ``path`` and read its header: (unbuffered file, size, header bytes)."""
    try:
        # A FIFO or device would block or never end; only regular files are executables.
        if not stat.S_ISREG(path.stat().st_mode):
            raise InvalidExecutableError(f"{where}: not a regular file")
        f = open(path, "rb", buffering=0)  # noqa: SIM115 (closed by the caller)
    except FileNotFoundError:
        raise InvalidExecutableError(f"{where}: no such file") from None
    except IsADirectoryError:
        raise InvalidExecutableError(f"{where}: is a directory") from None
    except OSError as exc:
        raise InvalidExecutableError(f"{where}: cannot read: {exc}") from exc
    try:
        size = os.fstat(f.fileno()).st_size
        if size < 8:
            raise InvalidExecutableError(f"{where}: truncated: {size} bytes, no header")
        prefix = bytearray(8)
        _read_exactly(f, memoryview(prefix), where, "header length")
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len < 2 or header_len > MAX_HEADER_BYTES or header_len > size - 8:
            raise InvalidExecutableError(
                f"{where}: not an executable (bad magic/header length {header_len} "
                f"in a file of {size} bytes; truncated or not safetensors)"
            )
        raw = bytearray(header_len)
        _read_exactly(f, memoryview(raw), where, "header")
        return f, size, bytes(raw)
    except BaseException as exc:
        f.close()
        if isinstance(exc, OSError):
            raise InvalidExecutableError(f"{where}: cannot read: {exc}") from exc
        raise


class SafetensorsFile:
    """An open safetensors file whose header has been read and checked; data not read yet.

    Close it (or use it as a context manager) when done; :meth:`read_tensors` reads the data
    through the descriptor the header came from.
    """

    __slots__ = ("_entries", "_file", "data_bytes", "data_start", "metadata", "path", "size")

    def __init__(self, path: Path) -> None:
        """Open ``path`` and check its header against the file.

        Raises:
            InvalidExecutableError: the file is missing, not a regular file, truncated, or its
                header is not a valid safetensors header for this file.
        """
        where = str(path)
        f, size, raw = _open(path, where)
        try:
            entries, meta_raw, data_start = _parse_header(where, raw, size)
        except BaseException:
            f.close()
            raise
        self.path = path
        self.size = size
        #: the ``__metadata__`` strings of the header
        self.metadata = meta_raw
        self.data_start = data_start
        #: bytes :meth:`read_tensors` allocates (the data section)
        self.data_bytes = size - data_start
        self._entries = entries
        self._file: io.FileIO | None = f

    @property
    def tensor_names(self) -> tuple[str, ...]:
        return tuple(e[2] for e in self._entries)

    def read_tensors(self) -> dict[str, np.ndarray]:
        """Read the data section into one private buffer; return read-only views of it.

        Raises:
            InvalidExecutableError: the file was closed, or it shrank or grew while being read
                (changed during load).
        """
        where = str(self.path)
        f = self._file
        if f is None:
            raise InvalidExecutableError(f"{where}: read after close")
        buffer = np.empty(self.data_bytes, np.uint8)
        try:
            f.seek(self.data_start)
            _read_exactly(f, buffer.data, where, "tensor data")
            if os.fstat(f.fileno()).st_size != self.size:
                raise InvalidExecutableError(f"{where}: file changed size while being read")
        except OSError as exc:
            raise InvalidExecutableError(f"{where}: cannot read: {exc}") from exc
        # Read-only, and views of a read-only base cannot be made writeable again.
        buffer.flags.writeable = False
        tensors: dict[str, np.ndarray] = {}
        for begin, end, name, dtype, shape in self._entries:
            if end == begin:
                arr = np.zeros(shape, dtype)
                arr.flags.writeable = False
            else:
                count = (end - begin) // dtype.itemsize
                arr = np.frombuffer(buffer, dtype=dtype, count=count, offset=begin).reshape(shape)
            tensors[name] = arr
        return tensors

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def open_safetensors(path: Path) -> SafetensorsFile:
    """Open ``path`` and check its header (see :class:`SafetensorsFile`).

    Raises:
        InvalidExecutableError: as :class:`SafetensorsFile`.
    """
    return SafetensorsFile(path)


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
    """Return ``(metadata, tensors)`` of a safetensors file; tensors are read-only views of one
    private buffer (the file is closed on return and may change freely afterwards).

    Raises:
        InvalidExecutableError: the file is missing, not a regular file, truncated, or not a
            valid safetensors file (bad header length, JSON, dtype, shape or offsets; data
            not covered exactly by the tensors).
    """
    with open_safetensors(path) as f:
        return f.metadata, f.read_tensors()


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

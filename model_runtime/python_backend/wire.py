"""Frames between the daemon and an instance process: small JSON headers, tensors by reference.

A frame is ``<u32 header length><u32 payload length><header JSON><payload>``. The header is a
dict with a type ``t`` and, for frames that carry tensors, descriptors
``[name, datatype, shape, where, offset, nbytes]``: ``where`` 0 means the tensor's bytes lie in
the sender's shared-memory ring at that file offset (see :mod:`.arena`), 1 means they are in this
frame's payload at that offset (a small tensor, or one that did not fit the ring). ``h`` is the
sender's ring head after the frame; the receiver marks it consumed once the frame's tensors are
copied out.
Nothing is pickled: a frame from a broken child can be refused, never executed. Headers are
written and read by orjson where the interpreter has it (the daemon's always does; an instance
in a model's own environment may not), by the json module otherwise: the same JSON either way.
Request and response frames (``fast``) are written by orjson; the others, which may carry a
NaN that orjson would write as null, by the json module; what orjson will not write or read
(a lone surrogate, NaN, an integer over 64 bits) goes through the json module.

This module imports only numpy and its siblings, because the instance process runs it too.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import numpy as np

from model_runtime.python_backend.dtypes import (
    BytesFormatError,
    deserialize_bytes,
    numpy_of,
    serialize_bytes,
    triton_of,
)

__all__ = [
    "FRAME",
    "MAX_HEADER",
    "MAX_PAYLOAD",
    "Encoder",
    "WireError",
    "decode_tensors",
    "parse_header",
]

FRAME = struct.Struct("<II")
#: tensors up to this many bytes travel in the frame: cheaper than a ring's read and write
INLINE_MAX = 16 << 10
MAX_HEADER = 64 << 20
MAX_PAYLOAD = (1 << 32) - 1

Desc = list[Any]


class WireError(ValueError):
    """A frame or a tensor descriptor does not parse or points outside what was sent."""


class Sink(Protocol):
    """Where a sender puts tensor bytes: its ring in the shared memory (None: no room now)."""

    def put(self, data: memoryview) -> int | None: ...


#: one encoder for every frame (json.dumps with separators builds one per call)
_encode = json.JSONEncoder(separators=(",", ":")).encode


def _json_dumps(header: dict[str, Any]) -> bytes:
    return _encode(header).encode()


try:
    import orjson
except ImportError:  # an instance in a model's own environment without orjson
    _fast_dumps = _json_dumps
    _fast_loads: Any = json.loads
    _FAST_ERRORS: tuple[type[Exception], ...] = (ValueError,)
else:

    def _fast_dumps(header: dict[str, Any]) -> bytes:
        try:
            return orjson.dumps(header)
        except orjson.JSONEncodeError:  # what orjson does not write (a lone surrogate)
            return _json_dumps(header)

    _fast_loads = orjson.loads
    _FAST_ERRORS = (orjson.JSONDecodeError,)


class Source(Protocol):
    """Where a receiver copies tensor bytes from: the other side's ring."""

    def read(self, offset: int, nbytes: int) -> np.ndarray: ...

    def consumed(self, head: int) -> None: ...


def _raw(array: np.ndarray) -> tuple[str, memoryview]:
    """Raises: ValueError: a dtype Triton has no datatype for."""
    datatype = triton_of(array.dtype)
    if datatype == "BYTES":
        return datatype, memoryview(serialize_bytes(array))
    contiguous = array if array.flags.c_contiguous else np.ascontiguousarray(array)
    try:
        return datatype, contiguous.data.cast("B")
    except (TypeError, ValueError):  # a buffer format memoryview cannot cast
        return datatype, memoryview(contiguous.reshape(-1).view(np.uint8).data)


class Encoder:
    """Builds one frame: tensors over ``inline_max`` bytes go to the ring when they fit, the
    others inline in the payload."""

    __slots__ = ("_inline_max", "_parts", "_sink", "_size")

    def __init__(self, sink: Sink, inline_max: int = INLINE_MAX) -> None:
        self._sink = sink
        self._inline_max = inline_max
        self._parts: list[memoryview] = []
        self._size = 0

    def tensor(self, name: str, array: np.ndarray) -> Desc:
        """The descriptor of ``array`` (its bytes placed now).

        Raises:
            ValueError: the dtype has no Triton datatype.
        """
        datatype, data = _raw(array)
        n = len(data)
        off = (self._sink.put(data) if n > self._inline_max else None) if n else 0
        if off is None:
            self._parts.append(data)
            off, self._size = self._size, self._size + n
            return [name, datatype, list(array.shape), 1, off, n]
        return [name, datatype, list(array.shape), 0, off, n]

    def tensors(self, named: Iterable[tuple[str, np.ndarray]]) -> list[Desc]:
        return [self.tensor(name, array) for name, array in named]

    def finish(
        self, header: dict[str, Any], head: int, *, fast: bool = False
    ) -> list[bytes | memoryview]:
        """The frame's segments, to be written in order (after every :meth:`tensor`).
        ``fast``: the header holds no float (a request or response frame: ints, strings,
        lists, dicts), so orjson may write it.

        Raises:
            WireError: the payload is over :data:`MAX_PAYLOAD`.
            TypeError: a header value JSON cannot hold.
        """
        header["h"] = head
        data = _fast_dumps(header) if fast else _json_dumps(header)
        if self._size > MAX_PAYLOAD:
            raise WireError(f"a frame of {self._size} bytes is over the limit {MAX_PAYLOAD}")
        return [FRAME.pack(len(data), self._size), data, *self._parts]


def parse_header(data: bytes | bytearray) -> dict[str, Any]:
    """Raises: WireError: not a JSON object with a string ``t``."""
    try:
        header = _fast_loads(data)
    except _FAST_ERRORS:
        try:  # what orjson does not read: NaN, integers over 64 bits
            header = json.loads(data)
        except ValueError as exc:
            raise WireError(f"a frame header is not JSON: {exc}") from exc
    if not isinstance(header, dict) or not isinstance(header.get("t"), str):
        raise WireError("a frame header is not an object with a type 't'")
    return header


def _shape(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(type(d) is int and d >= 0 for d in value):
        raise WireError(f"a tensor shape must be a list of non-negative integers, not {value!r}")
    return tuple(value)


def decode_tensors(
    descs: Any, payload: bytes | memoryview, source: Source
) -> list[tuple[str, np.ndarray]]:
    """The named arrays ``descs`` describe, copied out (writable, owned by the caller).

    Raises:
        WireError: a descriptor that does not parse, a datatype that is not Triton's, bytes
            outside the ring or payload, a size that does not match the shape.
    """
    if not isinstance(descs, list):
        raise WireError("tensors must be a list of descriptors")
    out: list[tuple[str, np.ndarray]] = []
    for desc in descs:
        if not isinstance(desc, list) or len(desc) != 6:
            raise WireError(f"a tensor descriptor must have 6 fields, not {desc!r}")
        name, datatype, shape_v, where, off, n = desc
        if not isinstance(name, str) or not isinstance(datatype, str):
            raise WireError(f"a tensor descriptor has a bad name or datatype: {desc!r}")
        if type(off) is not int or type(n) is not int or off < 0 or n < 0:
            raise WireError(f"tensor {name!r}: bad offset or size {off}, {n}")
        shape = _shape(shape_v)
        try:
            dtype = numpy_of(datatype)
        except ValueError as exc:
            raise WireError(f"tensor {name!r}: {exc}") from exc
        if where == 0:
            try:
                raw = source.read(off, n) if n else np.empty(0, np.uint8)
            except ValueError as exc:
                raise WireError(f"tensor {name!r}: {exc}") from exc
        elif where == 1:
            if off + n > len(payload):
                raise WireError(f"tensor {name!r} runs past the frame's payload")
            raw = np.frombuffer(payload, np.uint8, n, off).copy()
        else:
            raise WireError(f"tensor {name!r}: unknown place {where!r}")
        if datatype in ("BYTES", "TYPE_STRING", "TYPE_BYTES"):
            try:
                array = deserialize_bytes(raw.data, shape)
            except BytesFormatError as exc:
                raise WireError(f"tensor {name!r}: {exc}") from exc
        else:
            count = 1
            for d in shape:
                count *= d
            if count * dtype.itemsize != n:
                raise WireError(
                    f"tensor {name!r}: {n} bytes do not hold shape {list(shape)} of {datatype}"
                )
            array = raw.view(dtype).reshape(shape)
        out.append((name, array))
    return out


def names(descs: Sequence[Desc]) -> list[str]:
    """The names of a descriptor list (for messages)."""
    return [d[0] for d in descs]

"""Triton's data types for python models: names, numpy types, and the BYTES element format.

Both sides of the instance wire use this table, so it imports nothing but numpy: the instance
process may run another interpreter (a model's own environment) that has numpy and nothing of
the daemon. BYTES tensors travel as Triton serializes them: each element a little-endian
uint32 length followed by its bytes, in C order.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

__all__ = [
    "BytesFormatError",
    "deserialize_bytes",
    "numpy_of",
    "serialize_bytes",
    "triton_of",
]

#: Triton datatype (as on the wire and in the inference protocol) -> numpy dtype
_NUMPY: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}
_TRITON: dict[np.dtype[Any], str] = {v: k for k, v in _NUMPY.items()}

_LEN = struct.Struct("<I")


class BytesFormatError(ValueError):
    """A BYTES tensor's serialized form does not parse (a length runs past the end)."""


def numpy_of(datatype: str) -> np.dtype[Any]:
    """The numpy dtype of a Triton datatype (``"FP32"``; ``"TYPE_FP32"`` is accepted too).

    Raises:
        ValueError: not a datatype a python model can exchange.
    """
    name = datatype[5:] if datatype.startswith("TYPE_") else datatype
    if name == "STRING":
        name = "BYTES"
    try:
        return _NUMPY[name]
    except KeyError:
        raise ValueError(f"data type {datatype!r} is not one a python model can use") from None


def triton_of(dtype: np.dtype[Any]) -> str:
    """The Triton datatype of a numpy dtype (``S``/``U`` arrays are BYTES).

    Raises:
        ValueError: a dtype Triton has no datatype for (complex, datetime, structured, ...).
    """
    if dtype.kind in "SU":
        return "BYTES"
    try:
        return _TRITON[dtype]
    except KeyError:
        raise ValueError(f"numpy dtype {dtype} has no Triton data type") from None


def serialize_bytes(array: np.ndarray) -> bytes:
    """Triton's serialized form of a BYTES array (``bytes`` kept, anything else ``str()``-ed
    and encoded UTF-8, as Triton's ``serialize_byte_tensor`` does)."""
    parts: list[bytes] = []
    append = parts.append
    pack = _LEN.pack
    for item in array.reshape(-1).tolist():
        if isinstance(item, bytes):
            data = item
        elif isinstance(item, str):
            data = item.encode("utf-8")
        else:
            data = str(item).encode("utf-8")
        append(pack(len(data)))
        append(data)
    return b"".join(parts)


def deserialize_bytes(data: bytes | bytearray | memoryview, shape: tuple[int, ...]) -> np.ndarray:
    """The object array of ``bytes`` that ``data`` serializes, in ``shape``.

    Raises:
        BytesFormatError: a length runs past the end, bytes are left over, or the element count
            is not what ``shape`` needs.
    """
    view = memoryview(data)
    count = 1
    for d in shape:
        count *= d
    out = np.empty(count, dtype=object)
    pos = 0
    end = len(view)
    for i in range(count):
        if pos + 4 > end:
            raise BytesFormatError(f"BYTES tensor ends inside the length of element {i}")
        (n,) = _LEN.unpack_from(view, pos)
        pos += 4
        if pos + n > end:
            raise BytesFormatError(f"BYTES element {i} claims {n} bytes past the end")
        out[i] = bytes(view[pos : pos + n])
        pos += n
    if pos != end:
        raise BytesFormatError(f"BYTES tensor of {count} elements has {end - pos} bytes left over")
    return out.reshape(shape)

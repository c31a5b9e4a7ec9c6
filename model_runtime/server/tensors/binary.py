"""Tensor elements from binary data, as the binary tensor data extension, raw gRPC contents and
shared memory regions carry them: fixed-size elements little-endian, BYTES elements each a
4-byte little-endian length and its bytes."""

from __future__ import annotations

import struct

import numpy as np

from model_runtime.errors import ProtocolError
from model_runtime.server import answers
from model_runtime.server.tensors.datatypes import DATATYPES

__all__ = ["HEADER_LENGTH", "bytes_from_binary", "from_binary"]

#: The binary tensor data extension's header: bytes of JSON at the start of the body (0: a
#: raw binary request, the whole body is the one input).
HEADER_LENGTH = "Inference-Header-Content-Length"


def _fail(message: str) -> ProtocolError:
    return ProtocolError(message)


def from_binary(name: str, datatype: str, chunk: memoryview) -> np.ndarray:
    """Input ``name``'s elements of the fixed-size ``datatype`` over ``chunk`` (no copy; its
    length is the caller's to check).

    Raises:
        ProtocolError: BOOL data holds a byte other than 0 or 1.
    """
    arr = np.frombuffer(chunk, dtype=DATATYPES[datatype])
    if datatype == "BOOL" and arr.size and arr.view(np.uint8).max() > 1:
        raise _fail(f"input {name!r}: BOOL binary data must be bytes 0 or 1")
    return arr


_LENGTH = struct.Struct("<I")


def bytes_from_binary(
    name: str,
    data: bytes | bytearray | memoryview,
    count: int,
    model: str = "",
    request_id: str | None = None,
) -> np.ndarray:
    """``count`` BYTES elements from ``data`` (each a 4-byte little-endian length, then that
    many bytes, nothing after the last) as a flat object array of ``bytes``.

    Nothing is allocated before ``count`` is known to fit ``data`` (each element needs at
    least its 4-byte length).

    Raises:
        ProtocolError: a length is cut off, an element runs past the end, fewer or more
            elements (or bytes) than ``count``: in Triton's words where the data holds
            another number of elements than ``count`` (or ends inside a length), else naming
            the input and the element.
    """
    view = memoryview(data).cast("B")
    end = len(view)

    def refuse(message: str) -> ProtocolError:  # Triton's words first, where it has some
        return _count_error(name, view, count, model, request_id) or _fail(message)

    if count * 4 > end:
        raise refuse(
            f"input {name!r}: {count} BYTES elements need at least {count * 4} bytes (a 4-byte "
            f"length each), the data has {end}"
        )
    out = np.empty(count, dtype=object)
    pos = 0
    unpack = _LENGTH.unpack_from
    for i in range(count):
        (n,) = unpack(view, pos)  # in range: each element left has 4 bytes (checked below)
        pos += 4
        if n > end - pos - 4 * (count - i - 1):
            raise refuse(
                f"input {name!r}: BYTES element {i} of {count} claims {n} bytes, but only "
                f"{end - pos - 4 * (count - i - 1)} remain for it"
            )
        out[i] = bytes(view[pos : pos + n])
        pos += n
    if pos != end:
        raise refuse(
            f"input {name!r}: {end - pos} bytes follow the last of its {count} BYTES elements"
        )
    return out


def _count_error(
    name: str, view: memoryview, count: int, model: str, request_id: str | None
) -> ProtocolError | None:
    """Triton's answer to BYTES data that does not hold ``count`` elements, as its core
    walks the data (an element that runs past the end takes the rest); None when it does."""
    end = len(view)
    pos = checked = 0
    unpack = _LENGTH.unpack_from
    while pos < end:
        if end - pos < 4:
            return answers.string_length_cut(name, model, end - pos, request_id)
        (n,) = unpack(view, pos)
        checked += 1
        if checked > count:
            return answers.string_elements_over(name, model, count, checked, request_id)
        pos += 4 + n
    if checked != count:
        return answers.string_elements_short(name, model, count, checked, request_id)
    return None

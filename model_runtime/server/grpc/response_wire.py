"""A ``ModelInferResponse`` written straight to its protobuf wire bytes.

The bytes are what protobuf's serialization of :func:`.codec.encode_model_infer_response`'s
message gives (fields in number order, proto3's defaults left out, shapes packed), made
without building the message: the answer of a unary call needs only its bytes. Each
output's header (name, datatype, shape) is kept once made, per name, datatype and shape.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from model_runtime.server.grpc.codec import output_payload
from model_runtime.server.tensors.datatypes import BYTES, DATATYPES
from model_runtime.server.tensors.request import InferRequest, TensorSpec

__all__ = ["model_infer_response_bytes"]

_ONE_BYTE = [bytes((i,)) for i in range(128)]
#: ``ModelInferResponse``'s fields (number << 3 | 2: length-delimited).
_MODEL_NAME, _MODEL_VERSION, _ID, _OUTPUT, _RAW = b"\x0a", b"\x12", b"\x1a", b"\x2a", b"\x32"
#: ``InferOutputTensor``'s.
_NAME, _DATATYPE, _SHAPE = b"\x0a", b"\x12", b"\x1a"
_HEADERS: dict[tuple[str, str, tuple[int, ...]], bytes] = {}
_HEADERS_MAX = 1024
#: The model name and version fields, per name and version.
_PREFIXES: dict[tuple[str, str], bytes] = {}


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _ONE_BYTE[n]
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(key: bytes, value: bytes) -> bytes:
    return key + _varint(len(value)) + value


def _header(name: str, datatype: str, shape: tuple[int, ...]) -> bytes:
    key = (name, datatype, shape)
    header = _HEADERS.get(key)
    if header is None:
        parts = []
        if name:
            parts.append(_field(_NAME, name.encode()))
        if datatype:
            parts.append(_field(_DATATYPE, datatype.encode()))
        if shape:
            parts.append(_field(_SHAPE, b"".join([_varint(d) for d in shape])))
        header = _field(_OUTPUT, b"".join(parts))
        if len(_HEADERS) >= _HEADERS_MAX:
            _HEADERS.clear()
        _HEADERS[key] = header
    return header


def model_infer_response_bytes(
    model_name: str,
    model_version: str,
    request: InferRequest,
    results: Mapping[str, np.ndarray],
    datatypes: Mapping[str, str],
    *,
    specs: Sequence[TensorSpec] = (),
    framed: bool = False,
) -> bytes:
    """The serialized ``ModelInferResponse`` of :func:`.codec.encode_model_infer_response`
    (the same arguments, the same shared memory writes); ``framed``: after gRPC's 5-byte
    message prefix (uncompressed, its length).

    Raises:
        KeyError: a requested output is missing from ``results``.
        SharedMemoryOutputSizeError: an output is larger than its part of its region.
        SharedMemoryShrunkError: an output's region shrank (its client cut the object).
    """
    prefix = _PREFIXES.get((model_name, model_version))
    if prefix is None:
        prefix = _prefix(model_name, model_version)
    parts = [b"", prefix] if framed else [prefix]
    size = len(prefix)
    if request.id:
        parts.append(_field(_ID, request.id.encode()))
        size += len(parts[-1])
    raw: list[bytes] = []
    for out in request.outputs:
        name = out.name
        arr = results[name]
        datatype = datatypes[name]
        if out.region is None and not out.class_count and datatype != BYTES:
            # (output_payload's plain case, inline: the common answer)
            dtype = DATATYPES[datatype]
            same = arr.dtype is dtype or arr.dtype == dtype  # (dtypes of a kind are one object)
            data = (arr if same else arr.astype(dtype)).tobytes()
            shape = arr.shape
        else:
            datatype, shape, data = output_payload(out, arr, datatype, specs)
        header = _HEADERS.get((name, datatype, shape))
        if header is None:
            header = _header(name, datatype, shape)
        n = len(data)
        length = _ONE_BYTE[n] if n < 0x80 else _varint(n)
        parts.append(header)
        raw.append(_RAW + length)
        raw.append(data)
        size += len(header) + 1 + len(length) + n
    parts += raw
    if framed:
        parts[0] = b"\0" + size.to_bytes(4, "big")
    return b"".join(parts)


def _prefix(model_name: str, model_version: str) -> bytes:
    prefix = b""
    if model_name:
        prefix += _field(_MODEL_NAME, model_name.encode())
    if model_version:
        prefix += _field(_MODEL_VERSION, model_version.encode())
    if len(_PREFIXES) >= _HEADERS_MAX:
        _PREFIXES.clear()
    _PREFIXES[model_name, model_version] = prefix
    return prefix

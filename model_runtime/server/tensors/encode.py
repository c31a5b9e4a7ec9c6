"""Encode inference responses (Open Inference Protocol v2, REST).

Responses are written by orjson straight from the arrays (no lists of Python numbers); FP16
and FP32 values are written as the float64 numbers they equal, as Triton writes them. An
output requested with ``classification`` comes back as BYTES (:mod:`.classification`).
Outputs asked for as binary data follow the JSON header, in the order of the outputs; outputs
asked for in a shared memory region are written there (:mod:`.shm_io`). The JSON around the
data of plain outputs (no classification, no region, no BYTES) is made once per framing (model,
version, outputs asked, their datatypes and shapes) and kept (:data:`_MAX_FRAMES`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import orjson

from model_runtime.errors import ProtocolError
from model_runtime.server.tensors.classification import bytes_to_binary, classify
from model_runtime.server.tensors.datatypes import BYTES, DATATYPES
from model_runtime.server.tensors.request import InferRequest, TensorSpec
from model_runtime.server.tensors.shm_io import write_output

__all__ = ["encode_infer_response"]

_JSON_AS = {"FP16": np.dtype(np.float64), "FP32": np.dtype(np.float64)}


def encode_infer_response(
    model_name: str,
    model_version: str,
    request: InferRequest,
    results: Mapping[str, np.ndarray],
    datatypes: Mapping[str, str],
    *,
    specs: Sequence[TensorSpec] = (),
    labels: Callable[[str], Sequence[str] | None] | None = None,
) -> tuple[bytes, int | None]:
    """Encode the requested outputs; return the body and, when binary data follows the JSON,
    the JSON header's length (for ``Inference-Header-Content-Length``).

    ``specs`` (the model's outputs) say which outputs have a batch axis, for classification
    (unknown: an output of two or more dimensions has one) and their class labels;
    ``labels``, when given, gives an output's class labels instead.

    An output asked for in a shared memory region is written there, and its entry in the
    response has its name, datatype and shape only (as Triton answers).

    Raises:
        KeyError: a requested output is missing from ``results``.
        SharedMemoryOutputSizeError: an output is larger than its part of its region.
        SharedMemoryShrunkError: an output's region shrank (its client cut the object).
    """
    framed = _framed(model_name, model_version, request, results, datatypes)
    if framed is not None:
        return framed
    doc: dict[str, Any] = {"model_name": model_name, "model_version": model_version}
    if request.id is not None:
        doc["id"] = request.id
    tensors: list[dict[str, Any]] = []
    chunks: list[bytes | memoryview] = []
    nonfinite: list[bytes] = []
    for out in request.outputs:
        arr = results[out.name]
        datatype = datatypes[out.name]
        if out.class_count:
            spec = next((s for s in specs if s.name == out.name), None)
            batched = arr.ndim >= 2 if spec is None else spec.has_batch_axis
            if labels is not None:
                names = labels(out.name)
            else:
                names = next((s.labels for s in specs if s.name == out.name), None)
            arr = classify(arr, out.class_count, batched=batched, labels=names)
            datatype = BYTES
        entry: dict[str, Any] = {"name": out.name, "datatype": datatype, "shape": list(arr.shape)}
        if out.region is not None:  # in its region: the response says what, not the data
            write_output(out.region, out.name, arr, datatype)
        elif datatype == BYTES:
            if out.binary:
                raw = bytes_to_binary(arr)
                entry["parameters"] = {"binary_data_size": len(raw)}
                chunks.append(raw)
            else:
                entry["data"] = _json_strings(out.name, arr)
        elif out.binary:
            flat = np.ascontiguousarray(arr, dtype=DATATYPES[datatype]).reshape(-1)
            entry["parameters"] = {"binary_data_size": flat.nbytes}
            chunks.append(flat.data.cast("B"))
        else:
            dtype = _JSON_AS.get(datatype, DATATYPES[datatype].newbyteorder("="))
            flat = np.ascontiguousarray(arr, dtype=dtype).reshape(-1)
            # A sum is finite when every element is (or, past 1e308, says look at each).
            if flat.dtype.kind == "f" and not math.isfinite(flat.sum()):
                nonfinite.append(_nonfinite_text(flat))  # written in after the dump
                entry["data"] = f"{_NONFINITE}{len(nonfinite) - 1}"
            else:
                entry["data"] = flat
        tensors.append(entry)
    doc["outputs"] = tensors
    header = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    for k, text in enumerate(nonfinite):
        header = header.replace(orjson.dumps(f"{_NONFINITE}{k}"), text, 1)
    if not chunks:
        return header, None
    return b"".join([header, *chunks]), len(header)


#: The JSON frames kept, by framing; emptied when full.
_FRAMES: dict[tuple[Any, ...], tuple[bytes, tuple[tuple[bytes, Any, bool], ...], bytes]] = {}
_MAX_FRAMES = 256
_DATA_AT = "\x00model-runtime-data"
#: The frame last used and what it was for: the requested outputs and the datatypes (the same
#: objects), the model, version and each output's shape; then, when every output is binary
#: data, the header it makes (without an id). A client repeating its request (a planned
#: request's outputs are its plan's) is framed without making a key, and its binary answer
#: without a list of pieces.
_LAST: list[Any] = [None, None, None, None, (), None, None]
#: Binary output data up to this size is copied out whole (``tobytes``) rather than viewed.
_COPY_BELOW = 4096


def _framed(
    model_name: str,
    model_version: str,
    request: InferRequest,
    results: Mapping[str, np.ndarray],
    datatypes: Mapping[str, str],
) -> tuple[bytes, int | None] | None:
    """:func:`encode_infer_response` of plain outputs from their kept frame, the same bytes;
    None: not plain outputs (the document is made whole)."""
    outputs = request.outputs
    last = _LAST
    frame = None
    if (
        last[0] is outputs  # the same requested outputs (a planned request's are shared)
        and last[1] is datatypes
        and last[2] == model_name
        and last[3] == model_version
    ):
        shapes = last[4]
        for i, out in enumerate(outputs):
            if results[out.name].shape != shapes[i]:
                break
        else:
            frame = last[5]
            header = last[6]
            if header is not None and request.id is None:  # every output binary data
                chunks: list[bytes | memoryview] = [header]
                for i, out in enumerate(outputs):
                    arr = results[out.name]
                    dtype = frame[1][i][1]
                    if not (arr.dtype is dtype or arr.dtype == dtype) or arr.nbytes > _COPY_BELOW:
                        break
                    chunks.append(arr.tobytes())
                else:
                    return b"".join(chunks), len(header)
    if frame is None:
        key: list[Any] = [model_name, model_version]
        for out in outputs:
            if out.class_count or out.region is not None:
                return None
            arr = results[out.name]
            key += (out.name, out.binary, datatypes[out.name], arr.shape)
        frame = _FRAMES.get(k := tuple(key))
        if frame is None:
            frame = _frame(model_name, model_version, request, results, datatypes)
            if frame is None:
                return None
            if len(_FRAMES) >= _MAX_FRAMES:
                _FRAMES.clear()
            _FRAMES[k] = frame
        # Kept with what it was for (held: no other object comes at its id).
        head, parts, end = frame
        binary = bool(parts) and all(part[2] for part in parts)
        header = b"".join([head, *(part[0] for part in parts), end]) if binary else None
        _LAST[:] = (outputs, datatypes, model_name, model_version, tuple(key[5::4]), frame, header)
    head, parts, end = frame
    pieces: list[bytes | memoryview] = [head]
    if request.id is not None:
        pieces += (b',"id":', orjson.dumps(request.id))
    chunks = []
    for i, out in enumerate(outputs):  # (the frame has a part per output)
        before, dtype, binary = parts[i]
        pieces.append(before)
        arr = results[out.name]
        same = arr.dtype is dtype or arr.dtype == dtype  # (dtypes of a kind are one object)
        if binary and same and arr.nbytes <= _COPY_BELOW:
            chunks.append(arr.tobytes())  # (C order, contiguous or not: cheaper than views)
            continue
        if not same or not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr, dtype=dtype)
        flat = arr.reshape(-1)
        if binary:
            chunks.append(flat.data.cast("B"))
            continue
        text = orjson.dumps(flat, option=_NUMPY)
        if b"null" in text and flat.dtype.kind == "f":  # orjson's NaN and infinities
            text = _nonfinite_text(flat)
        pieces.append(text)
    pieces.append(end)
    header = b"".join(pieces)
    if not chunks:
        return header, None
    if len(chunks) == 1:
        return header + chunks[0], len(header)
    return b"".join([header, *chunks]), len(header)


def _frame(
    model_name: str,
    model_version: str,
    request: InferRequest,
    results: Mapping[str, np.ndarray],
    datatypes: Mapping[str, str],
) -> tuple[bytes, tuple[tuple[bytes, Any, bool], ...], bytes] | None:
    """The frame of plain outputs: the document's text up to its id, then before each
    output's data (with the dtype it is written as, and whether it is binary data), and its
    end. None: an output that is not plain."""
    tensors: list[dict[str, Any]] = []
    kinds: list[tuple[Any, bool]] = []
    for k, out in enumerate(request.outputs):
        datatype = datatypes[out.name]
        if datatype == BYTES:
            return None
        shape = list(results[out.name].shape)
        entry: dict[str, Any] = {"name": out.name, "datatype": datatype, "shape": shape}
        if out.binary:
            dtype = DATATYPES[datatype]
            entry["parameters"] = {"binary_data_size": math.prod(shape) * dtype.itemsize}
        else:
            dtype = _JSON_AS.get(datatype, DATATYPES[datatype].newbyteorder("="))
            entry["data"] = f"{_DATA_AT}{k}"
        tensors.append(entry)
        kinds.append((np.dtype(dtype), out.binary))
    head = orjson.dumps({"model_name": model_name, "model_version": model_version})[:-1]
    text = b',"outputs":' + orjson.dumps(tensors) + b"}"
    parts: list[tuple[bytes, Any, bool]] = []
    pos = 0
    for k, (dtype, binary) in enumerate(kinds):
        before = b""
        if not binary:
            mark = orjson.dumps(f"{_DATA_AT}{k}")
            at = text.index(mark, pos)
            before, pos = text[pos:at], at + len(mark)
        parts.append((before, dtype, binary))
    return head, tuple(parts), text[pos:]


def _json_strings(name: str, arr: np.ndarray) -> list[str]:
    """BYTES elements as JSON strings.

    Raises:
        ProtocolError: an element is not UTF-8, which a JSON string cannot carry (naming the
            output and the element, and the binary data that can).
    """
    out = []
    for i, v in enumerate(arr.ravel()):
        try:
            out.append(v.decode("utf-8") if isinstance(v, bytes) else str(v))
        except UnicodeDecodeError:
            raise ProtocolError(
                f"output '{name}' element {i} is not valid UTF-8, which JSON cannot carry: "
                'ask for the output as binary data ("binary_data": true)'
            ) from None
    return out


#: Stands in a document for a float array with NaN or infinities until it is written in.
_NONFINITE = "\x00model-runtime-nonfinite:"
_SPECIAL = {"nan": b"NaN", "inf": b"Infinity", "-inf": b"-Infinity"}


def _nonfinite_text(flat: np.ndarray) -> bytes:
    """A float array as JSON text with NaN, Infinity and -Infinity written as Triton writes
    them (rapidjson's kWriteNanAndInfFlag; Python's json reads them), where orjson writes
    null."""
    parts = [
        _SPECIAL[repr(float(v))] if not np.isfinite(v) else orjson.dumps(v, option=_NUMPY)
        for v in flat
    ]
    return b"[" + b",".join(parts) + b"]"


_NUMPY = orjson.OPT_SERIALIZE_NUMPY

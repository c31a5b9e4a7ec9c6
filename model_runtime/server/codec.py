"""Decode inference requests and encode responses (Open Inference Protocol v2, REST).

A request body is a JSON document, optionally followed by raw tensor bytes (the binary tensor
data extension): ``Inference-Header-Content-Length`` says how many leading bytes are JSON, and
each input carried in binary says its size in ``parameters.binary_data_size``, in input order.

The decoder treats every declared number as a claim to check, never as a size to allocate: a
shape's element count is computed with Python integers and compared with the elements (JSON)
or bytes (binary) actually present before any array exists. Binary inputs become zero-copy
views of the request body; JSON inputs become arrays no larger than the JSON they came from.
Everything wrong with a request raises :class:`ProtocolError` (HTTP 400) with a message that
names the tensor and the defect.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from model_runtime.errors import InputValidationError
from model_runtime.server.datatypes import BYTES, DATATYPES

__all__ = [
    "MAX_DIMS",
    "InferRequest",
    "ProtocolError",
    "RequestedOutput",
    "TensorSpec",
    "encode_infer_response",
    "parse_infer_request",
]

#: More dimensions than this is refused (numpy's own limit is 64).
MAX_DIMS = 32
#: A single dimension larger than this is refused (it could never be backed by a request body).
MAX_DIM = 2**40


class ProtocolError(InputValidationError):
    """The request does not follow the protocol or does not fit the model (HTTP 400)."""


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One model input or output as the protocol describes it (``-1``: any size)."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class RequestedOutput:
    """An output the client asked for, and whether it wants it as binary data."""

    name: str
    binary: bool


@dataclass(slots=True)
class InferRequest:
    """A decoded inference request."""

    id: str | None
    inputs: dict[str, np.ndarray]
    outputs: tuple[RequestedOutput, ...]
    parameters: dict[str, Any] = field(default_factory=dict)


def _fail(message: str) -> ProtocolError:
    return ProtocolError(message)


def _header_split(body: bytes, header_length: int | None) -> tuple[bytes, memoryview]:
    if header_length is None:
        return body, memoryview(b"")
    if header_length < 0 or header_length > len(body):
        raise _fail(
            f"Inference-Header-Content-Length is {header_length}, but the body has "
            f"{len(body)} bytes"
        )
    view = memoryview(body)
    return bytes(view[:header_length]), view[header_length:]


def _load_json(header: bytes, whole_body: bool) -> dict[str, Any]:
    try:
        doc = json.loads(header)
    except json.JSONDecodeError as exc:
        hint = ""
        if whole_body and exc.msg == "Extra data":
            hint = " (binary data after the JSON needs an Inference-Header-Content-Length header)"
        raise _fail(f"the request is not valid JSON{hint}: {exc}") from None
    except (ValueError, RecursionError) as exc:
        raise _fail(f"the request is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise _fail(f"the request must be a JSON object, got {type(doc).__name__}")
    return doc


def _shape(name: str, raw: Any) -> tuple[int, ...]:
    if not isinstance(raw, list):
        raise _fail(f"input {name!r}: 'shape' must be a list of integers")
    if len(raw) > MAX_DIMS:
        raise _fail(f"input {name!r}: shape has {len(raw)} dimensions (at most {MAX_DIMS})")
    for d in raw:
        if isinstance(d, bool) or not isinstance(d, int) or not 0 <= d <= MAX_DIM:
            raise _fail(f"input {name!r}: shape {raw} must hold integers in [0, {MAX_DIM}]")
    return tuple(raw)


def _elements(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d  # Python ints: no overflow, and nothing is allocated
    return n


def _flatten(name: str, data: Any, expected: int) -> list[Any]:
    if not isinstance(data, list):
        raise _fail(f"input {name!r}: 'data' must be a list")
    if not data or not isinstance(data[0], list):
        return data  # flat; a list hidden further on makes the numpy conversion fail (400)
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            out.append(item)
            if len(out) > expected:
                raise _fail(f"input {name!r}: 'data' has more than the {expected} elements")
        else:
            stack.pop()
    return out


def _from_json(name: str, datatype: str, data: list[Any]) -> np.ndarray:
    dtype = DATATYPES[datatype]
    if not data:
        return np.empty(0, dtype)
    try:
        arr = np.array(data)
    except (ValueError, TypeError, OverflowError) as exc:
        raise _fail(f"input {name!r}: 'data' is not a list of {datatype} values: {exc}") from None
    kind = arr.dtype.kind
    if datatype == "BOOL":
        if kind != "b":
            raise _fail(f"input {name!r}: BOOL data must be true/false")
        return arr
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        if kind in "iu":
            low, high = int(arr.min()), int(arr.max())
        elif kind in "Of" and all(type(v) is int for v in data):
            # Integers that do not all fit one of int64/uint64 ([1, 2**63], [-1, 2**63],
            # 2**64) come out of numpy as float64 or object: check them as Python ints.
            low, high = min(data), max(data)
            arr = np.array(data, dtype=dtype) if info.min <= low and high <= info.max else arr
        else:
            raise _fail(f"input {name!r}: {datatype} data must be integers")
        # Checked before the cast: astype would wrap (-1 as UINT8 is 255) without a word.
        if low < info.min:
            raise _fail(_out_of_range(name, datatype, low, info))
        if high > info.max:
            raise _fail(_out_of_range(name, datatype, high, info))
    elif kind not in "iuf":
        raise _fail(f"input {name!r}: {datatype} data must be numbers")
    return arr.astype(dtype, copy=False)


def _out_of_range(name: str, datatype: str, value: int, info: np.iinfo[Any]) -> str:
    return f"input {name!r}: value {value} is out of the {datatype} range [{info.min}, {info.max}]"


def _from_binary(name: str, datatype: str, chunk: memoryview) -> np.ndarray:
    arr = np.frombuffer(chunk, dtype=DATATYPES[datatype])
    if datatype == "BOOL" and arr.size and arr.view(np.uint8).max() > 1:
        raise _fail(f"input {name!r}: BOOL binary data must be bytes 0 or 1")
    return arr


def _parameters(where: str, raw: Any) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise _fail(f"{where}: 'parameters' must be a JSON object")
    return raw


def _binary_size(name: str, params: Mapping[str, Any]) -> int | None:
    size = params.get("binary_data_size")
    if size is None:
        return None
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise _fail(f"input {name!r}: binary_data_size must be a non-negative integer")
    return size


def _check_datatype(name: str, datatype: Any, spec: TensorSpec, model: str) -> str:
    if not isinstance(datatype, str):
        raise _fail(f"input {name!r}: 'datatype' must be a string")
    if datatype == BYTES:
        raise _fail(
            f"input {name!r}: datatype BYTES is not supported by model {model!r}, which has "
            f"no BYTES input ({name!r} is {spec.datatype})"
        )
    if datatype not in DATATYPES:
        known = ", ".join([*DATATYPES, BYTES])
        raise _fail(f"input {name!r}: unknown datatype {datatype!r} (known: {known})")
    if datatype != spec.datatype:
        raise _fail(
            f"input {name!r}: datatype {datatype} does not match the model's {spec.datatype}"
        )
    return datatype


def _requested_outputs(
    raw: Any, outputs: Sequence[TensorSpec], binary_default: bool
) -> tuple[RequestedOutput, ...]:
    if raw is None:
        return tuple(RequestedOutput(s.name, binary_default) for s in outputs)
    if not isinstance(raw, list):
        raise _fail("'outputs' must be a list of objects")
    known = {s.name for s in outputs}
    chosen: list[RequestedOutput] = []
    for item in raw:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise _fail("each of 'outputs' must be an object with a string 'name'")
        name = item["name"]
        if name not in known:
            raise _fail(f"unknown output {name!r} (the model has {sorted(known)})")
        if any(o.name == name for o in chosen):
            raise _fail(f"output {name!r} is requested twice")
        binary = _parameters(f"output {name!r}", item.get("parameters")).get(
            "binary_data", binary_default
        )
        if not isinstance(binary, bool):
            raise _fail(f"output {name!r}: binary_data must be true or false")
        chosen.append(RequestedOutput(name, binary))
    return tuple(chosen)


def parse_infer_request(
    body: bytes,
    header_length: int | None,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    *,
    model: str = "",
) -> InferRequest:
    """Decode and check one inference request for a model with ``inputs`` and ``outputs``.

    ``header_length`` is the ``Inference-Header-Content-Length`` header (None when absent:
    the whole body is JSON). Shapes are checked only against the data given; whether they
    fit the model (batch axis, per-sample shape) is the runner's check.

    Raises:
        ProtocolError: malformed JSON, unknown/missing/duplicate inputs, wrong or unknown
            datatype names, shape and data that disagree, JSON integers outside the declared
            datatype's range, binary sizes that do not add up, unknown or twice-requested
            outputs, or a bad ``id`` or ``parameters``.
    """
    header, binary = _header_split(body, header_length)
    doc = _load_json(header, header_length is None)
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise _fail("'id' must be a string")
    params = _parameters("request", doc.get("parameters"))
    binary_output = params.get("binary_data_output", False)
    if not isinstance(binary_output, bool):
        raise _fail("binary_data_output must be true or false")
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise _fail("'inputs' must be a non-empty list")
    specs = {s.name: s for s in inputs}
    arrays: dict[str, np.ndarray] = {}
    offset = 0
    for item in raw_inputs:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise _fail("each of 'inputs' must be an object with a string 'name'")
        name = item["name"]
        spec = specs.get(name)
        if spec is None:
            raise _fail(f"unknown input {name!r} (the model has {sorted(specs)})")
        if name in arrays:
            raise _fail(f"input {name!r} is given twice")
        datatype = _check_datatype(name, item.get("datatype"), spec, model)
        shape = _shape(name, item.get("shape"))
        count = _elements(shape)
        size = _binary_size(name, _parameters(f"input {name!r}", item.get("parameters")))
        if size is not None:
            if "data" in item:
                raise _fail(f"input {name!r}: give either 'data' or binary_data_size, not both")
            expected = count * DATATYPES[datatype].itemsize
            if size != expected:
                raise _fail(
                    f"input {name!r}: binary_data_size is {size} bytes, but shape "
                    f"{list(shape)} of {datatype} needs {expected}"
                )
            if offset + size > len(binary):
                raise _fail(
                    f"input {name!r}: binary data sizes add up to more than the "
                    f"{len(binary)} bytes after the JSON header"
                )
            flat = _from_binary(name, datatype, binary[offset : offset + size])
            offset += size
        else:
            if "data" not in item:
                raise _fail(f"input {name!r}: no 'data' and no binary_data_size")
            values = _flatten(name, item["data"], count)
            if len(values) != count:
                raise _fail(
                    f"input {name!r}: shape {list(shape)} needs {count} elements, "
                    f"'data' has {len(values)}"
                )
            flat = _from_json(name, datatype, values)
        try:
            arrays[name] = flat.reshape(shape)
        except ValueError as exc:  # pragma: no cover - counts were checked above
            raise _fail(f"input {name!r}: {exc}") from None
    if offset != len(binary):
        raise _fail(
            f"binary data sizes add up to {offset} bytes, but {len(binary)} bytes follow "
            "the JSON header"
        )
    missing = sorted(set(specs) - set(arrays))
    if missing:
        raise _fail(f"missing input(s) {missing} (the model needs {sorted(specs)})")
    return InferRequest(
        id=request_id,
        inputs=arrays,
        outputs=_requested_outputs(doc.get("outputs"), outputs, binary_output),
        parameters=params,
    )


def encode_infer_response(
    model_name: str,
    model_version: str,
    request: InferRequest,
    results: Mapping[str, np.ndarray],
    datatypes: Mapping[str, str],
) -> tuple[bytes, int | None]:
    """Encode the requested outputs; return the body and, when binary data follows the JSON,
    the JSON header's length (for ``Inference-Header-Content-Length``).

    Raises:
        KeyError: a requested output is missing from ``results``.
    """
    doc: dict[str, Any] = {"model_name": model_name, "model_version": model_version}
    if request.id is not None:
        doc["id"] = request.id
    tensors: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    for out in request.outputs:
        arr = results[out.name]
        datatype = datatypes[out.name]
        entry: dict[str, Any] = {"name": out.name, "datatype": datatype, "shape": list(arr.shape)}
        if out.binary:
            raw = np.ascontiguousarray(arr, dtype=DATATYPES[datatype]).tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = arr.ravel().tolist()
        tensors.append(entry)
    doc["outputs"] = tensors
    header = json.dumps(doc, separators=(",", ":")).encode()
    if not chunks:
        return header, None
    return b"".join([header, *chunks]), len(header)

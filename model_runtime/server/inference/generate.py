"""Triton's generate extension, protocol-neutral: a generate request's JSON object made an
inference request, and a response made the generate response's JSON object
(``docs/protocol/extension_generate.md``; Triton's ``src/http_server.cc`` ``GenerateRequestClass``).

A request maps each key to a model input of that name (a scalar or a flat list of values, the
input's shape completed from the model's: fixed dimensions divide the count, the innermost
dynamic one takes the rest, any other is 1) or, for any other key, to a request parameter
(a string, integer, boolean or number); ``parameters`` holds more of either, and ``id`` is also
the request's id. Keys are read in their order and each error is Triton's text: a duplicate
input, a value of the wrong JSON type, a nested object where a parameter goes, inputs past the
size limit, a count of inputs the model does not take. A response holds ``id`` (when the
request had one), ``model_name``, ``model_version``, its parameters and each output by name
(one element: the value alone).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import orjson

from model_runtime.errors import ProtocolError
from model_runtime.server import answers
from model_runtime.server.repository.entries import ModelEntry
from model_runtime.server.tensors.datatypes import BYTES, DATATYPES
from model_runtime.server.tensors.parameters import request_parameters
from model_runtime.server.tensors.request import InferRequest, RequestedOutput, TensorSpec

__all__ = ["GENERATE_ONE", "error_json", "generate_request", "generate_response"]

#: Triton's answer to ``generate`` for a model that gave other than one response.
GENERATE_ONE = (
    "generate expects model to produce exactly 1 response, use generate stream for model "
    "that generates various number of responses"
)
_PARAMETERS = "parameters"
_INT_KINDS = "iu"


def _object_pairs(pairs: list[tuple[str, Any]]) -> _Pairs:
    return _Pairs(pairs)


class _Pairs(list[tuple[str, Any]]):
    """A JSON object as its key-value pairs in order, duplicates kept (as Triton reads it)."""


def _parse(body: bytes | bytearray) -> _Pairs:
    if not body.strip():
        return _Pairs()
    try:
        doc = json.loads(bytes(body), object_pairs_hook=_object_pairs)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"failed to parse the request JSON buffer: {exc}") from None
    if not isinstance(doc, _Pairs):
        raise ProtocolError("the generate request must be a JSON object")
    return doc


def _plain(value: Any) -> Any:
    """``value`` with its objects as dicts (what a parameter holds is checked elsewhere)."""
    if isinstance(value, _Pairs):
        return {k: _plain(v) for k, v in value}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


class _Builder:
    """One generate request being read (Triton's ``ConvertGenerateRequest``)."""

    def __init__(self, entry: ModelEntry, limit: int) -> None:
        self.specs = {s.name: s for s in entry.inputs}
        self.model = entry.name
        self.limit = limit
        self.consumed = 0
        self.inputs: dict[str, np.ndarray] = {}
        self.parameters: dict[str, Any] = {}
        self.request_id: str | None = None

    def read(self, pairs: _Pairs, nested: bool = False) -> None:
        for key, value in pairs:
            if not nested and key == _PARAMETERS:
                if key in self.specs:
                    raise ProtocolError(
                        f"Keyword '{key}' for nested schema also given as input tensor name"
                    )
                if not isinstance(value, _Pairs):
                    raise ProtocolError(
                        f"Expected JSON object for keyword: '{key}': attempt to access JSON "
                        "non-object as object"
                    )
                try:
                    self.read(value, nested=True)
                except ProtocolError as exc:
                    raise ProtocolError(f"Converting keyword: '{key}': {exc}") from None
                continue
            self.one(key, value)

    def one(self, key: str, value: Any) -> None:
        spec = self.specs.get(key)
        if spec is None:
            if isinstance(value, (_Pairs, list)) or value is None:
                raise ProtocolError(
                    f"parameter '{key}' has invalid type. It should be either 'int', 'bool', "
                    "or 'string'."
                )
            self.parameters[key] = value
            return
        if key in self.inputs:
            raise answers.duplicate_input(key, self.request_id)
        values = value if isinstance(value, list) else [value]
        if spec.datatype == BYTES:
            size = 0
            for v in values:
                if not isinstance(v, str):
                    raise ProtocolError(
                        "Unable to parse JSON bytes array: attempt to access JSON non-string "
                        "as string"
                    )
                size += len(v.encode()) + 4
        else:
            size = len(values) * DATATYPES[spec.datatype].itemsize
        if size + self.consumed > self.limit:
            raise ProtocolError(
                f"request size of {self.consumed} bytes with input '{key}' of size {size} "
                f"bytes exceeds the maximum allowed input size of {self.limit}. Use "
                "--http-max-input-size to increase the limit."
            )
        self.consumed += size
        shape = _shape(key, spec, len(values))
        self.inputs[key] = _array(spec, values).reshape(shape)


def _shape(name: str, spec: TensorSpec, count: int) -> tuple[int, ...]:
    """``spec``'s shape for ``count`` elements, as Triton completes a generate input's."""
    if count == 0:
        return tuple(0 if d == -1 else d for d in spec.shape) or (0,)
    dims = list(spec.shape)
    left = count
    for d in reversed(dims):
        if d != -1:
            if d == 0 or left % d:
                raise _unshaped(name)
            left //= d
    for i in range(len(dims) - 1, -1, -1):
        if dims[i] == -1:
            dims[i], left = left, 1
    if left != 1:
        raise _unshaped(name)
    return tuple(dims)


def _unshaped(name: str) -> ProtocolError:
    return ProtocolError(f"The schema can not convert input '{name}' to tensor with proper shape")


def _array(spec: TensorSpec, values: Sequence[Any]) -> np.ndarray:
    datatype = spec.datatype
    if datatype == BYTES:
        return np.array([v.encode() for v in values] or [], dtype=object)
    dtype = DATATYPES[datatype]
    for v in values:
        if datatype == "BOOL":
            if not isinstance(v, bool):
                raise ProtocolError("attempt to access JSON non-boolean as boolean")
        elif dtype.kind in _INT_KINDS:
            if not isinstance(v, int) or isinstance(v, bool):
                kind = "unsigned-integer" if dtype.kind == "u" else "signed-integer"
                raise ProtocolError(f"attempt to access JSON non-{kind} as {kind}")
            info = np.iinfo(dtype)
            if not info.min <= v <= info.max:
                raise ProtocolError(f"input '{spec.name}': {v} is out of range for {datatype}")
        elif not isinstance(v, (int, float)) or isinstance(v, bool):
            raise ProtocolError("attempt to access JSON non-number as double")
    return np.array(values, dtype=dtype)


def _required(entry: ModelEntry) -> tuple[int, int, list[str]]:
    """The inputs ``entry`` needs at least and takes at most, and the required names."""
    config = entry.served
    optional = {t.name for t in getattr(config, "input", ()) if getattr(t, "optional", False)}
    names = [s.name for s in entry.inputs]
    required = [n for n in names if n not in optional]
    return len(required), len(names), required


def _check_count(
    entry: ModelEntry, inputs: Mapping[str, np.ndarray], request_id: str | None
) -> None:
    """Triton's check of a request's input count (``InferenceRequest::ValidateRequestInputs``)."""
    least, most, required = _required(entry)
    if least <= len(inputs) <= most:
        return
    missing = "[" + ",".join(f"'{n}'" for n in required if n not in inputs) + "]"
    got = "[" + ",".join(f"'{n}'" for n in inputs) + "]"
    prefix = f"[request id: {request_id}] " if request_id else ""
    expected = f"{most} inputs" if least == most else f"number of inputs between {least} and {most}"
    raise ProtocolError(
        f"{prefix}expected {expected} but got {len(inputs)} inputs for model '{entry.name}'. "
        f"Got input(s) {got}, but missing required input(s) {missing}. Please provide all "
        "required input(s)."
    )


def generate_request(
    body: bytes | bytearray, entry: ModelEntry, limit: int, *, python: bool
) -> InferRequest:
    """The inference request a generate request's ``body`` makes for ``entry``, every output
    requested; ``limit``: the bytes its inputs may take; ``python``: the model takes any
    parameter (a python model reads them), else only those an infer request may have.

    Raises:
        ProtocolError: what is wrong with the request, in Triton's words (module docstring).
    """
    pairs = _parse(body)
    builder = _Builder(entry, limit)
    for key, value in pairs:
        if key == "id":
            if not isinstance(value, str):
                raise ProtocolError(
                    "Unable to parse 'id': attempt to access JSON non-string as string"
                )
            builder.request_id = value or None
    builder.read(pairs)
    inputs = builder.inputs
    _check_count(entry, inputs, builder.request_id)
    params = {k: _plain(v) for k, v in builder.parameters.items() if k != "id"}
    known = {k: v for k, v in params.items() if k in ("timeout", "priority")}
    checked = request_parameters(known if python else params, entry.name)
    return InferRequest(
        id=builder.request_id,
        inputs=inputs,
        outputs=tuple(RequestedOutput(s.name, False) for s in entry.outputs),
        parameters=params,
        timeout=checked.timeout,
        priority=checked.priority,
    )


def _json_value(array: np.ndarray) -> Any:
    flat = array.ravel()
    if array.dtype == object or array.dtype.kind == "S":
        values: list[Any] = [
            v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in flat
        ]
    else:
        values = flat.tolist()
    return values[0] if len(values) == 1 else values


def generate_response(
    entry: ModelEntry,
    request_id: str | None,
    outputs: Mapping[str, np.ndarray],
    parameters: Mapping[str, Any],
) -> bytes:
    """The generate response's JSON object for one response of ``entry``."""
    doc: dict[str, Any] = {}
    if request_id:
        doc["id"] = request_id
    doc["model_name"] = entry.name
    doc["model_version"] = entry.version
    for name, value in parameters.items():
        if isinstance(value, (bool, int, float, str)):
            doc[str(name)] = value
    for name, array in outputs.items():
        doc[name] = _json_value(np.asarray(array))
    return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)


def error_json(message: str) -> bytes:
    """Triton's error object."""
    return orjson.dumps({"error": message})

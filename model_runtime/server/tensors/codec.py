"""Decode inference requests (Open Inference Protocol v2, REST); responses are
:mod:`model_runtime.server.tensors.encode`'s.

A request body is a JSON document, optionally followed by raw tensor bytes (the binary tensor
data extension): ``Inference-Header-Content-Length`` says how many leading bytes are JSON, and
each input carried in binary says its size in ``parameters.binary_data_size``, in input order.

The decoder treats every declared number as a claim to check, never as a size to allocate: a
shape's element count is computed with Python integers and compared with the elements (JSON)
or bytes (binary) actually present before any array exists. Binary inputs become zero-copy
views of the request body. JSON up to 1 MiB is parsed by simdjson, numeric ``data`` arrays
copied from its tape as buffers (:mod:`.jsontape`); what it does not read, and bigger JSON, by
orjson, big ``data`` arrays converted from their text slice by slice, never as one list of
Python numbers (:mod:`.jsonnumbers`). Either way the same requests decode to the same arrays,
and decoding costs about the body plus the tensors. Every parameter is honoured or refused
(:mod:`.parameters`). Everything wrong with a request raises :class:`ProtocolError` (HTTP 400)
with a message that names the tensor and the defect.

BYTES inputs (a model's string tensors) arrive as JSON strings (UTF-8 encoded) or as binary
data, each element a 4-byte little-endian length then its bytes (:func:`bytes_from_binary`);
they become numpy object arrays of ``bytes``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson

from model_runtime.errors import ProtocolError
from model_runtime.server import answers
from model_runtime.server.tensors import jsontape, plans
from model_runtime.server.tensors.binary import bytes_from_binary, from_binary
from model_runtime.server.tensors.datatypes import BYTES, DATATYPES
from model_runtime.server.tensors.jsonnumbers import (
    NO_CUTS,
    Cuts,
    Retry,
    cut_number_arrays,
    flatten,
    parse_number_span,
    values_to_array,
)
from model_runtime.server.tensors.parameters import (
    check_input_parameters,
    model_parameters,
    output_parameters,
    region_parameters,
    request_parameters,
)
from model_runtime.server.tensors.request import (
    InferRequest,
    RequestedOutput,
    TensorSpec,
    check_datatype,
    check_shape,
    element_count,
)
from model_runtime.server.tensors.shm import Lease, SharedMemoryRegistry
from model_runtime.server.tensors.shm_io import (
    data_beside_region,
    lease_output,
    read_input,
    release,
)

__all__ = ["parse_infer_request"]

#: The registry a request's regions come from (None: none served) and the leases it took.
_Shm = tuple[SharedMemoryRegistry | None, list[Lease]]


def _fail(message: str) -> ProtocolError:
    return ProtocolError(message)


def _header_end(body: bytes | bytearray, header_length: int | None) -> int:
    if header_length is None:
        return len(body)
    if header_length < 0 or header_length > len(body):
        raise _fail(
            f"Inference-Header-Content-Length is {header_length}, but the body has "
            f"{len(body)} bytes"
        )
    return header_length


def _load_json(text: bytes | memoryview, whole_body: bool, exact: bool) -> dict[str, Any]:
    try:
        # The standard library keeps integers past 64 bits exact; orjson makes floats of them.
        doc = json.loads(bytes(text)) if exact else orjson.loads(text)
    except json.JSONDecodeError as exc:  # orjson's error is a subclass
        hint = ""
        trailing = exc.msg == "Extra data" or exc.msg.startswith("unexpected content after")
        if whole_body and trailing:
            hint = " (binary data after the JSON needs an Inference-Header-Content-Length header)"
        raise _fail(f"the request is not valid JSON{hint}: {exc}") from None
    except (ValueError, RecursionError) as exc:
        raise _fail(f"the request is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise _fail(f"the request must be a JSON object, got {type(doc).__name__}")
    return doc


def _strings(name: str, values: list[Any]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        if not isinstance(v, str):
            raise _fail(
                f"input {name!r}: BYTES data must be strings, element {i} is {type(v).__name__}"
            )
        out[i] = v.encode("utf-8", "surrogatepass")
    return out


def _parameters(where: str, raw: Any) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise _fail(f"{where}: 'parameters' must be a JSON object")
    return raw


def _requested_outputs(
    raw: Any,
    outputs: Sequence[TensorSpec],
    binary_default: bool,
    model: str,
    request_id: str | None,
    regions: SharedMemoryRegistry | None,
    leases: list[Lease],
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
            raise answers.unknown_output(name, model)
        if any(o.name == name for o in chosen):
            raise answers.duplicate_output(name, request_id)
        extra = set(item) - {"name", "parameters"}
        if extra:
            raise _fail(f"output {name!r}: unknown field(s) {sorted(extra)}")
        where = f"output {name!r}"
        params = output_parameters(
            name, _parameters(where, item.get("parameters")), binary_default, model
        )
        ref = params.region
        lease = None if ref is None else lease_output(regions, leases, name, ref)
        chosen.append(RequestedOutput(name, params.binary, params.class_count, lease))
    return tuple(chosen)


def parse_infer_request(
    body: bytes | bytearray,
    header_length: int | None,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    *,
    model: str = "",
    regions: SharedMemoryRegistry | None = None,
) -> InferRequest:
    """Decode and check one inference request for a model with ``inputs`` and ``outputs``.

    ``header_length`` is the ``Inference-Header-Content-Length`` header (None when absent:
    the whole body is JSON). Shapes are checked only against the data given; whether they
    fit the model (batch axis, per-sample shape) is the runner's check. Binary inputs are
    views of ``body`` (writable if ``body`` is a bytearray): keep it unchanged while in use.
    Tensors that name a shared memory region are read from (or leased for) ``regions``
    (:mod:`.shm_io`); :meth:`InferRequest.release` the request once answered.

    Raises:
        ProtocolError: malformed JSON, unknown/missing/duplicate inputs, wrong or unknown
            datatype names, shape and data that disagree, JSON integers outside the declared
            datatype's range, binary sizes that do not add up, unknown or twice-requested
            outputs, a bad ``id``, or a parameter that is unknown or not supported (see
            :mod:`model_runtime.server.tensors.parameters`).
        SharedMemoryError: a region that is not registered, offset and size outside it, or
            an object its client shrank (SharedMemoryShrunkError).
    """
    leases: list[Lease] = []
    try:
        return _parse(body, header_length, inputs, outputs, model, (regions, leases))
    except BaseException:
        release(leases)
        raise


def _parse(
    body: bytes | bytearray,
    header_length: int | None,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    model: str,
    shm: _Shm,
) -> InferRequest:
    end = _header_end(body, header_length)
    layout: plans.Layout = []
    if header_length is None:
        key = plans.json_key(body)
        planned = None if key is None else plans.json_request(model, key, body, inputs, outputs)
        if planned is not None:
            return planned
        binary = memoryview(body)[end:]
        if key is None:
            return _parse_json(body, end, binary, inputs, outputs, model, shm, None, whole=True)
        parsed = _parse_json(body, end, binary, inputs, outputs, model, shm, layout, whole=True)
        plans.remember_json(model, key, inputs, outputs, parsed, layout)
        return parsed
    binary = memoryview(body)[end:]
    header = bytes(body[:end])
    planned = plans.binary_request(model, header, inputs, outputs, binary)
    if planned is not None:
        return planned
    parsed = _parse_json(header, end, binary, inputs, outputs, model, shm, layout, whole=False)
    plans.remember_binary(model, header, inputs, outputs, parsed, layout, len(binary))
    return parsed


def _parse_json(
    text: bytes | bytearray,
    end: int,
    binary: memoryview,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    model: str,
    shm: _Shm,
    layout: plans.Layout | None,
    *,
    whole: bool,
) -> InferRequest:
    """Decode the request whose JSON is ``text[:end]`` (``binary``: the bytes after it);
    ``layout``: where its inputs lay, as the fast decoder read them (:mod:`.plans`)."""
    fast = jsontape.load(text)
    if fast is not None:
        try:
            return _decode(
                fast, text, NO_CUTS, binary, inputs, outputs, model, shm, exact=False, layout=layout
            )
        except Retry:  # the plain decoder's checks decide: decoded again below
            if layout is not None:
                layout.clear()  # and planned by none
    skeleton, cuts = cut_number_arrays(text, 0, end)
    try:
        doc = _load_json(skeleton, whole, exact=False)
        return _decode(doc, text, cuts, binary, inputs, outputs, model, shm, exact=False)
    except Retry:  # integers past 64 bits, which orjson reads as floats: read them exactly
        doc = _load_json(skeleton, whole, exact=True)
        return _decode(doc, text, cuts, binary, inputs, outputs, model, shm, exact=True)


def _decode(
    doc: dict[str, Any],
    body: bytes | bytearray,
    cuts: Cuts,
    binary: memoryview,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    model: str,
    shm: _Shm,
    *,
    exact: bool,
    layout: plans.Layout | None = None,
) -> InferRequest:
    regions, leases = shm
    extra = set(doc) - {"id", "inputs", "outputs", "parameters"}
    if extra:
        raise _fail(f"unknown request field(s) {sorted(extra)}")
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise _fail("'id' must be a string")
    raw_params = _parameters("request", doc.get("parameters"))
    params = request_parameters(raw_params, model)
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list):
        raise _fail("'inputs' must be a list")
    specs = {s.name: s for s in inputs}
    arrays: dict[str, np.ndarray] = {}
    offset = 0
    bools: bool | None = None
    for item in raw_inputs:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise _fail("each of 'inputs' must be an object with a string 'name'")
        name = item["name"]
        spec = specs.get(name)
        if spec is None:
            raise _fail(f"unknown input {name!r} (the model has {sorted(specs)})")
        if name in arrays:
            raise answers.duplicate_input(name, request_id)
        unknown = set(item) - {"name", "datatype", "shape", "data", "parameters"}
        if unknown:
            raise _fail(f"input {name!r}: unknown field(s) {sorted(unknown)}")
        datatype = check_datatype(name, item.get("datatype"), spec, model)
        try:
            shape = check_shape(name, item.get("shape"))
        except ProtocolError:
            raw = item.get("shape")
            if isinstance(raw, list) and any(type(d) is int and d < 0 for d in raw):
                raise answers.negative_json_dimension() from None
            raise
        count = element_count(name, shape, datatype)
        input_params = _parameters(f"input {name!r}", item.get("parameters"))
        size = check_input_parameters(name, input_params, model)
        ref = region_parameters(name, input_params)
        if ref is not None:
            given = [("'data'", "data" in item), ("'binary_data_size'", size is not None)]
            if any(there for _, there in given):
                raise data_beside_region(name, model, " ".join(w for w, there in given if there))
            flat = read_input(regions, leases, name, datatype, ref, count, model)
        elif size is not None:
            if "data" in item:
                raise _fail(f"input {name!r}: give either 'data' or binary_data_size, not both")
            expected = size if datatype == BYTES else count * DATATYPES[datatype].itemsize
            if size != expected:
                raise answers.byte_size_mismatch(name, model, expected, size, request_id)
            if offset + size > len(binary):
                raise _fail(
                    f"input {name!r}: binary data sizes add up to more than the "
                    f"{len(binary)} bytes after the JSON header"
                )
            chunk = binary[offset : offset + size]
            if datatype == BYTES:
                flat = bytes_from_binary(name, chunk, count, model, request_id)
            else:
                flat = from_binary(name, datatype, chunk)
                if layout is not None:
                    layout.append(("binary", name, datatype, shape, offset, offset + size))
            offset += size
        elif "data" not in item:
            raise _fail(f"input {name!r}: no 'data' and no binary_data_size")
        elif isinstance(item["data"], jsontape.Numbers):
            flat = item["data"].array(datatype, count)
            if layout is not None:
                layout.append(("numbers", name, datatype, shape, count))
        elif datatype == BYTES:
            values = flatten(name, item["data"], count)
            if len(values) != count:
                raise _fail(
                    f"input {name!r}: shape {list(shape)} needs {count} elements, "
                    f"'data' has {len(values)}"
                )
            flat = _strings(name, values)
        elif (cut := cuts.index(item["data"])) is not None:
            flat = parse_number_span(name, datatype, body, cuts.spans[cut], shape, count)
        else:
            values = flatten(name, item["data"], count)
            if len(values) != count:
                raise _fail(
                    f"input {name!r}: shape {list(shape)} needs {count} elements, "
                    f"'data' has {len(values)}"
                )
            # No true/false anywhere in the body: none in the data (numpy would take them as
            # 1 and 0), and no per-element look for them (a C scan of the body instead).
            if bools is None:
                bools = None if b"true" in body or b"false" in body else False
            flat = values_to_array(name, datatype, values, exact=exact, bools=bools)
        try:
            arrays[name] = flat.reshape(shape)
        except ValueError as exc:  # pragma: no cover - counts were checked above
            raise _fail(f"input {name!r}: {exc}") from None
    if offset != len(binary):
        raise _fail(
            f"binary data sizes add up to {offset} bytes, but {len(binary)} bytes follow "
            "the JSON header"
        )
    short = answers.input_count(model, inputs, list(arrays), request_id)
    if short is not None:
        raise short
    return InferRequest(
        id=request_id,
        inputs=arrays,
        outputs=_requested_outputs(
            doc.get("outputs"), outputs, params.binary_output, model, request_id, regions, leases
        ),
        parameters=model_parameters(raw_params),
        timeout=params.timeout,
        priority=params.priority,
        sequence=params.sequence,
        leases=leases,
    )

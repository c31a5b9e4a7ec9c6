"""Decode ``ModelInferRequest`` messages into arrays and encode ``ModelInferResponse`` messages.

The gRPC twin of :mod:`model_runtime.server.tensors.codec`, with the same contract: every declared
number is a claim to check, never a size to allocate. A shape's element count is computed with
Python integers and compared with the bytes (``raw_input_contents``) or values (typed
``contents``) actually present before any array exists; raw inputs become zero-copy, read-only
views of the message's bytes. Parameters go through the same checks as over HTTP
(:mod:`model_runtime.server.tensors.parameters`): honoured, or refused with a message that names
them. Everything wrong with a request raises :class:`~model_runtime.errors.ProtocolError`
(gRPC INVALID_ARGUMENT, HTTP 400).

Typed contents use the field of the input's datatype only (Triton's rule): ``bool_contents``
for BOOL, ``int_contents`` for INT8/16/32 (range-checked), ``int64_contents``,
``uint_contents`` for UINT8/16/32 (range-checked), ``uint64_contents``, ``fp32_contents``,
``fp64_contents``; FP16 travels as raw contents only. Responses carry every output in
``raw_output_contents`` (what ``tritonclient.grpc`` reads first): little-endian elements, or for
BYTES (a string output, or a classification) each element as a 4-byte little-endian length
and its bytes. BYTES inputs arrive in ``bytes_contents`` or raw in that same form.

An input or output may name a system shared memory region instead (:mod:`..shm_io`, as over
HTTP): such an input has no ``raw_input_contents`` entry (the entries belong, in order, to the
inputs not in shared memory), such an output an empty one.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from model_runtime.errors import ProtocolError
from model_runtime.server import answers
from model_runtime.server.grpc.request_plan import Plan, WireRequest, keep_plan
from model_runtime.server.tensors.binary import bytes_from_binary
from model_runtime.server.tensors.classification import bytes_to_binary, classify
from model_runtime.server.tensors.datatypes import BYTES, DATATYPES
from model_runtime.server.tensors.parameters import (
    RegionRef,
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
    write_output,
)
from model_runtime.server.triton import grpc_service_pb2 as pb

__all__ = [
    "encode_model_infer_response",
    "output_payload",
    "parameter_values",
    "parse_model_infer_request",
]

#: Datatype -> the typed contents field that carries it (FP16 and BYTES have none we take).
_FIELDS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
}
_ALL_FIELDS = (*dict.fromkeys(_FIELDS.values()), "bytes_contents")
#: The dtype a field's values arrive in (what protobuf's container holds).
_WIRE = {
    "bool_contents": np.dtype(np.bool_),
    "int_contents": np.dtype(np.int32),
    "int64_contents": np.dtype(np.int64),
    "uint_contents": np.dtype(np.uint32),
    "uint64_contents": np.dtype(np.uint64),
    "fp32_contents": np.dtype(np.float32),
    "fp64_contents": np.dtype(np.float64),
}


#: What a request without parameters has (the checks of none, made once).
_NO_PARAMETERS = request_parameters({}, grpc=True)


def _fail(message: str) -> ProtocolError:
    return ProtocolError(message)


def parameter_values(where: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """An ``InferParameter`` (or ``ModelRepositoryParameter``) map as plain Python values.

    Raises:
        ProtocolError: a parameter has no value set.
    """
    out: dict[str, Any] = {}
    for key, param in params.items():
        choice = param.WhichOneof("parameter_choice")
        if choice is None:
            raise _fail(f"{where}: parameter {key!r} has no value")
        out[key] = getattr(param, choice)
    return out


def _from_raw(
    name: str, datatype: str, raw: bytes | memoryview, count: int, model: str, request_id: str
) -> np.ndarray:
    if datatype == BYTES:
        return bytes_from_binary(name, raw, count, model, request_id or None)
    dtype = DATATYPES[datatype]
    expected = count * dtype.itemsize
    if len(raw) != expected:
        raise answers.byte_size_mismatch(name, model, expected, len(raw), request_id)
    arr = np.frombuffer(raw, dtype=dtype)
    if datatype == "BOOL" and arr.size and arr.view(np.uint8).max() > 1:
        raise _fail(f"input {name!r}: BOOL raw contents must be bytes 0 or 1")
    return arr


def _from_contents(name: str, datatype: str, contents: Any, count: int) -> np.ndarray:
    if datatype == BYTES:
        others = [f for f in _ALL_FIELDS if f != "bytes_contents" and len(getattr(contents, f))]
        if others:
            raise _fail(f"input {name!r}: BYTES data goes in bytes_contents, not in {others}")
        values = contents.bytes_contents
        if len(values) != count:
            raise _fail(
                f"input {name!r}: shape needs {count} elements, bytes_contents has {len(values)}"
            )
        out = np.empty(count, dtype=object)
        out[:] = list(values)
        return out
    field = _FIELDS.get(datatype)
    if field is None:
        raise _fail(f"input {name!r}: {datatype} has no typed contents field: send it raw")
    others = [f for f in _ALL_FIELDS if f != field and len(getattr(contents, f))]
    if others:
        raise _fail(f"input {name!r}: {datatype} data goes in {field}, not in {others}")
    values = getattr(contents, field)
    if len(values) != count:
        raise _fail(f"input {name!r}: shape needs {count} elements, {field} has {len(values)}")
    wire = np.array(values, dtype=_WIRE[field])
    dtype = DATATYPES[datatype]
    if dtype.kind in "iu" and dtype.itemsize < wire.dtype.itemsize and wire.size:
        info = np.iinfo(dtype)
        low, high = int(wire.min()), int(wire.max())
        if low < info.min or high > info.max:
            raise _fail(
                f"input {name!r}: {field} holds values in [{low}, {high}], outside "
                f"{datatype}'s [{info.min}, {info.max}]"
            )
    return wire.astype(dtype, copy=False)


#: Per tuple of specs (by identity, the tuple held so its id stays its own): their names ->
#: specs, and the outputs of a request that names none. A model's specs live as long as it.
_BY_NAME: dict[int, tuple[Sequence[TensorSpec], dict[str, TensorSpec]]] = {}
_ALL_OUTPUTS: dict[int, tuple[Sequence[TensorSpec], tuple[RequestedOutput, ...]]] = {}
_MEMO_MAX = 256


def _by_name(specs: Sequence[TensorSpec]) -> dict[str, TensorSpec]:
    held = _BY_NAME.get(id(specs))
    if held is not None and held[0] is specs:
        return held[1]
    if len(_BY_NAME) >= _MEMO_MAX:
        _BY_NAME.clear()
    names = {s.name: s for s in specs}
    _BY_NAME[id(specs)] = (specs, names)
    return names


@functools.lru_cache(maxsize=1024)
def _plain_output(name: str) -> RequestedOutput:
    """The output ``name`` as the tensor, raw (frozen: one object serves every request)."""
    return RequestedOutput(name, True)


def _all_outputs(outputs: Sequence[TensorSpec]) -> tuple[RequestedOutput, ...]:
    held = _ALL_OUTPUTS.get(id(outputs))
    if held is not None and held[0] is outputs:
        return held[1]
    if len(_ALL_OUTPUTS) >= _MEMO_MAX:
        _ALL_OUTPUTS.clear()
    every = tuple(_plain_output(s.name) for s in outputs)
    _ALL_OUTPUTS[id(outputs)] = (outputs, every)
    return every


def _requested_outputs(
    raw: Sequence[Any],
    outputs: Sequence[TensorSpec],
    model: str,
    request_id: str,
    regions: SharedMemoryRegistry | None,
    leases: list[Lease],
) -> tuple[RequestedOutput, ...]:
    if not raw:
        return _all_outputs(outputs)
    known = _by_name(outputs)
    chosen: list[RequestedOutput] = []
    seen: set[str] = set()
    for item in raw:
        name = item.name
        if name not in known:
            raise answers.unknown_output(name, model)
        if name in seen:
            raise answers.duplicate_output(name, request_id)
        seen.add(name)
        if not item.parameters:  # the common case: the tensor, raw (what the checks give)
            chosen.append(_plain_output(name))
            continue
        where = f"output {name!r}"
        params = output_parameters(name, parameter_values(where, item.parameters), True, model)
        if params.region is not None:
            lease = lease_output(regions, leases, name, params.region)
            chosen.append(RequestedOutput(name, False, region=lease))
        else:
            chosen.append(RequestedOutput(name, True, params.class_count))
    return tuple(chosen)


def parse_model_infer_request(
    request: Any,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    *,
    model: str = "",
    regions: SharedMemoryRegistry | None = None,
    raw: Sequence[Any] | None = None,
) -> InferRequest:
    """Decode and check a ``ModelInferRequest`` (protobuf's message, or a
    :class:`~.request_plan.WireRequest`: then from its key's plan for this model when there
    is one) for a model with ``inputs`` and ``outputs``; ``raw``: its raw input contents when
    they were taken out of it (bytes-like views, :mod:`.rawsplit`), else None
    (``request.raw_input_contents``).

    Shapes are checked only against the data given; whether they fit the model (batch axis,
    per-sample shape) is the runner's check. Raw inputs are read-only views of the message's
    bytes: keep the message alive while they are in use. Tensors that name a shared memory
    region are read from (or leased for) ``regions`` as over HTTP (:mod:`..shm_io`);
    :meth:`~model_runtime.server.tensors.codec.InferRequest.release` the request once answered.

    Raises:
        ProtocolError: unknown, missing or duplicate inputs; wrong or unknown datatypes; a
            shape out of range; raw contents and typed contents mixed, missing, or of a size
            that does not match the shape; typed values outside the datatype's range; unknown
            or twice-requested outputs; a parameter that is unknown or not supported.
        SharedMemoryError: a region that is not registered, offset and size outside it, or
            an object its client shrank (SharedMemoryShrunkError).
    """
    if type(request) is WireRequest:
        plan = request.plan(inputs, outputs)
        if plan is not None:
            return _planned(request, plan, model)
        parsed = parse_model_infer_request(
            request.message(), inputs, outputs, model=model, regions=regions, raw=request.raws
        )
        keep_plan(request, inputs, outputs, parsed)
        return parsed
    leases: list[Lease] = []
    try:
        return _parse(request, inputs, outputs, model, regions, leases, raw)
    except BaseException:
        release(leases)
        raise


def _planned(request: WireRequest, plan: Plan, model: str) -> InferRequest:
    """A request of a kept plan: only its raw contents are checked (as :func:`_parse`
    checks them, in the same order)."""
    request_id = request.id
    arrays: dict[str, np.ndarray] = {}
    for (name, datatype, shape, count), data in zip(plan.inputs, request.raws, strict=True):
        arrays[name] = _from_raw(name, datatype, data, count, model, request_id).reshape(shape)
    return InferRequest(
        request_id or None,
        arrays,
        plan.outputs,
        dict(plan.model_parameters) if plan.model_parameters else {},
        plan.timeout,
        plan.priority,
        plan.sequence,
        [],
    )


def _typed(item: Any) -> bool:
    """Whether input ``item`` holds values in any typed contents field."""
    if not item.HasField("contents"):
        return False
    contents = item.contents
    return any(len(getattr(contents, f)) for f in _ALL_FIELDS)


def _parse(
    request: Any,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    model: str,
    regions: SharedMemoryRegistry | None,
    leases: list[Lease],
    raw: Sequence[Any] | None = None,
) -> InferRequest:
    model_params: dict[str, Any] = {}
    given = request.parameters
    if given:
        raw_params = parameter_values("request", given)
        params = request_parameters(raw_params, model, grpc=True)
        model_params = model_parameters(raw_params)
    else:
        params = _NO_PARAMETERS
    items = list(request.inputs)  # (each element's wrapper made once)
    refs: list[RegionRef | None] = [None] * len(items)
    for i, item in enumerate(items):
        if item.parameters:  # no parameters: nothing to check, no region
            values = parameter_values(f"input {item.name!r}", item.parameters)
            check_input_parameters(item.name, values, model)
            refs[i] = region_parameters(item.name, values)
    raw_contents = request.raw_input_contents if raw is None else raw
    if raw_contents:  # Triton's first check of each input, before the count (even empty)
        for item, ref in zip(items, refs, strict=True):
            if ref is None and item.HasField("contents"):
                raise answers.raw_with_contents(item.name, model)
    # Raw contents are the data of the inputs that are not in shared memory, in their order.
    wanted = refs.count(None)
    if raw_contents and len(raw_contents) != wanted:
        which = "inputs" if wanted == len(refs) else "inputs not in shared memory"
        raise _fail(
            f"raw_input_contents has {len(raw_contents)} entries for {wanted} {which}: give one "
            "per input, in the order of the inputs"
        )
    specs = _by_name(inputs)
    request_id = request.id
    arrays: dict[str, np.ndarray] = {}
    index = 0
    for item, ref in zip(items, refs, strict=True):
        name = item.name
        spec = specs.get(name)
        if spec is None:
            raise _fail(f"unknown input {name!r} (the model has {sorted(specs)})")
        if name in arrays:
            raise answers.duplicate_input(name, request_id)
        datatype = check_datatype(name, item.datatype, spec, model)
        shape = check_shape(name, list(item.shape))
        count = element_count(name, shape, datatype)
        if ref is not None:
            if _typed(item):
                raise data_beside_region(name, model, "'content'")
            flat = read_input(regions, leases, name, datatype, ref, count, model)
        elif raw_contents:  # (typed contents beside them were refused above)
            flat = _from_raw(name, datatype, raw_contents[index], count, model, request_id)
            index += 1
        elif count == 0 or _typed(item):
            flat = _from_contents(name, datatype, item.contents, count)
        else:
            raise _fail(f"input {name!r}: no data (neither contents nor raw_input_contents)")
        arrays[name] = flat.reshape(shape)
    if len(arrays) != len(specs):  # (every key of arrays is one of specs)
        short = answers.input_count(model, inputs, list(arrays), request_id or None)
        if short is not None:
            raise short
    return InferRequest(
        request_id or None,
        arrays,
        _requested_outputs(request.outputs, outputs, model, request_id, regions, leases),
        model_params,
        params.timeout,
        params.priority,
        params.sequence,
        leases,
    )


def output_payload(
    out: RequestedOutput, arr: np.ndarray, datatype: str, specs: Sequence[TensorSpec] = ()
) -> tuple[str, tuple[int, ...], bytes]:
    """Requested output ``out`` of value ``arr`` as a response carries it: its datatype, its
    shape and its raw contents (empty when it went into its shared memory region).

    Raises:
        SharedMemoryOutputSizeError: an output is larger than its part of its region.
        SharedMemoryShrunkError: an output's region shrank (its client cut the object).
    """
    if out.region is not None:
        write_output(out.region, out.name, arr, datatype)
        return datatype, arr.shape, b""
    if out.class_count:
        spec = next((s for s in specs if s.name == out.name), None)
        batched = arr.ndim >= 2 if spec is None else spec.has_batch_axis
        names = None if spec is None else spec.labels
        arr = classify(arr, out.class_count, batched=batched, labels=names)
        return BYTES, arr.shape, bytes_to_binary(arr)
    if datatype == BYTES:
        return datatype, arr.shape, bytes_to_binary(arr)
    dtype = DATATYPES[datatype]
    return datatype, arr.shape, (arr if arr.dtype == dtype else arr.astype(dtype)).tobytes()


def encode_model_infer_response(
    model_name: str,
    model_version: str,
    request: InferRequest,
    results: Mapping[str, np.ndarray],
    datatypes: Mapping[str, str],
    *,
    specs: Sequence[TensorSpec] = (),
) -> Any:
    """The ``ModelInferResponse`` of the requested outputs, their data in
    ``raw_output_contents``; an output asked for in a shared memory region is written there
    instead, and its raw contents are empty (as Triton answers).

    Raises:
        KeyError: a requested output is missing from ``results``.
        SharedMemoryOutputSizeError: an output is larger than its part of its region.
        SharedMemoryShrunkError: an output's region shrank (its client cut the object).
    """
    response = pb.ModelInferResponse(model_name=model_name, model_version=model_version)
    if request.id is not None:
        response.id = request.id
    raw: list[bytes] = []
    outputs = response.outputs
    for out in request.outputs:
        name = out.name
        datatype, shape, data = output_payload(out, results[name], datatypes[name], specs)
        raw.append(data)
        outputs.add(name=name, datatype=datatype, shape=shape)
    response.raw_output_contents.extend(raw)
    return response

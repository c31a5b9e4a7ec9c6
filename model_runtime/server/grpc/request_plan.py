"""``ModelInferRequest`` messages that repeat but for their tensors' bytes, decoded once.

A client sends the same message again and again (perf_analyzer, a tritonclient loop): the same
model, parameters, inputs and outputs, only ``raw_input_contents`` (and perhaps ``id``) new.
:func:`read_model_infer_request` walks the message's top-level fields: when the raw contents
come last, the rest (less ``id``) is the message's *key*. The first message of a key is parsed
by protobuf and checked in full (:func:`.codec.parse_model_infer_request`); when it passed
every check, had raw contents for every input and named no shared memory, what the checks
gave is kept as the key's :class:`Plan` for that model's inputs and outputs. A later message
of that key and as many raw contents is protobuf's same message but for its id and its
tensors' bytes, so only those are checked (:func:`.codec.parse_model_infer_request`), with
the same errors.

Anything else (raw contents not last, several ids, another wire type, a key longer than
:data:`MAX_KEY` bytes) is parsed by protobuf as usual.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from model_runtime.server.tensors.request import InferRequest, RequestedOutput, TensorSpec
from model_runtime.server.triton import grpc_service_pb2 as pb

__all__ = ["MAX_KEY", "Plan", "WireRequest", "keep_plan", "read_model_infer_request"]

#: The longest key kept (a message's bytes but its id and raw contents).
MAX_KEY = 2048
#: Keys kept at most (all are dropped when a new one would pass it).
MAX_KEYS = 256
_PARSE = pb.ModelInferRequest.FromString
_ID, _RAW = 3 << 3 | 2, 7 << 3 | 2


class Plan:
    """What the checks of a key's message gave for one model: its inputs as ``(name,
    datatype, shape, element count)`` in the order of their raw contents, the requested
    outputs, and the request's checked parameters."""

    __slots__ = ("inputs", "model_parameters", "outputs", "priority", "sequence", "timeout")

    def __init__(self, message: Any, parsed: InferRequest) -> None:
        self.inputs = tuple(
            (item.name, item.datatype, parsed.inputs[item.name].shape,
             math.prod(parsed.inputs[item.name].shape))
            for item in message.inputs
        )  # fmt: skip
        self.outputs: tuple[RequestedOutput, ...] = parsed.outputs
        self.model_parameters = dict(parsed.parameters)  # (a model may change its own)
        self.timeout = parsed.timeout
        self.priority = parsed.priority
        self.sequence = parsed.sequence


class _Key:
    """A key's model name and version, and its plans (by the model's spec tuples)."""

    __slots__ = ("model_name", "model_version", "plans")

    def __init__(self, model_name: str, model_version: str) -> None:
        self.model_name = model_name
        self.model_version = model_version
        self.plans: dict[tuple[int, int], tuple[Sequence[TensorSpec], Sequence[TensorSpec], Plan]]
        self.plans = {}


_KEYS: dict[bytes, _Key] = {}


class WireRequest:
    """A ``ModelInferRequest`` as received, its raw contents views of the received bytes;
    ``message()`` is protobuf's parse of it (made when first asked for)."""

    __slots__ = ("_message", "data", "id", "key", "raws")

    def __init__(
        self, key: _Key, request_id: str, raws: list[memoryview], data: Any, message: Any
    ) -> None:
        self.key = key
        self.id = request_id
        self.raws = raws
        self.data = data
        self._message = message

    @property
    def model_name(self) -> str:
        return self.key.model_name

    @property
    def model_version(self) -> str:
        return self.key.model_version

    def message(self) -> Any:
        """The protobuf message."""
        if self._message is None:
            self._message = _PARSE(self.data)
        return self._message

    def plan(self, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> Plan | None:
        """Its key's plan for a model of ``inputs`` and ``outputs`` when it fits (as many raw
        contents as that plan's inputs), else None."""
        held = self.key.plans.get((id(inputs), id(outputs)))
        if held is None or held[0] is not inputs or held[1] is not outputs:
            return None
        plan = held[2]
        return plan if len(plan.inputs) == len(self.raws) else None


def keep_plan(
    request: WireRequest,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    parsed: InferRequest,
) -> None:
    """Keep what the checks of ``request`` gave (``parsed``) as its key's plan for the model
    of ``inputs`` and ``outputs``, when only its raw contents can make the next one differ:
    every input raw, no shared memory."""
    message = request.message()
    if parsed.leases or not request.raws or len(request.raws) != len(message.inputs):
        return
    plans = request.key.plans
    if len(plans) >= 8:
        plans.clear()
    plans[(id(inputs), id(outputs))] = (inputs, outputs, Plan(message, parsed))


def _length(view: memoryview, at: int) -> tuple[int, int]:
    """The varint at ``at`` and the offset after it (IndexError: cut off)."""
    value = view[at]
    at += 1
    if value < 0x80:
        return value, at
    value &= 0x7F
    shift = 7
    while True:
        byte = view[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
        if shift > 63:
            raise IndexError("varint too long")


def _split(view: memoryview) -> tuple[bytes, bytes, list[memoryview]] | None:
    """The key, the id's bytes and the raw contents of ``view``; None: not of that form."""
    end = len(view)
    at = 0
    first_raw = -1
    id_span: tuple[int, int, int] | None = None
    raws: list[memoryview] = []
    try:
        while at < end:
            start = at
            key = view[at]
            if key & 7 != 2 or key >= 0x80:  # every field a plan knows is length-delimited
                return None
            length = view[at + 1]
            if length < 0x80:  # (a one-byte length: _length's first step, inline)
                at += 2
            else:
                length, at = _length(view, at + 1)
            stop = at + length
            if stop > end:
                return None
            if key == _RAW:
                if first_raw < 0:
                    first_raw = start
                raws.append(view[at:stop])
            elif first_raw >= 0:
                return None
            elif key == _ID:
                if id_span is not None:
                    return None
                id_span = (start, at, stop)
            at = stop
    except IndexError:
        return None
    if first_raw < 0 or first_raw > MAX_KEY:
        return None
    if id_span is None:
        return bytes(view[:first_raw]), b"", raws
    start, at, stop = id_span
    return bytes(view[:start]) + bytes(view[stop:first_raw]), bytes(view[at:stop]), raws


def read_model_infer_request(data: Any) -> Any:
    """``data`` (a serialized ``ModelInferRequest``, bytes-like) as a :class:`WireRequest`
    when it is of the form plans are kept for, else protobuf's message.

    Raises:
        google.protobuf.message.DecodeError: ``data`` is no ``ModelInferRequest`` (as
            protobuf's parse raises).
    """
    view = memoryview(data)
    split = _split(view)
    if split is None:
        return _PARSE(view)
    key_bytes, id_bytes, raws = split
    key = _KEYS.get(key_bytes)
    if key is not None:
        try:
            request_id = id_bytes.decode()
        except UnicodeDecodeError:
            return _PARSE(view)  # (protobuf's error)
        return WireRequest(key, request_id, raws, view, None)
    message = _PARSE(view)
    if len(_KEYS) >= MAX_KEYS:
        _KEYS.clear()
    key = _KEYS[key_bytes] = _Key(message.model_name, message.model_version)
    return WireRequest(key, message.id, raws, view, message)

"""The ``parameters`` of an inference request, its inputs and its outputs: each one is honoured,
or the request is refused with a 400 that names it. Nothing is silently ignored.

Request parameters (Triton's reserved names, the KServe v2 binary data extension):

- ``binary_data_output`` (bool): every output as binary data unless the output says otherwise.
- ``timeout`` (integer, microseconds, as Triton and its clients send it; 0: none): the request's
  deadline, queue and compute; it can only shorten the server's own ``request_timeout``.
- ``priority`` (integer >= 0): Triton's priority level, 1 the highest, larger numbers lower, 0
  the model's default level; see :func:`execute_priority` for how it reaches the runner.
- ``sequence_id`` / ``sequence_start`` / ``sequence_end``: sequence batching, for stateful
  models (:mod:`model_runtime.sequences`): the request's :class:`SequenceStep` (None when the
  values say "no sequence": an id of 0 or "" and both flags false). The server refuses a
  sequence sent to a stateless model (:func:`not_a_sequence_model`).

Any other request parameter is the model's (Triton's ``parameters`` extension): a python
model reads it in ``request.parameters()``, an ONNX model ignores it (:func:`model_parameters`).

Input parameters: ``binary_data_size``. Output parameters: ``binary_data`` and
``classification`` (Triton's HTTP name; ``class_count``, its gRPC name, is accepted too).
Both: the system shared memory extension's ``shared_memory_region``, ``shared_memory_byte_size``
and ``shared_memory_offset`` (:func:`region_parameters`, checked as Triton checks them; the
region itself is the registry's, :mod:`model_runtime.server.tensors.shm`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from model_runtime.errors import ProtocolError
from model_runtime.sequences import SequenceStep
from model_runtime.server import answers

__all__ = [
    "MAX_PRIORITY_LEVEL",
    "OutputParameters",
    "RegionRef",
    "RequestParameters",
    "check_input_parameters",
    "execute_priority",
    "load_request_parameters",
    "model_parameters",
    "not_a_sequence_model",
    "output_parameters",
    "region_parameters",
    "request_parameters",
]

#: The largest priority level a request may name (Triton reads a uint64).
MAX_PRIORITY_LEVEL = 2**64 - 1
_SEQUENCE = ("sequence_id", "sequence_start", "sequence_end")
_REQUEST = {"binary_data_output", "timeout", "priority", *_SEQUENCE}
_REGION, _BYTE_SIZE, _OFFSET = (
    "shared_memory_region",
    "shared_memory_byte_size",
    "shared_memory_offset",
)
_SHARED_MEMORY = (_REGION, _BYTE_SIZE, _OFFSET)
#: The largest shared memory offset or byte size (Triton's are uint64 over HTTP, int64 over gRPC).
_MAX_U64 = 2**64 - 1


@dataclass(frozen=True, slots=True)
class RequestParameters:
    """A request's parameters, checked. ``timeout`` in seconds (None: none given)."""

    binary_output: bool = False
    timeout: float | None = None
    priority: int = 0
    sequence: SequenceStep | None = None


#: What a request without parameters asks (the defaults).
_NO_PARAMETERS = RequestParameters()


@dataclass(frozen=True, slots=True)
class RegionRef:
    """Where a tensor lies in a registered system shared memory region: ``byte_size`` bytes at
    ``offset`` of region ``region``."""

    region: str
    byte_size: int
    offset: int = 0


@dataclass(frozen=True, slots=True)
class OutputParameters:
    """An output's parameters, checked. ``class_count`` 0: the tensor, not classes; ``region``:
    the output goes into that part of a shared memory region, not into the response."""

    binary: bool
    class_count: int = 0
    region: RegionRef | None = None


def _fail(message: str) -> ProtocolError:
    return ProtocolError(message)


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _unsupported(where: str, names: set[str], model: str) -> ProtocolError:
    of = f" by model {model!r}" if model else ""
    return _fail(f"{where}: parameter(s) {sorted(names)} are not supported{of}")


def request_parameters(
    raw: Mapping[str, Any], model: str = "", *, grpc: bool = False
) -> RequestParameters:
    """Check the request's ``parameters`` (``grpc``: of a ``ModelInferRequest``).

    Names starting with ``triton_`` are Triton's: over gRPC the ones Triton takes itself are
    taken (``triton_enable_empty_final_response``: every model here answers once, so there
    is never an empty final response to send), any other is refused in Triton's words; over
    HTTP, as in Triton, every one is.

    Other names are the model's (:func:`model_parameters`), not checked here.

    Raises:
        ProtocolError: a ``triton_`` name Triton refuses, or a value of the wrong type or
            range.
    """
    if not raw:
        return _NO_PARAMETERS
    others = False
    for key, value in raw.items():
        if not key.startswith("triton_"):
            others = True
            continue
        if not grpc:
            raise answers.reserved_parameter_http()
        if key not in answers.TRITON_REQUEST_PARAMETERS:
            raise answers.reserved_parameter_grpc()
        if not isinstance(value, bool):
            raise _fail(f"invalid value type for '{key}' parameter, expected bool_param.")
    if not others:  # only Triton's own (as perf_analyzer sends): they ask nothing of these
        return _NO_PARAMETERS
    binary = raw.get("binary_data_output", False)
    if not isinstance(binary, bool):
        raise _fail("binary_data_output must be true or false")
    seq_id = raw.get("sequence_id", 0)
    if not (_int(seq_id) or isinstance(seq_id, str)):
        raise _fail("sequence_id must be an integer or a string")
    flags = [raw.get(k, False) for k in _SEQUENCE[1:]]
    if not all(isinstance(f, bool) for f in flags):
        raise _fail("sequence_start and sequence_end must be true or false")
    sequence = None
    if seq_id not in (0, "") or any(flags):
        sequence = SequenceStep(seq_id, start=flags[0], end=flags[1])
    timeout_us = raw.get("timeout", 0)
    if not _int(timeout_us) or timeout_us < 0:
        raise _fail(f"timeout must be a non-negative integer of microseconds, got {timeout_us!r}")
    priority = raw.get("priority", 0)
    if not _int(priority) or not 0 <= priority <= MAX_PRIORITY_LEVEL:
        raise _fail(
            f"priority must be an integer level in [0, {MAX_PRIORITY_LEVEL}] (1 is the highest, "
            f"0 the default), got {priority!r}"
        )
    return RequestParameters(
        binary_output=binary,
        timeout=timeout_us / 1e6 if timeout_us else None,
        priority=priority,
        sequence=sequence,
    )


def model_parameters(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The request parameters that are the model's: all but the ones the server takes itself
    (``timeout``, ``priority``, the sequence's, ``binary_data_output``, ``triton_*``), as
    Triton hands them to a model."""
    if not raw:
        return {}
    return {k: v for k, v in raw.items() if k not in _REQUEST and not k.startswith("triton_")}


def not_a_sequence_model(step: SequenceStep, model: str) -> ProtocolError:
    """The refusal of a sequence sent to ``model``, which has no sequence batching."""
    given = {"sequence_id": step.id, "sequence_start": step.start, "sequence_end": step.end}
    return _fail(
        f"sequence parameters {given} are not supported: model {model!r} is stateless "
        "(no sequence batching); send each request on its own"
    )


def region_parameters(tensor: str, raw: Mapping[str, Any]) -> RegionRef | None:
    """The shared memory parameters of input or output ``tensor``, checked (Triton's texts);
    None when it names no region.

    Raises:
        ProtocolError: an offset or byte size without a region, a region without a byte size,
            or a value of the wrong type or range.
    """
    if not raw:
        return None
    region = raw.get(_REGION)
    if region is None:
        for key in (_OFFSET, _BYTE_SIZE):
            if key in raw:
                raise _fail(
                    f"'{key}' can not be specified without '{_REGION}' parameter for tensor "
                    f"'{tensor}'"
                )
        return None
    if not isinstance(region, str):
        raise _fail(
            f"invalid value type for '{_REGION}' parameter for tensor '{tensor}', expected a string"
        )
    if _BYTE_SIZE not in raw:
        raise _fail(
            f"'{_BYTE_SIZE}' must be specified along with '{_REGION}' parameter for tensor "
            f"'{tensor}'"
        )
    byte_size, offset = raw[_BYTE_SIZE], raw.get(_OFFSET, 0)
    for key, value in ((_BYTE_SIZE, byte_size), (_OFFSET, offset)):
        if not _int(value) or not 0 <= value <= _MAX_U64:
            raise _fail(
                f"invalid value for '{key}' parameter for tensor '{tensor}', expected an "
                f"integer in [0, {_MAX_U64}], got {value!r}"
            )
    return RegionRef(region, byte_size, offset)


def check_input_parameters(name: str, raw: Mapping[str, Any], model: str = "") -> int | None:
    """Check an input's ``parameters``; return its ``binary_data_size`` (None: JSON data, or
    a shared memory region: :func:`region_parameters`).

    Raises:
        ProtocolError: an unknown parameter, or a size that is not a non-negative integer.
    """
    if not raw:
        return None
    unknown = set(raw) - {"binary_data_size", *_SHARED_MEMORY}
    if unknown:
        raise _unsupported(f"input {name!r}", unknown, model)
    size = raw.get("binary_data_size")
    if size is None:
        return None
    if not _int(size) or size < 0:
        raise _fail(f"input {name!r}: binary_data_size must be a non-negative integer")
    return int(size)


def output_parameters(
    name: str, raw: Mapping[str, Any], binary_default: bool, model: str = ""
) -> OutputParameters:
    """Check an output's ``parameters``.

    Raises:
        ProtocolError: an unknown parameter, a value of the wrong type or range, or a shared
            memory region with classification or binary data (Triton's texts).
    """
    unknown = set(raw) - {"binary_data", "classification", "class_count", *_SHARED_MEMORY}
    if unknown:
        raise _unsupported(f"output {name!r}", unknown, model)
    binary = raw.get("binary_data", binary_default)
    if not isinstance(binary, bool):
        raise _fail(f"output {name!r}: binary_data must be true or false")
    counts = {raw[k] for k in ("classification", "class_count") if k in raw}
    if len(counts) > 1:
        raise _fail(f"output {name!r}: classification and class_count disagree")
    count = counts.pop() if counts else 0
    if not _int(count) or count < 0:
        raise _fail(f"output {name!r}: classification must be a non-negative integer")
    region = region_parameters(name, raw)
    if region is None:
        return OutputParameters(binary=binary, class_count=count)
    # Classes are made from the output after the run: they have no place in a region.
    for key in ("classification", "class_count"):
        if key in raw:
            raise _fail(f"Output can't set both '{_REGION}' and 'classification'")
    if raw.get("binary_data") is True:
        raise _fail(f"Output can't set both '{_REGION}' and 'binary_data'")
    return OutputParameters(binary=False, region=region)


def execute_priority(
    level: int, *, levels: int | None = None, default_level: int | None = None
) -> int:
    """Map a protocol priority level onto ``ModelRunner.execute(priority=...)``.

    The protocol counts down: level 1 is the highest, larger numbers are lower, and 0 means
    the model's default level. ``execute`` counts up: higher is packed first, 0 is the default.
    Level ``p`` becomes ``default_level - p``: the default level itself becomes 0, the levels
    above it positive, those below it negative, so the order of the levels is kept and a
    request at the default level waits exactly like one that named no level.

    A level past the configured ``levels`` is the default level, as Triton reads it
    (``InferenceRequest::SetPriority``). With ``levels`` and ``default_level`` unset (no
    priority levels configured for the model) the default level sits below every named level:
    a request that names any level is packed before those that do not, and level 1 before
    level 2.

    Raises:
        nothing.
    """
    if level == 0 or (levels is not None and level > levels):
        return 0
    base = MAX_PRIORITY_LEVEL + 1 if default_level is None else default_level
    return base - level


def load_request_parameters(body: bytes, model: str) -> str | None:
    """Check the body of ``POST /v2/repository/models/{name}/load``; return its ``config``
    parameter (Triton's configuration override, a ``ModelConfig`` in JSON; None: none).
    Model files sent with the request (``file:<path>``) are not supported.

    Raises:
        ProtocolError: the body is not a JSON object, has fields other than ``parameters``,
            a ``config`` that is not a string, or any other parameter.
    """
    if not body.strip():
        return None
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise _fail(f"the load request is not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or set(doc) - {"parameters"}:
        raise _fail("a load request is a JSON object with 'parameters' at most")
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise _fail("'parameters' must be a JSON object")
    other = set(params) - {"config"}
    if other:
        raise _fail(
            f"load of model {model!r}: parameter(s) {sorted(other)} are not supported (no "
            "file overrides); the model loads from the repository's files"
        )
    config = params.get("config")
    if config is not None and not isinstance(config, str):
        raise _fail(f"load of model {model!r}: 'config' must be a ModelConfig as a JSON string")
    return config

"""What a failed request is answered: one table of statuses and texts for HTTP and gRPC.

Clients of a Triton server match on its status codes and on its words, so the cases Triton
names are answered in Triton's: its error code decides both the HTTP status and the gRPC code
(:class:`Code`, as Triton's ``HttpCodeFromError`` and its gRPC status mapping give them), and
its message is written once, here, for both front ends. Shared memory errors carry Triton's
texts themselves (:mod:`model_runtime.server.tensors.shm`); :data:`SHARED_MEMORY_ANSWERS` gives
their codes (ALREADY_EXISTS, say, which is HTTP 400 but not gRPC INVALID_ARGUMENT). Our own
refusals (overload, draining, deadlines) keep their statuses; :func:`status_of` maps any
exception onto its HTTP status and :data:`GRPC_CODES` that status onto a gRPC code, unless the
answer names its gRPC code itself.

Triton's texts are quoted from its sources (``triton-inference-server/server``
``src/http_server.cc``, ``src/grpc/infer_handler.cc``, ``core`` ``src/infer_request.cc``,
``src/model_repository_manager/model_repository_manager.cc``); where a text is Triton's, the
function that makes it says so, and tests compare the whole text.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from typing import Protocol

from model_runtime.errors import (
    CudaSharedMemoryError,
    ExecutionTimeoutError,
    InputValidationError,
    LevelQueueFullError,
    ModelNotFoundError,
    ModelRuntimeError,
    ProtocolError,
    QueueFullError,
    RequestTimeoutError,
    RunnerStoppedError,
    SharedMemoryArgumentError,
    SharedMemoryDisabledError,
    SharedMemoryError,
    SharedMemoryExistsError,
    SharedMemoryNotFoundError,
    SharedMemoryOpenError,
    SharedMemoryOutputSizeError,
    SharedMemoryShrunkError,
    UnknownModelError,
    UnreadableFieldError,
)

__all__ = [
    "GRPC_CODES",
    "INT64_MAX",
    "MAX_JSON_DEPTH",
    "SHARED_MEMORY_ANSWERS",
    "TRITON_REQUEST_PARAMETERS",
    "Code",
    "HTTPError",
    "grpc_code_of",
    "status_of",
]

#: Triton's ``HTTP_MAX_JSON_NESTING_DEPTH``: a request's JSON may nest this deep, no deeper.
MAX_JSON_DEPTH = 100
INT64_MAX = 2**63 - 1
#: Request parameters with the ``triton_`` prefix that Triton itself takes (over gRPC).
TRITON_REQUEST_PARAMETERS = ("triton_enable_empty_final_response",)


class Code(enum.Enum):
    """Triton's error codes, each with the HTTP status and the gRPC code Triton answers."""

    INVALID_ARG = (400, "INVALID_ARGUMENT")
    ALREADY_EXISTS = (400, "ALREADY_EXISTS")
    NOT_FOUND = (404, "NOT_FOUND")
    UNAVAILABLE = (503, "UNAVAILABLE")
    UNSUPPORTED = (501, "UNIMPLEMENTED")
    INTERNAL = (500, "INTERNAL")

    @property
    def status(self) -> int:
        """The HTTP status."""
        return self.value[0]

    @property
    def grpc(self) -> str:
        """The name of the ``grpc.StatusCode``."""
        return self.value[1]


#: Each shared memory error -> its Triton code and the reason (for logs and metrics) (Triton's
#: code in the comments: src/shared_memory_manager.cc).
SHARED_MEMORY_ANSWERS: dict[type[SharedMemoryError], tuple[Code, str]] = {
    SharedMemoryNotFoundError: (Code.NOT_FOUND, "unknown_region"),
    SharedMemoryExistsError: (Code.ALREADY_EXISTS, "region_exists"),
    SharedMemoryArgumentError: (Code.INVALID_ARG, "bad_request"),
    SharedMemoryShrunkError: (Code.INVALID_ARG, "region_shrunk"),
    SharedMemoryOpenError: (Code.INTERNAL, "region_unavailable"),  # Triton's, though the key
    SharedMemoryOutputSizeError: (Code.INTERNAL, "output_too_large"),  # is the client's fault
    SharedMemoryDisabledError: (Code.UNSUPPORTED, "unsupported"),
    CudaSharedMemoryError: (Code.INVALID_ARG, "unsupported"),
}

#: The HTTP status an error is answered with -> the name of the gRPC code that says the same.
GRPC_CODES: dict[int, str] = {
    400: "INVALID_ARGUMENT",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED",
    413: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


class HTTPError(Exception):
    """An answer other than 200: its HTTP status, message, reason (for logs and metrics) and
    extra headers; ``grpc`` names the gRPC code where the status alone does not say it."""

    def __init__(
        self,
        status: int,
        message: str,
        reason: str,
        headers: dict[str, str] | None = None,
        *,
        grpc: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.headers = headers or {}
        self.grpc = grpc

    @classmethod
    def triton(cls, code: Code, message: str, reason: str) -> HTTPError:
        """The answer Triton gives with ``code``."""
        return cls(code.status, message, reason, grpc=code.grpc)


def status_of(exc: BaseException) -> tuple[int, str]:
    """The HTTP status and the reason (for logs and metrics) that answer ``exc``; the gRPC
    front end maps the status onto its codes (:func:`grpc_code_of`), so both answer alike."""
    match exc:
        case HTTPError():
            return exc.status, exc.reason
        case SharedMemoryError():
            code, reason = _shared_memory_answer(exc)
            return code.status, reason
        case UnknownModelError(version=None):
            return 400, "unknown_model"  # Triton's code for a name it does not know
        case ModelNotFoundError():
            return 404, "unknown_model"
        case UnreadableFieldError():
            return 500, "bad_request"  # Triton's INTERNAL, for a field it cannot read
        case InputValidationError():
            return 400, "bad_request"
        case LevelQueueFullError():
            return 503, "level_queue_full"  # the model's other levels may have room
        case QueueFullError():
            return 503, "queue_full"
        case RunnerStoppedError():
            return 503, "not_ready"
        case RequestTimeoutError():
            return 503, "request_timeout"  # Triton's UNAVAILABLE: "Request timeout expired"
        case ExecutionTimeoutError() | TimeoutError():
            return 504, "deadline_exceeded"
        case ModelRuntimeError():
            return 500, "runtime_error"
    return 500, "internal"


def grpc_code_of(exc: BaseException, status: int) -> str:
    """The name of the gRPC code that answers ``exc`` (answered ``status`` over HTTP)."""
    if isinstance(exc, HTTPError) and exc.grpc is not None:
        return exc.grpc
    if isinstance(exc, SharedMemoryError):
        return _shared_memory_answer(exc)[0].grpc
    return GRPC_CODES.get(status, "INTERNAL")


def _shared_memory_answer(exc: SharedMemoryError) -> tuple[Code, str]:
    for cls in type(exc).__mro__:
        answer = SHARED_MEMORY_ANSWERS.get(cls)  # type: ignore[call-overload]
        if answer is not None:
            return answer
    return Code.INTERNAL, "internal"


# -- Triton's texts ------------------------------------------------------------------------------


def _request(request_id: str | None) -> str:
    """The prefix of Triton's core on its texts about a request (``LogRequest()``)."""
    return f"[request id: {request_id or '<id_unknown>'}] "


def _shape(shape: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"  # Triton's DimsListToString


_VERSION = re.compile(r"\s*([+-]?\d+)")


def model_version(text: str) -> str:
    """A requested model version as Triton reads it (``std::stol``: leading blanks, a sign,
    digits, anything after ignored), as the repository names versions.

    Raises:
        ProtocolError: no number (``failed to get model version from specified version string
            'X' ...``) or a negative one, in Triton's words.
    """
    found = _VERSION.match(text)
    if found is None:
        raise ProtocolError(
            f"failed to get model version from specified version string '{text}' (details: "
            "stol), version should be an integral value > 0"
        )
    version = int(found.group(1))
    if version < 0:
        raise ProtocolError(
            f"invalid model version specified '{text}' , version should be an integral value > 0"
        )
    return str(version)


def polling_enabled() -> HTTPError:
    """A load or unload while the model control mode is ``none`` (Triton: UNAVAILABLE)."""
    return HTTPError.triton(
        Code.UNAVAILABLE,
        "explicit model load / unload is not allowed if polling is enabled",
        "forbidden",
    )


def model_name_empty() -> ProtocolError:
    """A load of a model whose name is empty or blank (Triton's ``ValidateModelName``)."""
    return ProtocolError("Model name cannot be empty. Please enter a valid name to deploy.")


def model_name_traversal(name: str) -> ProtocolError:
    """A load of ``..`` or of a name with a ``/`` (Triton's ``ValidateModelName``)."""
    return ProtocolError(
        f"invalid model name '{name}', model name must not contain path traversal characters"
    )


def byte_size_mismatch(
    name: str, model: str, expected: int, got: int, request_id: str | None = None
) -> ProtocolError:
    """An input whose bytes do not match its shape and datatype (Triton's core)."""
    return ProtocolError(
        f"{_request(request_id)}input byte size mismatch for input '{name}' for model "
        f"'{model}'. Expected {expected}, got {got}"
    )


def raw_with_contents(name: str, model: str) -> ProtocolError:
    """A gRPC input with typed ``contents`` in a request that has ``raw_input_contents``."""
    return ProtocolError(
        f"contents field must not be specified when using raw_input_contents for '{name}' "
        f"for model '{model}'"
    )


def duplicate_output(name: str, request_id: str | None = None) -> ProtocolError:
    """An output requested twice (Triton's core)."""
    return ProtocolError(f"{_request(request_id)}output '{name}' already exists in request")


def negative_json_dimension() -> UnreadableFieldError:
    """A JSON input shape with a negative dimension: Triton's HTTP front end fails to read it as
    an unsigned integer and answers INTERNAL (500), in TritonJson's words."""
    return UnreadableFieldError(
        "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer"
    )


def duplicate_input(name: str, request_id: str | None = None) -> ProtocolError:
    """An input given twice (Triton's core)."""
    return ProtocolError(f"{_request(request_id)}input '{name}' already exists in request")


def reserved_parameter_http() -> ProtocolError:
    """A ``triton_`` request parameter over HTTP (Triton's HTTP front end takes none)."""
    return ProtocolError(
        "parameter keys starting with 'triton_' are reserved for Triton usage and should not "
        "be specified."
    )


def reserved_parameter_grpc() -> ProtocolError:
    """A ``triton_`` request parameter over gRPC that Triton does not take itself."""
    return ProtocolError(
        "parameter keys starting with 'triton_' are reserved for Triton usage. Only the "
        "following keys starting with 'triton_' are allowed: " + " ".join(TRITON_REQUEST_PARAMETERS)
    )


def json_too_deep() -> ProtocolError:
    """Request JSON nested past :data:`MAX_JSON_DEPTH`."""
    return ProtocolError(f"JSON nesting depth exceeds maximum allowed limit ({MAX_JSON_DEPTH})")


def json_too_large(length: int, limit: int) -> ProtocolError:
    """A request's JSON of ``length`` bytes past the body limit."""
    return ProtocolError(
        f"request JSON size of {length} bytes exceeds the maximum allowed input size of "
        f"{limit} bytes. Use --http-max-input-size to increase the limit."
    )


def request_too_large(length: int, limit: int) -> ProtocolError:
    """A body (JSON and binary tensors) of ``length`` bytes past the body limit."""
    return ProtocolError(
        f"request size of {length} bytes exceeds the maximum allowed input size of {limit}. "
        "Use --http-max-input-size to increase the limit."
    )


def raw_input_too_large(size: int, limit: int) -> ProtocolError:
    """A raw binary request's body past the body limit."""
    return ProtocolError(
        f"Raw input has a byte_size ({size} bytes) that exceeds the maximum allowed value of "
        f"{limit} bytes. Use --http-max-input-size to increase the limit."
    )


def decompressed_too_large(limit: int) -> ProtocolError:
    """A compressed body that expands past the body limit."""
    return ProtocolError(
        f"Decompressed data size exceeds the maximum allowed value of {limit} bytes. Use "
        "--http-max-input-size to increase the limit."
    )


def unsupported_encoding() -> HTTPError:
    """A ``Content-Encoding`` other than gzip, deflate or identity (Triton: UNSUPPORTED)."""
    error = HTTPError.triton(Code.UNSUPPORTED, "Unsupported compression type", "bad_encoding")
    error.headers["Accept-Encoding"] = "gzip, deflate"
    return error


def element_count_overflow(name: str, shape: Sequence[int]) -> ProtocolError:
    """A shape whose element count passes int64."""
    return ProtocolError(
        f"invalid shape for input '{name}': shape {_shape(shape)} causes total element count "
        f"to exceed maximum size of {INT64_MAX}"
    )


def empty_shape_overflow(name: str, shape: Sequence[int], itemsize: int) -> ProtocolError:
    """A shape with a zero dimension whose other dimensions' bytes pass int64 (no array of
    that shape can be made, empty or not)."""
    return ProtocolError(
        f"invalid shape for input '{name}': shape {_shape(shape)} holds no elements, but its "
        f"non-zero dimensions times the data type size ({itemsize}) exceed the maximum allowed "
        f"size ({INT64_MAX})"
    )


def byte_size_overflow(name: str, count: int, itemsize: int) -> ProtocolError:
    """A shape whose bytes (elements x datatype size) pass int64."""
    return ProtocolError(
        f"byte size overflow for input '{name}': element count ({count}) * data type size "
        f"({itemsize}) exceeds maximum allowed size ({INT64_MAX})"
    )


class _Input(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def optional(self) -> bool: ...


def input_count(
    model: str, specs: Sequence[_Input], given: Sequence[str], request_id: str | None = None
) -> ProtocolError | None:
    """A request without every required input (Triton's core); None when it has them all.
    ``specs`` are the model's inputs, ``given`` the names the request sent."""
    required = [s.name for s in specs if not s.optional]  # in the config's order
    sent = set(given)
    missing = [n for n in required if n not in sent]
    if not missing:
        return None
    low, high = len(required), len(specs)
    expected = f"{low} inputs" if low == high else f"number of inputs between {low} and {high}"

    def names(items: Sequence[str]) -> str:
        return "[" + ",".join(f"'{n}'" for n in items) + "]"

    return ProtocolError(
        f"{_request(request_id)}expected {expected} but got {len(given)} inputs for model "
        f"'{model}'. Got input(s) {names(sorted(given))}, but missing required "
        f"input(s) {names(missing)}. Please provide all required input(s)."
    )


def unknown_output(name: str, model: str) -> ProtocolError:
    """A requested output the model does not have (Triton's core, without a request id)."""
    return ProtocolError(f"unexpected inference output '{name}' for model '{model}'")


def string_elements_short(
    name: str, model: str, expected: int, got: int, request_id: str | None = None
) -> ProtocolError:
    """BYTES data that holds fewer elements than the input's shape (Triton's core)."""
    return ProtocolError(
        f"{_request(request_id)}expected {expected} string elements for inference input "
        f"'{name}' for model '{model}', got {got}"
    )


def string_elements_over(
    name: str, model: str, expected: int, reached: int, request_id: str | None = None
) -> ProtocolError:
    """BYTES data that holds more elements than the input's shape: ``reached`` is the count
    where Triton's core stops reading (``expected + 1``)."""
    return ProtocolError(
        f"{_request(request_id)}unexpected number of string elements {reached} for inference "
        f"input '{name}' for model '{model}', expecting {expected}"
    )


def string_length_cut(
    name: str, model: str, available: int, request_id: str | None = None
) -> ProtocolError:
    """BYTES data that ends inside an element's 4-byte length (Triton's core)."""
    return ProtocolError(
        f"{_request(request_id)}incomplete string length indicator for inference input "
        f"'{name}' for model '{model}', expecting 4 bytes but only {available} bytes "
        "available. Please make sure the string length indicator is in one buffer."
    )


def raw_input_count(
    given: int, model_inputs: int, model: str, request_id: str | None = None
) -> ProtocolError:
    """A raw binary request to a model that has more than one input."""
    return ProtocolError(
        f"{_request(request_id)}Raw request must only have 1 input (found {given}) to be "
        f"deduced but got {model_inputs} inputs in '{model}' model configuration"
    )


def raw_input_two_dynamic(name: str, request_id: str | None = None) -> ProtocolError:
    """A raw binary request to an input whose shape has more than one variable dimension."""
    return ProtocolError(
        f"{_request(request_id)}The shape of the raw input '{name}' can not be deduced "
        "because there are more than one variable-sized dimension"
    )


def raw_input_bytes_shape(name: str, request_id: str | None = None) -> ProtocolError:
    """A raw binary request to a BYTES input that does not have shape [1]."""
    return ProtocolError(
        f"{_request(request_id)}For BYTE datatype raw input '{name}', the model must have "
        "input shape [1]"
    )

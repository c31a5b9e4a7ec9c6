"""How an error is answered: the HTTP status and the reason (for logs and metrics) of each
error the front ends meet, read by HTTP (:mod:`model_runtime.server.app`), gRPC (which maps
the status onto its codes, :mod:`model_runtime.server.grpc.service`) and the Ray front end
alike, so every protocol answers the same error the same way.

Shared memory errors are answered as Triton answers them, which a status alone cannot say
(ALREADY_EXISTS is HTTP 400 but not gRPC INVALID_ARGUMENT): :data:`SHARED_MEMORY_ANSWERS`
gives both codes, and :func:`grpc_code_name` the gRPC one.
"""

from __future__ import annotations

from model_runtime.errors import (
    CudaSharedMemoryError,
    ExecutionTimeoutError,
    InputValidationError,
    ModelNotFoundError,
    ModelRuntimeError,
    QueueFullError,
    RunnerStoppedError,
    SharedMemoryArgumentError,
    SharedMemoryDisabledError,
    SharedMemoryError,
    SharedMemoryExistsError,
    SharedMemoryNotFoundError,
    SharedMemoryOpenError,
    SharedMemoryOutputSizeError,
    UnknownModelError,
)

__all__ = ["SHARED_MEMORY_ANSWERS", "HTTPError", "grpc_code_name", "status_of"]

#: Each shared memory error -> (HTTP status, gRPC code, reason), from Triton's error code (in
#: the comments; src/http_server.cc HttpCodeFromError and src/grpc/grpc_utils.cc map it).
SHARED_MEMORY_ANSWERS: dict[type[SharedMemoryError], tuple[int, str, str]] = {
    SharedMemoryNotFoundError: (404, "NOT_FOUND", "unknown_region"),  # NOT_FOUND
    SharedMemoryExistsError: (400, "ALREADY_EXISTS", "region_exists"),  # ALREADY_EXISTS
    SharedMemoryArgumentError: (400, "INVALID_ARGUMENT", "bad_request"),  # INVALID_ARG
    SharedMemoryOpenError: (500, "INTERNAL", "region_unavailable"),  # INTERNAL
    SharedMemoryOutputSizeError: (500, "INTERNAL", "output_too_large"),  # INTERNAL
    SharedMemoryDisabledError: (501, "UNIMPLEMENTED", "unsupported"),  # UNSUPPORTED
    CudaSharedMemoryError: (400, "INVALID_ARGUMENT", "unsupported"),  # INVALID_ARG
}


class HTTPError(Exception):
    """An answer other than 200, with its status, message and extra headers."""

    def __init__(
        self, status: int, message: str, reason: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.headers = headers or {}


def status_of(exc: BaseException) -> tuple[int, str]:
    """The HTTP status and the reason (for logs and metrics) that answer ``exc``; the gRPC
    front end maps the status onto its codes, so both answer alike."""
    match exc:
        case HTTPError():
            return exc.status, exc.reason
        case SharedMemoryError():
            status, _, reason = _shared_memory_answer(exc)
            return status, reason
        case UnknownModelError(version=None):
            return 400, "unknown_model"  # Triton's code for a name it does not know
        case ModelNotFoundError():
            return 404, "unknown_model"
        case InputValidationError():
            return 400, "bad_request"
        case QueueFullError():
            return 503, "queue_full"
        case RunnerStoppedError():
            return 503, "not_ready"
        case ExecutionTimeoutError() | TimeoutError():
            return 504, "deadline_exceeded"
        case ModelRuntimeError():
            return 500, "runtime_error"
    return 500, "internal"


def grpc_code_name(exc: BaseException) -> str | None:
    """The name of the gRPC code that answers ``exc`` where its HTTP status does not say it
    (a shared memory error, Triton's code); None: the status's."""
    if isinstance(exc, SharedMemoryError):
        return _shared_memory_answer(exc)[1]
    return None


def _shared_memory_answer(exc: SharedMemoryError) -> tuple[int, str, str]:
    for cls in type(exc).__mro__:
        answer = SHARED_MEMORY_ANSWERS.get(cls)  # type: ignore[call-overload]
        if answer is not None:
            return answer
    return 500, "INTERNAL", "internal"

"""How an error is answered: the HTTP status and the reason (for logs and metrics) of each
error the front ends meet, read by HTTP (:mod:`model_runtime.server.app`), gRPC (which maps
the status onto its codes, :mod:`model_runtime.server.grpc.service`) and the Ray front end
alike, so every protocol answers the same error the same way.
"""

from __future__ import annotations

from model_runtime.errors import (
    ExecutionTimeoutError,
    InputValidationError,
    ModelNotFoundError,
    ModelRuntimeError,
    QueueFullError,
    RunnerStoppedError,
    UnknownModelError,
)

__all__ = ["HTTPError", "status_of"]


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

"""The repository API for clients (load and unload), HTTP and gRPC alike: the repository's
refusals answered in Triton's words and codes."""

from __future__ import annotations

from model_runtime.errors import (
    DeviceUnavailableError,
    ModelControlError,
    ModelLoadError,
    UnknownModelError,
)
from model_runtime.server import answers
from model_runtime.server.answers import HTTPError
from model_runtime.server.inference.plane import DataPlane
from model_runtime.server.tensors.parameters import load_request_parameters

__all__ = ["load_model", "unload_model"]


async def load_model(plane: DataPlane, name: str, body: bytes = b"") -> None:
    """Load (or reload) ``name`` for a client; ``body`` is the load request's JSON (its
    ``parameters``).

    Raises:
        HTTPError: 503 draining or no device free or the control mode forbids it (Triton's
            UNAVAILABLE), 400 the load failed or the model is not in the repository (Triton's
            ``failed to load 'NAME', failed to poll from model repository``; Triton answers
            that one 500, but the fault is the caller's).
        ProtocolError: the body is malformed or has parameters other than ``config``; the
            name is empty or a path (Triton's words).
    """
    if plane.draining:
        raise HTTPError(503, "the server is draining", "draining")
    # A `config` override is applied (or its load fails, a 400); file overrides are refused.
    config = load_request_parameters(body, name)
    try:
        await plane.repository.client_load(name, config)
    except ModelControlError as exc:
        raise answers.polling_enabled() from exc
    except ModelLoadError as exc:
        busy = isinstance(exc.cause, DeviceUnavailableError)
        raise HTTPError(503 if busy else 400, str(exc), "load_failed") from exc
    except UnknownModelError as exc:
        message = f"failed to load '{name}', failed to poll from model repository"
        raise HTTPError(400, message, "load_failed") from exc


async def unload_model(plane: DataPlane, name: str, dependents: bool = False) -> None:
    """Unload ``name`` for a client, draining its in-flight requests; ``dependents``
    (Triton's ``unload_dependents``): an ensemble's composing models too.

    Raises:
        HTTPError: 503 the control mode forbids it (Triton's UNAVAILABLE).
        UnknownModelError: no such model.
    """
    try:
        await plane.repository.client_unload(name, dependents)
    except ModelControlError as exc:
        raise answers.polling_enabled() from exc

"""The daemon's front-end limits and settings, shared by its front ends through the data plane."""

from __future__ import annotations

from dataclasses import dataclass

from model_runtime.server.inference.admission import DEFAULT_QUEUE_DELAY

__all__ = ["ServerOptions"]


@dataclass(frozen=True, slots=True)
class ServerOptions:
    """Front-end limits and settings.

    ``request_timeout`` (seconds, None: none) bounds queue + compute; a request's own
    ``timeout`` parameter can only shorten it. ``body_timeout`` (seconds, None: none) bounds
    reading a request body (408 past it). ``access_log``: one INFO line per request.
    ``priority_levels`` / ``default_priority_level``: Triton's dynamic batching fields, for
    the mapping of a request's ``priority`` (None: not configured, see
    :func:`~model_runtime.server.tensors.parameters.execute_priority`). ``retry_after``: seconds,
    in the ``Retry-After`` of a 503 for a full queue. ``admission_delay``: seconds of work a
    model may hold at the front end before new requests are refused unparsed (None: no
    front-end limit; see :mod:`model_runtime.server.inference.admission`).
    ``allow_client_shm``: clients may register and unregister system shared memory regions
    (:mod:`model_runtime.server.tensors.shm`; off: those calls are refused with Triton's text,
    and the extension is not listed).
    """

    max_body_size: int = 64 << 20
    request_timeout: float | None = 60.0
    server_name: str = "model-runtime"
    server_version: str = "0.1.0"
    body_timeout: float | None = 60.0
    access_log: bool = True
    priority_levels: int | None = None
    #: Triton's ``--allow-client-shm``: clients may register system shared memory regions
    allow_client_shm: bool = True
    #: Triton's ``--allow-metrics``: ``/metrics`` is served (off: 404)
    metrics: bool = True
    default_priority_level: int | None = None
    retry_after: int = 1
    admission_delay: float | None = DEFAULT_QUEUE_DELAY

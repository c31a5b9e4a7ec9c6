"""Per-request log context and the access log of the HTTP front end (DESIGN.md §11, §12).

Every request gets an id: the client's ``X-Request-ID`` when it is a sane token, else a new
one; it is echoed in the response. While the handler runs, ``request_id`` is bound in
structlog's contextvars, so the handler's own log events carry it, and it is unbound when the
handler returns: nothing of one request is left for the next on the same connection.

Tasks inherit the context they are created in, so whatever a handler starts that outlives it
(the repository endpoints start and stop runners: actors, supervisors, device workers) would
carry the request's id in every log event for the rest of its life. Handlers that start such
work (:func:`detaches`) therefore run in the context the request arrived with, without the id.

The access log is one INFO event per request, ``http_request``, with ``method``, ``path``,
``status``, ``duration_ms`` and ``request_id`` (a client that went away: status 499, as
nginx logs it). It can be turned off (``enabled=False``); it is written after the response
is built, from the handler's task, with no I/O of its own beyond the log line.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import re
import time
import uuid
from collections.abc import Awaitable, Callable

import structlog
from aiohttp import web
from aiohttp.typedefs import Middleware

__all__ = [
    "REQUEST_ID_HEADER",
    "access_middleware",
    "detaches",
    "new_request_id",
    "request_id_of",
]

log = structlog.get_logger("model_runtime.server.access")

REQUEST_ID_HEADER = "X-Request-ID"
#: What a client's request id may look like; anything else (log injection, megabytes) is
#: replaced by a fresh id.
#: New request ids: a random prefix per process, then a counter (uuid4 per request costs a
#: call to os.urandom; the ids only need to be unique, not secret).
_ID_PREFIX = uuid.uuid4().hex[:8]
_ids = itertools.count()
_SANE_ID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")
#: A client that closed the connection before the answer (nginx's code for it).
CLIENT_CLOSED = 499

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def request_id_of(request: web.Request) -> str:
    """The request's id: the client's ``X-Request-ID`` if sane, else a new 16-hex-digit one."""
    return new_request_id(request.headers.get(REQUEST_ID_HEADER))


def new_request_id(given: str | None) -> str:
    """``given`` (a client's ``X-Request-ID``) if sane, else a new 16-hex-digit id."""
    if given is not None and _SANE_ID.fullmatch(given):
        return given
    return _ID_PREFIX + hex(next(_ids))[2:].zfill(8)  # (:08x, without a format spec's cost)


def detaches(request: web.Request) -> bool:
    """True for requests whose handler may start work that outlives it: the repository API."""
    return request.path.startswith("/v2/repository/")


def access_middleware(
    *, enabled: bool = True, detach: Callable[[web.Request], bool] = detaches
) -> Middleware:
    """The outermost middleware: request id, log context, access log line.

    Put it before any middleware that turns exceptions into responses, so that it logs the
    status the client gets.
    """

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        rid = request_id_of(request)
        t0 = time.perf_counter()
        status = 500
        try:
            if detach(request):
                # A fresh task in the arrival context (without this request's id): what it
                # starts inherits no request id. Cancelling this handler (client gone)
                # cancels the task it awaits.
                arrived = contextvars.copy_context()
                resp = await asyncio.create_task(_call(handler, request), context=arrived)
            else:
                tokens = structlog.contextvars.bind_contextvars(request_id=rid)
                try:
                    resp = await handler(request)
                finally:
                    structlog.contextvars.reset_contextvars(**tokens)
            status = resp.status
            resp.headers[REQUEST_ID_HEADER] = rid
            return resp
        except asyncio.CancelledError:
            status = CLIENT_CLOSED
            raise
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            if enabled:
                log.info(
                    "http_request",
                    method=request.method,
                    path=request.path,
                    status=status,
                    duration_ms=round((time.perf_counter() - t0) * 1e3, 3),
                    request_id=rid,
                )

    return middleware


async def _call(handler: Handler, request: web.Request) -> web.StreamResponse:
    return await handler(request)

"""The HTTP app's outermost middleware: admission control for the infer requests the connection
guard did not decide at their head (:mod:`model_runtime.server.inference.admission` is the
policy; this is its aiohttp side)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, cast

from aiohttp import web
from aiohttp.typedefs import Middleware

from model_runtime.server.http.guard import ADMITTED
from model_runtime.server.inference.admission import QUEUE_FULL, AdmissionControl, ModelAdmission

__all__ = ["admission_middleware"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def admission_middleware(control: AdmissionControl) -> Middleware:
    """The middleware deciding ``control``'s admission in the app (see the module docstring)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        """The outermost middleware: refuses an infer request over its model's limit before
        anything reads its body (no access log line, no parse), answers from the prebuilt
        503; counts admitted ones in flight."""
        admitted = cast("ModelAdmission | None", request.get(ADMITTED))
        if request.method != "POST" or not request.path.endswith("/infer"):
            return await _unadmitted(admitted, request, handler)
        name: Any = request.match_info.get("name")
        if not isinstance(name, str):
            return await _unadmitted(admitted, request, handler)
        state = control.models.get(name)
        if admitted is not None and admitted is not state:
            admitted.withdraw()  # not the model the guard read (cannot happen; never leak it)
            admitted = None
        if state is None:
            # State is made for models that exist only (a client's made-up names cost nothing).
            resp = await handler(request)
            if resp.status != 404:
                control.model(name)
            return resp
        if admitted is None:  # not decided at the head
            reason = state.refuses()
            if reason is not None:
                control.refuse(state, reason)
                return web.Response(
                    body=state.body,
                    status=503,
                    content_type="application/json",
                    headers=state.headers,
                )
            state.enter()
        queue_full = False
        try:
            resp = await handler(request)
            # The runner's refusal (QueueFullError) is the only 503 that carries Retry-After.
            queue_full = resp.status == 503 and "Retry-After" in resp.headers
            if queue_full:
                state.refused[QUEUE_FULL].inc()
            return resp
        finally:
            state.leave(queue_full, control.queue_delay, control.capacity)

    return middleware


async def _unadmitted(
    admitted: ModelAdmission | None, request: web.Request, handler: Handler
) -> web.StreamResponse:
    if admitted is not None:
        admitted.withdraw()
    return await handler(request)

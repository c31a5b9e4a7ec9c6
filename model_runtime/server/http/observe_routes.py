"""Triton's logging and trace extensions over HTTP::

    GET|POST /v2/logging                                  the log settings (logging_ext)
    GET|POST /v2/trace/setting                            the global trace setting
    GET|POST /v2/models/{name}[/versions/{v}]/trace/setting   a model's trace setting

A POST changes the settings it names and answers them all; an empty body changes nothing.
Errors are Triton's texts and codes (raised by :mod:`.logging_ext` and :mod:`.trace`,
answered by the server's middleware). A model's setting is asked of a model that is ready,
else ``Request for unknown model : NAME`` (400).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from model_runtime.server.answers import Code, HTTPError
from model_runtime.server.inference.plane import DataPlane
from model_runtime.server.observability.logging_ext import LOG_SETTINGS

__all__ = ["ObserveRoutes"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ObserveRoutes:
    """The HTTP handlers of the logging and trace extensions over ``plane``."""

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane

    def routes(self, bases: tuple[str, ...]) -> list[tuple[str, str, Handler, str]]:
        """(method, path, handler, API group) for the application's router."""
        out: list[tuple[str, str, Handler, str]] = []
        for method in ("GET", "POST"):
            out.append((method, "/v2/logging", self.logging, "logging"))
            out.append((method, "/v2/trace/setting", self.trace, "trace"))
            out += [(method, f"{b}/trace/setting", self.trace, "trace") for b in bases]
        return out

    async def logging(self, request: web.Request) -> web.Response:
        """``GET|POST /v2/logging``: the log settings (after the POST's changes)."""
        if request.method == "POST":
            doc = LOG_SETTINGS.update_json(await _body(request, "dynamic logging"))
        else:
            doc = LOG_SETTINGS.settings()
        return _json(doc)

    async def trace(self, request: web.Request) -> web.Response:
        """``GET|POST [/v2/models/{name}]/v2/trace/setting``: a trace setting."""
        model = request.match_info.get("name")
        if model is not None:
            try:
                ready = self.plane.entry(model).is_ready
            except Exception:
                ready = False
            if not ready:
                raise HTTPError.triton(
                    Code.INVALID_ARG, f"Request for unknown model : {model}", "unknown_model"
                )
        tracer = self.plane.tracer
        if request.method == "POST":
            doc = tracer.update_json(model, await _body(request, "trace"))
        else:
            doc = tracer.settings(model)
        return _json(doc)


async def _body(request: web.Request, what: str) -> Any:
    body = await request.read()
    if not body.strip():
        return {}
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise HTTPError.triton(
            Code.INVALID_ARG, f"failed to parse the request JSON buffer: {exc}", "bad_request"
        ) from None


def _json(doc: Any) -> web.Response:
    return web.Response(body=orjson.dumps(doc), content_type="application/json")

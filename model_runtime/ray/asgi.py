"""The daemon's HTTP routes as an ASGI application, for Ray Serve's proxy.

Serve speaks ASGI to its replicas; the daemon's front end is aiohttp. Rather than a second
implementation of the Open Inference Protocol v2, this adapter routes the daemon's paths
(:meth:`HttpFrontEnd.app`'s table) to the *same* :class:`HttpFrontEnd` handlers, each
given a small view of the ASGI request (:class:`AsgiRequest`: ``match_info``, ``headers``,
``content_length``, ``content.readany()``, ``read()``, which is all the handlers read), and
answers their ``web.Response``. Errors are mapped as the daemon's middleware maps them
(:func:`~model_runtime.server.answers.status_of`, ``{"error": ...}``, ``Retry-After`` on a full
queue), so a client cannot tell the two front ends apart, except for two things added here:

- every answer carries ``model-runtime-replica`` (the Ray replica) and ``model-runtime-node``
  (its Ray node) headers, and an inference response's JSON carries them in its
  ``parameters`` (``ray_replica``, ``ray_node``), since Triton's client shows no headers;
- the daemon's front-end admission control (refusing unread bodies) is not in front of these
  handlers: Serve's own ``max_ongoing_requests`` bounds a replica, and the runner's latency
  budget still refuses overload with a 503.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any, cast

import orjson
import structlog
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from model_runtime.server.answers import status_of
from model_runtime.server.http.routes import HttpFrontEnd
from model_runtime.server.tensors.binary import HEADER_LENGTH

__all__ = ["AsgiRequest", "OipAsgiApp"]

log = structlog.get_logger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_MODEL_SUFFIXES = {
    ("GET", ""): "model_metadata",
    ("GET", "ready"): "model_ready",
    ("GET", "config"): "model_config",
    ("POST", "infer"): "infer",
    ("GET", "stats"): "stats",
}
_FIXED = {
    ("GET", "/v2"): "server_metadata",
    ("GET", "/v2/health/live"): "live",
    ("GET", "/v2/health/ready"): "ready",
    ("GET", "/v2/models/stats"): "stats",
    ("GET", "/metrics"): "prometheus",
    ("POST", "/v2/repository/index"): "repository_index",
}


class _Body:
    """``request.content`` over ASGI ``http.request`` messages: ``readany()`` returns the next
    chunk, ``b""`` at the end (a client that went away ends the body early)."""

    __slots__ = ("_done", "_receive")

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._done = False

    def is_eof(self) -> bool:
        """False: the body comes message by message, so it is read with :meth:`readany`
        (aiohttp's ``StreamReader`` says True once the whole body is buffered)."""
        return False

    async def readany(self) -> bytes:
        """The next non-empty chunk of the body, or ``b""`` when it has ended."""
        while not self._done:
            message = await self._receive()
            if message["type"] != "http.request":  # http.disconnect
                self._done = True
                break
            self._done = not message.get("more_body", False)
            chunk: bytes = message.get("body", b"")
            if chunk:
                return chunk
        return b""


class AsgiRequest:
    """What the daemon's handlers read of an aiohttp request, over an ASGI request."""

    __slots__ = ("content", "content_length", "headers", "match_info", "method", "path")

    def __init__(
        self, scope: Scope, receive: Receive, match_info: Mapping[str, str] | None = None
    ) -> None:
        raw = CIMultiDict[str]()
        for key, value in scope.get("headers", ()):
            raw.add(key.decode("latin-1"), value.decode("latin-1"))
        self.headers = CIMultiDictProxy(raw)
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self.match_info: Mapping[str, str] = match_info or {}
        length = self.headers.get("Content-Length")
        self.content_length = int(length) if length and length.isdigit() else None
        self.content = _Body(receive)

    async def read(self) -> bytes:
        """The whole body."""
        chunks = []
        while chunk := await self.content.readany():
            chunks.append(chunk)
        return b"".join(chunks)


def route(method: str, path: str) -> tuple[str, dict[str, str]] | None:
    """The :class:`HttpFrontEnd` handler name and match info for a request, as the daemon's
    router resolves it (``/v2/models/stats`` before ``/v2/models/{name}``); None: no route."""
    path = path.rstrip("/") if path != "/" else path
    fixed = _FIXED.get((method, path))
    if fixed is not None:
        return fixed, {}
    parts = path.split("/")[1:]
    if parts[:3] == ["v2", "repository", "models"] and len(parts) == 5 and method == "POST":
        if parts[4] in ("load", "unload"):
            return parts[4], {"name": parts[3]}
        return None
    if parts[:2] != ["v2", "models"] or len(parts) < 3:
        return None
    info = {"name": parts[2]}
    rest = parts[3:]
    if len(rest) >= 2 and rest[0] == "versions":
        info["version"] = rest[1]
        rest = rest[2:]
    if len(rest) > 1:
        return None
    name = _MODEL_SUFFIXES.get((method, rest[0] if rest else ""))
    return None if name is None else (name, info)


class OipAsgiApp:
    """ASGI application answering the Open Inference Protocol v2 with ``http``'s handlers.

    ``identity``: headers every answer carries (and inference responses' ``parameters``), to
    say which replica answered.
    """

    def __init__(self, http: HttpFrontEnd, identity: Mapping[str, str]) -> None:
        self.http = http
        self._headers = [(f"model-runtime-{k}".encode(), v.encode()) for k, v in identity.items()]
        params = orjson.dumps({"parameters": {f"ray_{k}": v for k, v in identity.items()}})
        self._params = params[1:-1] + b","  # spliced after the response's opening brace

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer one ASGI request (``http``), or the ``lifespan`` protocol (nothing to do:
        the replica starts and stops the runtime)."""
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                kind = message["type"].rsplit(".", 1)[-1]  # startup / shutdown
                await send({"type": f"{message['type']}.complete"})
                if kind == "shutdown":
                    return
        if scope["type"] != "http":
            return
        found = route(scope["method"], scope["path"])
        if found is None:
            await self._answer(send, 404, b'{"error":"404: Not Found"}', {})
            return
        handler_name, match_info = found
        request = AsgiRequest(scope, receive, match_info)
        handler: Handler = getattr(self.http, handler_name)
        try:
            resp = await handler(cast(web.Request, request))
        except Exception as exc:
            status, body, headers = self._error(request, exc)
            await self._answer(send, status, body, headers)
            return
        assert isinstance(resp, web.Response)
        body = bytes(cast(bytes, resp.body))
        headers = {k: v for k, v in resp.headers.items() if k.lower() != "content-length"}
        if handler_name == "infer" and body[:1] == b"{":
            body = b"{" + self._params + body[1:]
            if HEADER_LENGTH in headers:
                headers[HEADER_LENGTH] = str(int(headers[HEADER_LENGTH]) + len(self._params))
        await self._answer(send, resp.status, body, headers)

    def _error(self, request: AsgiRequest, exc: Exception) -> tuple[int, bytes, dict[str, str]]:
        """The daemon middleware's answer to ``exc``."""
        if isinstance(exc, web.HTTPException):
            message = exc.reason if exc.text is None else exc.text
            return exc.status, orjson.dumps({"error": message}), {}
        status, reason = status_of(exc)
        headers = dict(getattr(exc, "headers", None) or {})
        if reason == "queue_full":
            headers = {"Retry-After": str(self.http.options.retry_after)}
        elif reason == "internal":
            log.exception("request_failed", path=request.path, status=status)
        elif status >= 500:
            log.warning("request_failed", path=request.path, status=status, error=str(exc))
        message = str(exc) or type(exc).__name__
        return status, orjson.dumps({"error": message}), headers

    async def _answer(
        self, send: Send, status: int, body: bytes, headers: Mapping[str, str]
    ) -> None:
        raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        if not any(k.lower() == b"content-type" for k, _ in raw):
            raw.append((b"content-type", b"application/json"))
        raw.append((b"content-length", str(len(body)).encode()))
        raw += self._headers
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await send({"type": "http.response.body", "body": body})

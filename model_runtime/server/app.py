"""HTTP routes of the Open Inference Protocol v2 (KServe v2) over aiohttp.

Every error is answered as ``{"error": "..."}`` with the status its cause calls for: 400 bad
request, 404 unknown model or route, 413 body over the limit (refused from ``Content-Length``
before a byte of the body is read, or as soon as a chunked body passes the limit), 500 device
failure, 503 not ready / draining / stopped, 504 deadline exceeded. Client disconnects cancel
the handler (``handler_cancellation``), which cancels the runner request.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import structlog
from aiohttp import web

from model_runtime.errors import (
    ExecutionTimeoutError,
    InputValidationError,
    ModelRuntimeError,
    RunnerStoppedError,
)
from model_runtime.server.codec import encode_infer_response, parse_infer_request
from model_runtime.server.metrics import CONTENT_TYPE, DaemonMetrics
from model_runtime.server.repository import (
    ModelEntry,
    ModelNotFoundError,
    ModelRepository,
    ModelState,
)
from model_runtime.server.stats import model_statistics

__all__ = ["HEADER_LENGTH", "InferenceServer", "ServerOptions"]

log = structlog.get_logger(__name__)

#: The binary tensor data extension's header: bytes of JSON at the start of the body.
HEADER_LENGTH = "Inference-Header-Content-Length"
_THREAD_PARSE_BYTES = 1 << 20
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class ServerOptions:
    """Front-end limits. ``request_timeout`` (seconds, None: none) bounds queue + compute."""

    max_body_size: int = 64 << 20
    request_timeout: float | None = 60.0
    server_name: str = "model-runtime"
    server_version: str = "0.1.0"


class HTTPError(Exception):
    """An answer other than 200, with its status and message."""

    def __init__(self, status: int, message: str, reason: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


def _status_of(exc: BaseException) -> tuple[int, str]:
    match exc:
        case HTTPError():
            return exc.status, exc.reason
        case ModelNotFoundError():
            return 404, "unknown_model"
        case InputValidationError():
            return 400, "bad_request"
        case RunnerStoppedError():
            return 503, "not_ready"
        case ExecutionTimeoutError() | TimeoutError():
            return 504, "deadline_exceeded"
        case ModelRuntimeError():
            return 500, "runtime_error"
    return 500, "internal"


def _json(doc: Any, status: int = 200) -> web.Response:
    return web.Response(
        body=json.dumps(doc, separators=(",", ":")).encode(),
        status=status,
        content_type="application/json",
    )


def _error(status: int, message: str) -> web.Response:
    resp = _json({"error": message}, status)
    if status == 413:
        resp.force_close()  # do not linger reading a body we refused
    return resp


class InferenceServer:
    """The HTTP front end over a :class:`ModelRepository`."""

    def __init__(
        self,
        repository: ModelRepository,
        options: ServerOptions | None = None,
        metrics: DaemonMetrics | None = None,
    ) -> None:
        self.repository = repository
        self.options = options or ServerOptions()
        self.metrics = metrics or DaemonMetrics()
        repository.on_readiness = self.metrics.readiness_changed
        self.draining = False
        self._pending_gauges: dict[str, Any] = {}
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def app(self) -> web.Application:
        """The aiohttp application (``client_max_size`` enforces the body limit)."""
        app = web.Application(
            client_max_size=self.options.max_body_size, middlewares=[self._middleware]
        )
        g, p = "GET", "POST"
        model = "/v2/models/{name}"
        versioned = "/v2/models/{name}/versions/{version}"
        routes: list[tuple[str, str, Handler]] = [
            (g, "/v2", self.server_metadata),
            (g, "/v2/health/live", self.live),
            (g, "/v2/health/ready", self.ready),
            (g, "/v2/models/stats", self.stats),
            (g, "/metrics", self.prometheus),
            (p, "/v2/repository/index", self.repository_index),
            (p, "/v2/repository/models/{name}/load", self.load),
            (p, "/v2/repository/models/{name}/unload", self.unload),
        ]
        for base in (model, versioned):
            routes += [
                (g, base, self.model_metadata),
                (g, f"{base}/ready", self.model_ready),
                (p, f"{base}/infer", self.infer),
                (g, f"{base}/stats", self.stats),
            ]
        for method, path, handler in routes:
            app.router.add_route(method, path, handler)
        return app

    # -- lifecycle -----------------------------------------------------------------------------

    async def drain(self, grace: float) -> bool:
        """Refuse new requests (503) and wait up to ``grace`` s for in-flight ones; True if
        they all finished."""
        self.draining = True
        self.metrics.draining.set(1)
        with anyio.move_on_after(grace):
            await self._idle.wait()
            return True
        return False

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        rid = request.headers.get("X-Request-ID") or uuid.uuid4().hex[:16]
        with structlog.contextvars.bound_contextvars(request_id=rid):
            try:
                resp = await handler(request)
            except web.HTTPException as exc:
                if exc.status < 400:
                    raise
                resp = _error(exc.status, exc.reason if exc.text is None else exc.text)
            except Exception as exc:
                status, reason = _status_of(exc)
                if reason == "internal":
                    log.exception("request_failed", path=request.path, status=status)
                elif status >= 500:
                    log.warning("request_failed", path=request.path, status=status, error=str(exc))
                resp = _error(status, str(exc) or type(exc).__name__)
            resp.headers["X-Request-ID"] = rid
            return resp

    # -- health and metadata ---------------------------------------------------------------------

    async def server_metadata(self, request: web.Request) -> web.Response:
        """``GET /v2``: server name, version and protocol extensions."""
        return _json(
            {
                "name": self.options.server_name,
                "version": self.options.server_version,
                "extensions": ["binary_tensor_data", "model_repository", "statistics"],
            }
        )

    async def live(self, request: web.Request) -> web.Response:
        """``GET /v2/health/live``: the process answers."""
        return _json({"live": True})

    def _not_ready_reason(self) -> str | None:
        if self.draining:
            return "the server is draining"
        loaded = [e for e in self.repository.entries() if e.state is not ModelState.UNAVAILABLE]
        if not loaded:
            return "no model is loaded"
        bad = [e.name for e in loaded if not e.is_ready]
        return f"model(s) not ready: {bad}" if bad else None

    async def ready(self, request: web.Request) -> web.Response:
        """``GET /v2/health/ready``: 200 while every loaded model has a ready replica."""
        reason = self._not_ready_reason()
        if reason is None:
            return _json({"ready": True})
        return _json({"ready": False, "error": reason}, 503)

    def _entry(self, request: web.Request) -> ModelEntry:
        version = request.match_info.get("version")
        entry = self.repository.get(request.match_info["name"])
        if version is not None and version != "1":
            raise ModelNotFoundError(f"model {entry.name!r} has no version {version!r}")
        return entry

    async def model_metadata(self, request: web.Request) -> web.Response:
        """``GET /v2/models/{name}``: inputs and outputs with protocol datatypes."""
        entry = self._entry(request)
        if entry.runner is None:
            raise HTTPError(503, f"model {entry.name!r} is not loaded", "not_ready")
        return _json(
            {
                "name": entry.name,
                "versions": ["1"],
                "platform": "model-runtime",
                "inputs": [_tensor(s) for s in entry.inputs],
                "outputs": [_tensor(s) for s in entry.outputs],
            }
        )

    async def model_ready(self, request: web.Request) -> web.Response:
        """``GET /v2/models/{name}/ready``: 200 while a replica is ready, else 503."""
        entry = self._entry(request)
        if entry.is_ready and not self.draining:
            return _json({"name": entry.name, "ready": True})
        runner = entry.runner
        states = [s.value for s in runner.replica_status()] if runner is not None else []
        why = "draining" if self.draining else f"state {entry.state.value}, replicas {states}"
        return _json({"name": entry.name, "ready": False, "error": f"not ready: {why}"}, 503)

    # -- inference -------------------------------------------------------------------------------

    async def infer(self, request: web.Request) -> web.Response:
        """``POST /v2/models/{name}/infer``: JSON and binary tensors in, the same out."""
        entry = self._entry(request)
        runner = entry.runner
        refusal: HTTPError | None = None
        size = request.content_length
        if self.draining:
            refusal = HTTPError(503, "the server is draining", "draining")
        elif runner is None or entry.state is not ModelState.READY:
            refusal = HTTPError(503, f"model {entry.name!r} is {entry.state.value}", "not_ready")
        elif size is not None and size > self.options.max_body_size:
            limit = self.options.max_body_size
            refusal = HTTPError(413, f"body of {size} bytes exceeds {limit}", "too_large")
        if refusal is not None:
            self.metrics.observe(entry.name, refusal.reason, 0.0, 0)
            raise refusal
        self._enter(entry.name)
        t0 = time.perf_counter()
        reason: str | None = "internal"
        samples = 0
        try:
            resp, samples = await self._infer(request, entry, runner)
            reason = None
            return resp
        except asyncio.CancelledError:
            reason = "cancelled"
            log.info("request_cancelled", model=entry.name)
            raise
        except BaseException as exc:
            reason = "too_large" if isinstance(exc, web.HTTPRequestEntityTooLarge) else None
            reason = reason or _status_of(exc)[1]
            raise
        finally:
            seconds = time.perf_counter() - t0
            entry.stats.record(reason is None, int(seconds * 1e9), samples)
            self.metrics.observe(entry.name, reason, seconds, samples)
            self._leave(entry.name)

    async def _infer(
        self, request: web.Request, entry: ModelEntry, runner: Any
    ) -> tuple[web.Response, int]:
        body = await request.read()
        raw = request.headers.get(HEADER_LENGTH)
        try:
            header_length = None if raw is None else int(raw)
        except ValueError:
            raise HTTPError(400, f"{HEADER_LENGTH} must be an integer", "bad_request") from None

        def parse() -> Any:
            return parse_infer_request(
                body, header_length, entry.inputs, entry.outputs, model=entry.name
            )

        if len(body) > _THREAD_PARSE_BYTES:
            parsed = await anyio.to_thread.run_sync(parse)
        else:
            parsed = parse()
        async with asyncio.timeout(self.options.request_timeout):
            results = await runner.execute(parsed.inputs)
        out, json_length = encode_infer_response(entry.name, "1", parsed, results, entry.datatypes)
        first = next(iter(parsed.inputs.values()))
        samples = int(first.shape[0]) if first.ndim else 1
        if json_length is None:
            return web.Response(body=out, content_type="application/json"), samples
        resp = web.Response(body=out, content_type="application/octet-stream")
        resp.headers[HEADER_LENGTH] = str(json_length)
        return resp, samples

    def _pending(self, model: str) -> Any:
        gauge = self._pending_gauges.get(model)
        if gauge is None:
            gauge = self._pending_gauges[model] = self.metrics.pending.labels(model)
        return gauge

    def _enter(self, model: str) -> None:
        self._inflight += 1
        self._idle.clear()
        self._pending(model).inc()

    def _leave(self, model: str) -> None:
        self._inflight -= 1
        self._pending(model).dec()
        if self._inflight == 0:
            self._idle.set()

    # -- statistics, metrics, repository ---------------------------------------------------------

    async def stats(self, request: web.Request) -> web.Response:
        """``GET /v2/models/{name}/stats`` (or all models): the statistics extension."""
        entries = [self._entry(request)] if "name" in request.match_info else None
        entries = entries if entries is not None else self.repository.entries()
        return _json({"model_stats": [await model_statistics(e) for e in entries]})

    async def prometheus(self, request: web.Request) -> web.Response:
        """``GET /metrics``: Prometheus text format."""
        await self.metrics.refresh(self.repository)
        resp = web.Response(body=self.metrics.render())
        resp.headers["Content-Type"] = CONTENT_TYPE
        return resp

    async def repository_index(self, request: web.Request) -> web.Response:
        """``POST /v2/repository/index``: every model and its state."""
        return _json(self.repository.index())

    async def load(self, request: web.Request) -> web.Response:
        """``POST /v2/repository/models/{name}/load``."""
        if self.draining:
            raise HTTPError(503, "the server is draining", "draining")
        await self.repository.load(request.match_info["name"])
        return _json({})

    async def unload(self, request: web.Request) -> web.Response:
        """``POST /v2/repository/models/{name}/unload``: drains the model's in-flight requests."""
        await self.repository.unload(request.match_info["name"])
        return _json({})


def _tensor(spec: Any) -> dict[str, Any]:
    return {"name": spec.name, "datatype": spec.datatype, "shape": list(spec.shape)}

"""HTTP routes of the Open Inference Protocol v2 (KServe v2) over aiohttp.

Every error is answered as ``{"error": "..."}`` with the status its cause calls for, in
Triton's words where Triton has them (:mod:`model_runtime.server.answers`): 400 bad request or
unknown model (``Request for unknown model: 'NAME' is not found``) or a body over the limit
(refused from ``Content-Length`` before a byte of it is read, or as soon as a chunked or
compressed body passes the limit), 404 unknown version of a known model or unknown route, 503
a load or unload the model control mode forbids (Triton's UNAVAILABLE), 500 device failure,
503 not ready / draining / stopped / queue full (with ``Retry-After``), 504 deadline exceeded,
408 a body that did not arrive within ``body_timeout``; shared memory errors as Triton answers
them (:data:`~model_runtime.server.answers.SHARED_MEMORY_ANSWERS`). Client disconnects cancel
the handler (``handler_cancellation``), which cancels the runner request.

Inference honours the request's parameters (:mod:`model_runtime.server.parameters`):
``timeout`` (microseconds) shortens the request's deadline and reaches the runner, which drops
the request before it reaches a device once it passed; ``priority`` (1 highest, 0 default)
becomes ``execute(priority=...)`` through :func:`~model_runtime.server.parameters.execute_priority`;
anything not supported is a 400 that names it. Request JSON goes through simdjson, numeric
tensor data straight into arrays (:mod:`model_runtime.server.jsontape`; orjson for what it
does not read), response JSON through orjson; bodies over 1 MiB are decoded and encoded off the
event loop. Every request is logged once
(:mod:`model_runtime.server.access`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from model_runtime.errors import (
    ModelRuntimeError,
)
from model_runtime.server import control
from model_runtime.server.access import RateLimitedLog, access_middleware
from model_runtime.server.admission import DEFAULT_QUEUE_DELAY, AdmissionControl
from model_runtime.server.answers import HTTPError
from model_runtime.server.body import (
    HEADER_LENGTH,
    read_body,
    too_large as body_too_large,
)
from model_runtime.server.inference import InferencePaths
from model_runtime.server.metrics import CONTENT_TYPE, DaemonMetrics
from model_runtime.server.repository import (
    ModelEntry,
    ModelRepository,
)
from model_runtime.server.restrict import RestrictionCounter, Restrictions, http_middleware
from model_runtime.server.shm import SharedMemoryRegistry
from model_runtime.server.shm_routes import SharedMemoryRoutes
from model_runtime.server.stats import model_statistics
from model_runtime.server.triton.config import config_json, served_config

__all__ = ["HEADER_LENGTH", "InferenceServer", "ServerOptions"]


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class ServerOptions:
    """Front-end limits and settings.

    ``request_timeout`` (seconds, None: none) bounds queue + compute; a request's own
    ``timeout`` parameter can only shorten it. ``body_timeout`` (seconds, None: none) bounds
    reading a request body (408 past it). ``access_log``: one INFO line per request.
    ``priority_levels`` / ``default_priority_level``: Triton's dynamic batching fields, for
    the mapping of a request's ``priority`` (None: not configured, see
    :func:`~model_runtime.server.parameters.execute_priority`). ``retry_after``: seconds, in the
    ``Retry-After`` of a 503 for a full queue. ``admission_delay``: seconds of work a model may
    hold at the front end before new requests are refused unparsed (None: no front-end limit;
    see :mod:`model_runtime.server.admission`). ``allow_client_shm``: clients may register and
    unregister system shared memory regions (:mod:`model_runtime.server.shm`; off: those
    calls are refused with Triton's text, and the extension is not listed).
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
    default_priority_level: int | None = None
    retry_after: int = 1
    admission_delay: float | None = DEFAULT_QUEUE_DELAY


def _json(doc: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(doc), status=status, content_type="application/json")


def _error(
    status: int, message: str, headers: dict[str, str] | None = None, *, close: bool = False
) -> web.Response:
    resp = _json({"error": message}, status)
    if headers:
        resp.headers.update(headers)
    if close:
        resp.force_close()  # do not linger reading a body we refused
    return resp


class InferenceServer(InferencePaths):
    """The HTTP front end over a :class:`ModelRepository` (how a request is run, HTTP or gRPC:
    :class:`~model_runtime.server.inference.InferencePaths`)."""

    def __init__(
        self,
        repository: ModelRepository,
        options: ServerOptions | None = None,
        metrics: DaemonMetrics | None = None,
        restrictions: Restrictions | None = None,
    ) -> None:
        self.repository = repository
        self.options = options or ServerOptions()
        self.metrics = metrics or DaemonMetrics()
        #: The HTTP listener's restricted API groups (Triton's --http-restricted-api).
        self.restrictions = restrictions or Restrictions()
        self.restricted = RestrictionCounter(self.metrics.registry)
        #: Each route of :meth:`app` -> its API group (what the restrictions are checked by).
        self.route_groups: dict[web.AbstractRoute, str] = {}
        repository.on_readiness = self.metrics.readiness_changed
        # A runner a reload swaps out (or an unload closes) is read into the totals first.
        repository.on_retire = self.metrics.retire_runner
        self.draining = False
        #: Listeners (``"grpc"``, ...) that stopped and are being restarted -> why.
        self.listeners_down: dict[str, str] = {}
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._queue_full_log = RateLimitedLog("requests_refused_queue_full")
        #: Triton's system shared memory extension: the regions clients registered
        self.shared_memory = SharedMemoryRegistry(enabled=self.options.allow_client_shm)
        self.admission = AdmissionControl(
            self.metrics.registry,
            queue_delay=self.options.admission_delay,
            retry_after=self.options.retry_after,
            capacity=self._capacity,
        )
        # A stateful model's steps are never shed: its sequence slots bound its work, and a
        # step refused mid-sequence would break a client's session (model_runtime.sequences).
        repository.on_install = lambda entry: self.admission.exempt(
            entry.name, entry.sequences is not None
        )

    def _capacity(self, name: str) -> int:
        """Requests model ``name``'s replicas take at once: a batch computing and one filling
        per replica (0 when it is not loaded)."""
        try:
            runner = self.repository.get(name, None).runner
        except ModelRuntimeError:
            return 0
        executable = getattr(runner and runner.current, "executable", None)
        if runner is None or executable is None:
            return 0
        return 2 * int(executable.metadata.batch_size) * len(runner.replica_status())

    def app(self) -> web.Application:
        """The aiohttp application (``client_max_size`` enforces the body limit)."""
        access = access_middleware(enabled=self.options.access_log)
        # Restrictions first: a request of a restricted group without its header is refused
        # before admission, parsing or logging look at it.
        middlewares = [self.admission.middleware, access, self._middleware]
        if self.restrictions:  # nothing restricted: no check on the hot path
            restricted = http_middleware(self.restrictions, self.restricted, self._group_of)
            middlewares.insert(0, restricted)
        app = web.Application(client_max_size=self.options.max_body_size, middlewares=middlewares)
        g, p = "GET", "POST"
        bases = ("/v2/models/{name}", "/v2/models/{name}/versions/{version}")
        # Each route with its API group (Triton's, see model_runtime.server.restrict). Infer
        # first: aiohttp tries the routes under one prefix in the order they were added (a
        # regular expression each), and the hot path should not wait behind the others.
        routes: list[tuple[str, str, Handler, str]] = [
            (p, f"{b}/infer", self.infer, "inference") for b in bases
        ]
        routes += [
            (g, "/v2", self.server_metadata, "metadata"),
            (g, "/v2/health/live", self.live, "health"),
            (g, "/v2/health/ready", self.ready, "health"),
            (g, "/v2/models/stats", self.stats, "statistics"),
            (g, "/metrics", self.prometheus, "statistics"),
            (p, "/v2/repository/index", self.repository_index, "model-repository"),
            (p, "/v2/repository/models/{name}/load", self.load, "model-repository"),
            (p, "/v2/repository/models/{name}/unload", self.unload, "model-repository"),
        ]
        shm_routes = SharedMemoryRoutes(self.shared_memory)
        routes += [(m, path, h, "shared-memory") for m, path, h in shm_routes.routes()]
        for base in bases:
            routes += [
                (g, base, self.model_metadata, "metadata"),
                (g, f"{base}/ready", self.model_ready, "health"),
                (g, f"{base}/config", self.model_config, "model-config"),
                (g, f"{base}/stats", self.stats, "statistics"),
            ]
        for method, path, handler, group in routes:
            self.route_groups[app.router.add_route(method, path, handler)] = group
        return app

    def _group_of(self, request: web.Request) -> str | None:
        """The API group of ``request``'s route (None: no route of ours, a 404)."""
        return self.route_groups.get(request.match_info.route)

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every exception becomes its ``{"error": ...}`` answer (request ids, log context and
        the access log are :func:`access_middleware`'s, outside this one)."""
        try:
            return await handler(request)
        except web.HTTPRequestEntityTooLarge:  # a body read whole (a load's) past the limit
            limit = self.options.max_body_size
            too_large = body_too_large(request, request.content_length or limit + 1, limit)
            return _error(400, str(too_large), close=True)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return _error(exc.status, exc.reason if exc.text is None else exc.text)
        except Exception as exc:
            status, message, headers, close = self.error_answer(exc, request.path)
            return _error(status, message, headers, close=close)

    # -- health and metadata ---------------------------------------------------------------------

    def extensions(self) -> list[str]:
        """The protocol extensions this server serves (HTTP and gRPC server metadata)."""
        served = ["binary_tensor_data", "model_repository", "statistics"]
        if self.shared_memory.enabled:
            served.append("system_shared_memory")  # Triton's name
        return served

    async def server_metadata(self, request: web.Request) -> web.Response:
        """``GET /v2``: server name, version and protocol extensions."""
        return _json(
            {
                "name": self.options.server_name,
                "version": self.options.server_version,
                "extensions": self.extensions(),
            }
        )

    async def live(self, request: web.Request) -> web.Response:
        """``GET /v2/health/live``: the process answers."""
        return _json({"live": True})

    def not_ready_reason(self) -> str | None:
        """Why the server is not ready (None: it is): draining, a listener down (with why),
        or the repository's reason."""
        if self.draining:
            return "the server is draining"
        if self.listeners_down:
            return "; ".join(self.listeners_down.values())
        return self.repository.not_ready_reason()

    def listener_changed(self, name: str, reason: str | None) -> None:
        """Record that listener ``name`` is down for ``reason`` (None: it is up again)."""
        if reason is None:
            self.listeners_down.pop(name, None)
        else:
            self.listeners_down[name] = reason

    async def ready(self, request: web.Request) -> web.Response:
        """``GET /v2/health/ready``: 200 while the server is ready, Triton's way (strict
        readiness, the default: every model that should be loaded is ready; otherwise: the
        server can serve), else 503 with the reason."""
        reason = self.not_ready_reason()
        if reason is None:
            return _json({"ready": True})
        return _json({"ready": False, "error": reason}, 503)

    def _entry(self, request: web.Request) -> ModelEntry:
        return self.entry(request.match_info["name"], request.match_info.get("version"))

    def entry(self, name: str, version: str | None = None) -> ModelEntry:
        """The model ``name`` (``version``: None or "" for the one served).

        Raises:
            UnknownModelError: no such model, or no such version of it (Triton's wording).
        """
        return self.repository.get(name, version)

    async def model_metadata(self, request: web.Request) -> web.Response:
        """``GET /v2/models/{name}``: inputs and outputs with protocol datatypes."""
        entry = self._entry(request)
        if entry.runner is None:
            raise HTTPError(503, f"model {entry.name!r} is not loaded", "not_ready")
        return _json(
            {
                "name": entry.name,
                "versions": self.repository.get(entry.name).served_versions(),
                "platform": "model-runtime",
                "inputs": [_tensor(s) for s in entry.inputs],
                "outputs": [_tensor(s) for s in entry.outputs],
            }
        )

    async def model_config(self, request: web.Request) -> web.Response:
        """``GET /v2/models/{name}/config``: what the model serves, as Triton's ``ModelConfig``
        in Triton's JSON (``tritonclient``'s ``get_model_config``, ``perf_analyzer``)."""
        return _json(config_json(served_config(self._entry(request))))

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
        runner = self.serving_runner(entry, request)
        out, json_length = await self.answer_infer(
            entry,
            runner,
            request.headers.get(HEADER_LENGTH),
            lambda: read_body(request, self.options.max_body_size, self.options.body_timeout),
        )
        if json_length is None:
            return web.Response(body=out, content_type="application/json")
        resp = web.Response(body=out, content_type="application/octet-stream")
        resp.headers[HEADER_LENGTH] = str(json_length)
        return resp

    # -- statistics, metrics, repository ---------------------------------------------------------

    async def stats(self, request: web.Request) -> web.Response:
        """``GET /v2/models/{name}/stats`` (or all models): the statistics extension."""
        entries = [self._entry(request)] if "name" in request.match_info else None
        entries = entries if entries is not None else self.repository.entries()
        stats = [await model_statistics(e, self.metrics) for e in entries]
        return _json({"model_stats": stats})

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
        """``POST /v2/repository/models/{name}/load``: load, or reload beside the serving
        version, with the body's ``config`` override if any (Triton's ``load_model(name,
        config=...)``). 503 when the model control mode forbids it; a failed load (an invalid
        override included) is 400 (503 when no device was free), ``failed to load '<name>':
        ...``, and a serving version serves on."""
        await control.load_model(self, request.match_info["name"], await request.read())
        return _json({})

    async def unload(self, request: web.Request) -> web.Response:
        """``POST /v2/repository/models/{name}/unload``: drains the model's in-flight requests
        (503 when the model control mode forbids it)."""
        await control.unload_model(self, request.match_info["name"])
        return _json({})


def _tensor(spec: Any) -> dict[str, Any]:
    return {"name": spec.name, "datatype": spec.datatype, "shape": list(spec.shape)}

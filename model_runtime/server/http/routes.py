"""HTTP routes of the Open Inference Protocol v2 (KServe v2) over aiohttp, each a call of the
data plane (:class:`~model_runtime.server.inference.plane.DataPlane`).

Every error is answered as ``{"error": "..."}`` with the status its cause calls for, in
Triton's words where Triton has them (:mod:`model_runtime.server.answers`): 400 bad request or
unknown model (``Request for unknown model: 'NAME' is not found``) or a body over the limit
(refused from ``Content-Length`` before a byte of it is read, or as soon as a chunked or
compressed body passes the limit), 404 unknown version of a known model or unknown route, 503
a load or unload the model control mode forbids (Triton's UNAVAILABLE), 500 device failure,
503 not ready / draining / stopped / queue full (with ``Retry-After``) / request timeout
expired (Triton's), 504 a run past its execution deadline,
408 a body that did not arrive within ``body_timeout``; shared memory errors as Triton answers
them (:data:`~model_runtime.server.answers.SHARED_MEMORY_ANSWERS`). Client disconnects cancel
the handler (``handler_cancellation``), which cancels the runner request.

Inference honours the request's parameters (:mod:`model_runtime.server.tensors.parameters`):
``timeout`` (microseconds) shortens the request's deadline and reaches the runner, which drops
the request before it reaches a device once it passed; ``priority`` (1 highest, 0 default)
becomes ``execute(priority=...)``
(:func:`~model_runtime.server.tensors.parameters.execute_priority`);
anything not supported is a 400 that names it. Request JSON goes through simdjson, numeric
tensor data straight into arrays (:mod:`model_runtime.server.tensors.jsontape`; orjson for what it
does not read), response JSON through orjson; bodies over 1 MiB are decoded and encoded off the
event loop. Every request is logged once
(:mod:`model_runtime.server.http.access`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from model_runtime.server.answers import HTTPError
from model_runtime.server.http.access import access_middleware
from model_runtime.server.http.admitting import admission_middleware
from model_runtime.server.http.body import read_body, refuse_head, too_large as body_too_large
from model_runtime.server.http.generate import GenerateRoutes
from model_runtime.server.http.observe_routes import ObserveRoutes
from model_runtime.server.http.shm_routes import SharedMemoryRoutes
from model_runtime.server.inference import control
from model_runtime.server.inference.plane import DataPlane
from model_runtime.server.observability.metrics import CONTENT_TYPE
from model_runtime.server.observability.stats import model_statistics
from model_runtime.server.repository.entries import ModelEntry
from model_runtime.server.security.restrict import Restrictions, http_middleware
from model_runtime.server.tensors.binary import HEADER_LENGTH
from model_runtime.server.triton.config import config_json, served_config

__all__ = ["HttpFrontEnd"]


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


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


class HttpFrontEnd:
    """The HTTP front end (aiohttp's routes) over a :class:`DataPlane`; ``restrictions``: the
    listener's restricted API groups (Triton's --http-restricted-api)."""

    def __init__(self, plane: DataPlane, restrictions: Restrictions | None = None) -> None:
        self.plane = plane
        self.options = plane.options
        self.restrictions = restrictions or Restrictions()
        #: Each route of :meth:`app` -> its API group (what the restrictions are checked by).
        self.route_groups: dict[web.AbstractRoute, str] = {}

    def app(self) -> web.Application:
        """The aiohttp application (``client_max_size`` enforces the body limit)."""
        access = access_middleware(enabled=self.options.access_log)
        # Restrictions first: a request of a restricted group without its header is refused
        # before admission, parsing or logging look at it.
        middlewares = [admission_middleware(self.plane.admission), access, self._middleware]
        if self.restrictions:  # nothing restricted: no check on the hot path
            restricted = http_middleware(self.restrictions, self.plane.restricted, self._group_of)
            middlewares.insert(0, restricted)
        app = web.Application(client_max_size=self.options.max_body_size, middlewares=middlewares)
        g, p = "GET", "POST"
        bases = ("/v2/models/{name}", "/v2/models/{name}/versions/{version}")
        # Each route with its API group (Triton's, see model_runtime.server.security.restrict).
        # Infer
        # first: aiohttp tries the routes under one prefix in the order they were added (a
        # regular expression each), and the hot path should not wait behind the others.
        routes: list[tuple[str, str, Handler, str]] = [
            (p, f"{b}/infer", self.infer, "inference") for b in bases
        ]
        routes += [
            (m, path, h, "inference") for m, path, h in GenerateRoutes(self.plane).routes(bases)
        ]
        routes += [
            (g, "/v2", self.server_metadata, "metadata"),
            (g, "/v2/health/live", self.live, "health"),
            (g, "/v2/health/ready", self.ready, "health"),
            (g, "/v2/models/stats", self.stats, "statistics"),
            (p, "/v2/repository/index", self.repository_index, "model-repository"),
            (p, "/v2/repository/models/{name}/load", self.load, "model-repository"),
            (p, "/v2/repository/models/{name}/unload", self.unload, "model-repository"),
        ]
        if self.options.metrics:
            routes.append((g, "/metrics", self.prometheus, "statistics"))
        routes += ObserveRoutes(self.plane).routes(bases)  # logging and trace extensions
        shm_routes = SharedMemoryRoutes(self.plane.shared_memory)
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

    def metrics_app(self) -> web.Application:
        """The metrics listener's application (Triton's metrics port): ``GET /metrics`` only,
        restricted as on the HTTP port (the ``statistics`` group)."""
        middlewares = [self._middleware]
        if self.restrictions:
            restricted = http_middleware(self.restrictions, self.plane.restricted, self._group_of)
            middlewares.insert(0, restricted)
        app = web.Application(middlewares=middlewares)
        route = app.router.add_route("GET", "/metrics", self.prometheus)
        self.route_groups[route] = "statistics"
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
            status, message, headers, close = self.plane.error_answer(exc, request.path)
            return _error(status, message, headers, close=close)

    # -- health and metadata ---------------------------------------------------------------------

    async def server_metadata(self, request: web.Request) -> web.Response:
        """``GET /v2``: server name, version and protocol extensions."""
        return _json(
            {
                "name": self.options.server_name,
                "version": self.options.server_version,
                "extensions": self.plane.extensions(),
            }
        )

    async def live(self, request: web.Request) -> web.Response:
        """``GET /v2/health/live``: the process answers."""
        return _json({"live": True})

    async def ready(self, request: web.Request) -> web.Response:
        """``GET /v2/health/ready``: 200 while the server is ready, Triton's way (strict
        readiness, the default: every model that should be loaded is ready; otherwise: the
        server can serve), else 503 with the reason."""
        reason = self.plane.not_ready_reason()
        if reason is None:
            return _json({"ready": True})
        return _json({"ready": False, "error": reason}, 503)

    def _entry(self, request: web.Request) -> ModelEntry:
        return self.plane.entry(request.match_info["name"], request.match_info.get("version"))

    async def model_metadata(self, request: web.Request) -> web.Response:
        """``GET /v2/models/{name}``: inputs and outputs with protocol datatypes."""
        entry = self._entry(request)
        if entry.runner is None:
            raise HTTPError(503, f"model {entry.name!r} is not loaded", "not_ready")
        return _json(
            {
                "name": entry.name,
                "versions": self.plane.repository.get(entry.name).served_versions(),
                "platform": entry.platform,
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
        if entry.is_ready and not self.plane.draining:
            return _json({"name": entry.name, "ready": True})
        runner = entry.runner
        states = [s.value for s in runner.replica_status()] if runner is not None else []
        why = "draining" if self.plane.draining else f"state {entry.state.value}, replicas {states}"
        return _json({"name": entry.name, "ready": False, "error": f"not ready: {why}"}, 503)

    # -- inference -------------------------------------------------------------------------------

    async def infer(self, request: web.Request) -> web.Response:
        """``POST /v2/models/{name}/infer``: JSON and binary tensors in, the same out."""
        entry = self._entry(request)
        refusal = refuse_head(request, self.options.max_body_size)
        runner = self.plane.serving_runner(entry, refusal)
        out, json_length = await self.plane.answer_infer(
            entry,
            runner,
            request.headers.get(HEADER_LENGTH),
            lambda: read_body(request, self.options.max_body_size, self.options.body_timeout),
            request.headers.get("traceparent"),
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
        entries = entries if entries is not None else self.plane.repository.entries()
        stats = [await model_statistics(e, self.plane.metrics) for e in entries]
        return _json({"model_stats": stats})

    async def prometheus(self, request: web.Request) -> web.Response:
        """``GET /metrics``: Prometheus text format."""
        metrics = self.plane.metrics
        await metrics.refresh(self.plane.repository)
        resp = web.Response(body=metrics.render())
        resp.headers["Content-Type"] = CONTENT_TYPE
        return resp

    async def repository_index(self, request: web.Request) -> web.Response:
        """``POST /v2/repository/index``: every model and its state; with a body of
        ``{"ready": true}``, only the models that are ready (as gRPC's ``ready`` field).

        Raises:
            HTTPError: a body that is not a JSON object with a boolean ``ready`` (400).
        """
        body = await request.read()
        ready = False
        if body.strip():
            try:
                doc = orjson.loads(body)
            except orjson.JSONDecodeError:
                doc = None
            if not isinstance(doc, dict) or not isinstance(doc.get("ready", False), bool):
                raise HTTPError(400, "Invalid value for 'ready': expected a boolean (the index "
                                "request must be a JSON object with a boolean 'ready')",
                                "bad_request")  # fmt: skip
            ready = doc.get("ready", False)
        index = self.plane.repository.index()
        return _json([m for m in index if m["state"] == "READY"] if ready else index)

    async def load(self, request: web.Request) -> web.Response:
        """``POST /v2/repository/models/{name}/load``: load, or reload beside the serving
        version, with the body's ``config`` override if any (Triton's ``load_model(name,
        config=...)``). 503 when the model control mode forbids it; a failed load (an invalid
        override included) is 400 (503 when no device was free), ``failed to load '<name>':
        ...``, and a serving version serves on."""
        await control.load_model(self.plane, request.match_info["name"], await request.read())
        return _json({})

    async def unload(self, request: web.Request) -> web.Response:
        """``POST /v2/repository/models/{name}/unload``: drains the model's in-flight requests
        (503 when the model control mode forbids it); ``{"parameters": {"unload_dependents":
        true}}``: an ensemble's composing models too."""
        body = await request.read()
        try:
            doc = orjson.loads(body) if body.strip() else {}
        except orjson.JSONDecodeError:
            raise HTTPError(400, "the unload request's body is not JSON", "bad_request") from None
        params = doc.get("parameters") if isinstance(doc, dict) else None
        dependents = isinstance(params, dict) and params.get("unload_dependents") is True
        await control.unload_model(self.plane, request.match_info["name"], dependents)
        return _json({})


def _tensor(spec: Any) -> dict[str, Any]:
    return {"name": spec.name, "datatype": spec.datatype, "shape": list(spec.shape)}

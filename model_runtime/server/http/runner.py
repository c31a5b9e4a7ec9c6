"""The daemon's aiohttp runner with each connection behind the guard: aiohttp's protocol for a
new connection wrapped in a :class:`~model_runtime.server.http.connection.GuardedConnection` of
the runner's :class:`~model_runtime.server.http.guard.ConnectionGuard` (see that module for the
limits it applies)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

from model_runtime.server.http.connection import AIOHTTP_STATE, GuardedConnection
from model_runtime.server.http.guard import ConnectionGuard, ConnectionLimits
from model_runtime.server.observability.ratelog import RateLimitedLog

__all__ = [
    "GuardedAppRunner",
    "QuietParseErrors",
    "SiteListener",
    "guarded",
    "runner_of",
    "start_site",
]


def guarded(guard: ConnectionGuard, inner: RequestHandler) -> asyncio.Protocol:
    """Put ``inner`` (aiohttp's protocol for a new connection) behind ``guard``."""
    if guard.head_admission is not None and not guard.state_checked:
        guard.state_checked = True
        missing = [name for name in AIOHTTP_STATE if not hasattr(inner, name)]
        if missing:  # another aiohttp: refusals go through its middleware, as before
            guard.head_admission = None
            RateLimitedLog("early_refusals_off")(aiohttp_lacks=missing)
    return GuardedConnection(guard, inner)


class _GuardedServer(web.Server):
    """aiohttp's server (the protocol factory) with its connections behind a guard."""

    guard: ConnectionGuard

    def __call__(self) -> Any:
        return guarded(self.guard, super().__call__())


class GuardedAppRunner(web.AppRunner):
    """An ``aiohttp.web.AppRunner`` whose connections are held to ``limits``.

    Use it where an ``AppRunner`` would be (then ``TCPSite``/``SockSite`` as usual). It adds
    its middleware to ``app`` (first, before the app's own), so build it before the app is
    frozen (before ``setup()``). ``keepalive_timeout`` comes from ``limits`` unless given.
    """

    def __init__(
        self, app: web.Application, *, limits: ConnectionLimits | None = None, **kwargs: Any
    ) -> None:
        self.guard = ConnectionGuard(limits or ConnectionLimits())
        kwargs.setdefault("keepalive_timeout", self.guard.limits.keepalive_timeout)
        super().__init__(app, **kwargs)
        app.middlewares.insert(0, self.guard.middleware)

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        # aiohttp builds its Server inside Application._make_handler; the only change made
        # here is the protocol factory (__call__), so the instance is specialised in place.
        server.__class__ = _GuardedServer
        assert isinstance(server, _GuardedServer)
        server.guard = self.guard
        QuietParseErrors.install()
        return server


class QuietParseErrors(logging.Filter):
    """Turns aiohttp's traceback for a request it could not parse (a malformed request line,
    TLS or HTTP/2 sent to the HTTP port) into one rate-limited warning, ``bad_http_request``;
    the client still gets aiohttp's 400."""

    _log = RateLimitedLog("bad_http_request")

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError):
            return True
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        self._log(error=first_line[:200])
        return False

    @classmethod
    def install(cls) -> None:
        """Add the filter to aiohttp's server logger, once per process."""
        logger = logging.getLogger("aiohttp.server")
        if not any(isinstance(f, cls) for f in logger.filters):
            logger.addFilter(cls())


class SiteListener:
    """A started HTTP site as the daemon's listener supervision sees it
    (:class:`~model_runtime.server.daemon.listeners.SupervisedListener`): it ends when its
    server is closed (on purpose or not), and stops by leaving its runner."""

    def __init__(self, site: web.TCPSite) -> None:
        self.site = site

    async def wait_for_termination(self) -> None:
        """Return once the site's server is closed (its connections gone)."""
        server = self.site._server  # aiohttp's asyncio (or uvloop) Server
        if server is not None:
            await asyncio.shield(server.wait_closed())

    async def stop(self, grace: float | None) -> None:
        """Stop the site (its runner's shutdown covers the connections' grace)."""
        await self.site.stop()


def runner_of(app: web.Application) -> web.AppRunner:
    """A plain runner for a side listener's ``app`` (the metrics port): no guard, no access
    log."""
    return web.AppRunner(app, access_log=None)


async def start_site(
    runner: web.AppRunner, host: str, port: int, **kwargs: Any
) -> tuple[SiteListener, int]:
    """Start an HTTP site of ``runner`` on ``host:port`` (0: a free port; ``kwargs`` as
    ``TCPSite``'s); return it and the port it is bound to.

    Raises:
        OSError: the address cannot be bound.
    """
    site = web.TCPSite(runner, host, port, **kwargs)
    await site.start()
    server: Any = site._server
    sockets = server.sockets if server is not None else ()
    bound = next((s.getsockname()[1] for s in sockets), port)
    return SiteListener(site), int(bound)

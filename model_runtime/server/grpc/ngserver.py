"""The gRPC listener on libnghttp2 (:mod:`.h2proto`), on the daemon's event loop.

The same service and limits as the h2corn listener (:mod:`.h2server`): :class:`~.native.GrpcApp`
serves every method; ``max_connections`` open connections (a connection past it is closed at
once), ``max_streams`` concurrent streams per connection (SETTINGS_MAX_CONCURRENT_STREAMS),
idle connections closed after ``idle_timeout``, an answer held behind a closed flow-control
window past ``write_timeout`` resets its stream. TLS from the daemon's files (ALPN ``h2``;
mutual TLS: a client certificate the root signed is required).
"""

from __future__ import annotations

import asyncio
from typing import Any

from model_runtime.server.grpc.budget import CallBudget
from model_runtime.server.grpc.call import OK, START_HEADERS
from model_runtime.server.grpc.h2proto import H2Protocol, ProtocolLimits
from model_runtime.server.grpc.h2stream import cache_headers
from model_runtime.server.grpc.listensock import ListenerSettings, listening_socket
from model_runtime.server.grpc.native import GrpcApp
from model_runtime.server.grpc.shares import Shares
from model_runtime.server.grpc.unary import UnaryInfer
from model_runtime.server.inference.plane import DataPlane
from model_runtime.server.security.tls import ssl_context

__all__ = ["NgListener", "start_nghttp2_listener"]

cache_headers(START_HEADERS, status=True)
cache_headers(OK, status=False)


class NgListener:
    """A started nghttp2 listener: the daemon's :class:`~..daemon.listeners.Listening`."""

    def __init__(self, server: asyncio.base_events.Server, limits: ProtocolLimits,
                 app: GrpcApp) -> None:  # fmt: skip
        self._server = server
        self._limits = limits
        self._stopped = asyncio.get_running_loop().create_future()
        self.app = app
        self.budget: CallBudget | None = None

    async def wait_for_termination(self) -> None:
        """Return when the listener is stopped."""
        await asyncio.shield(self._stopped)

    async def stop(self, grace: float | None) -> None:
        """Stop accepting; each connection is told (GOAWAY), its calls in flight get ``grace``
        seconds, then the connections close."""
        if self._stopped.done():
            return
        self._server.close()
        connections = list(self._limits.connections)
        for conn in connections:
            conn.goaway()
        tasks = [
            s.task for c in connections for s in c.streams.values()
            if s.task is not None and not s.task.done()
        ]  # fmt: skip
        if tasks and grace:
            await asyncio.wait(tasks, timeout=grace)
        for conn in list(self._limits.connections):
            conn.flush()
            if conn.transport is not None:
                conn.transport.close()
        self._stopped.set_result(None)


async def start_nghttp2_listener(
    handlers: dict[str, Any], settings: ListenerSettings, plane: DataPlane | None = None
) -> tuple[NgListener, int]:
    """Serve ``handlers`` (grpc's method handlers by name) as ``settings`` say; return the
    listener and its bound port. ``plane``: where ``ModelInfer`` calls whose request comes in
    one read are answered by callbacks (:class:`~.unary.UnaryInfer`; None: the app serves
    every call).

    Raises:
        OSError: the address cannot be bound, or the TLS files cannot be used.
    """
    s = settings
    shares = Shares(max_streams=s.max_streams, write_timeout=s.write_timeout)
    app = GrpcApp(
        handlers,
        max_message_size=s.max_message_size,
        restrictions=s.restrictions,
        counter=s.counter,
        budget=s.budget,
        shares=shares,
    )
    fast = None
    if plane is not None:
        fast = UnaryInfer(
            plane, max_message_size=s.max_message_size, shares=shares, budget=s.budget,
            restrictions=s.restrictions,
        )  # fmt: skip
    limits = ProtocolLimits(
        app, max_streams=s.max_streams, idle_timeout=s.idle_timeout,
        write_timeout=s.write_timeout, max_connections=s.max_connections, fast=fast,
    )  # fmt: skip
    context = None
    if s.tls is not None:
        try:
            context = ssl_context(s.tls)
        except Exception as exc:
            raise OSError(f"cannot serve gRPC over TLS: {exc}") from exc
        context.set_alpn_protocols(["h2"])
    sock = listening_socket(s.host, s.port, s.reuse_port, s.backlog)
    try:
        server = await asyncio.get_running_loop().create_server(
            lambda: H2Protocol(limits), sock=sock, ssl=context, backlog=s.backlog
        )
    except Exception:
        sock.close()
        raise
    return NgListener(server, limits, app), int(sock.getsockname()[1])

"""The daemon's listeners, supervised: a listener (the gRPC server, the HTTP site) that stops on
its own is started again.

grpc.aio ends its server when its accept loop fails, and nothing in the daemon would notice:
the port refuses connections while HTTP goes on answering (an HTTP site's server may be closed
under it too). :class:`SupervisedListener` owns one server at a time. Its :meth:`run` waits for
the server to end; an end it did not ask for (:meth:`stop`) is reported down with its reason
(``on_change(reason)``: readiness says not ready with it), and the server is started again on
the same port after a backoff (0.05 s, doubling to 5 s while starts fail; reset once a server
runs for ``healthy_after`` seconds), then reported up (``on_change(None)``). Restarts are
permanent-child restarts in the supervisor's vocabulary: no intensity limit gives up on a
listener, since the rest of the daemon serves meanwhile; each is logged and counted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import structlog

log = structlog.get_logger(__name__)

__all__ = ["SupervisedListener"]


class Listening(Protocol):
    """A started listener: a grpc.aio server, or an HTTP site
    (:class:`~model_runtime.server.http.runner.SiteListener`)."""

    async def wait_for_termination(self) -> Any: ...
    async def stop(self, grace: float | None) -> Any: ...


#: ``start(port)``: a started listener bound to ``port`` (0: any) and its bound port.
StartServer = Callable[[int], Awaitable[tuple[Listening, int]]]


class SupervisedListener:
    """One listener, restarted when it stops on its own (see the module docstring); ``name``
    says which in its logs and readiness reason (``gRPC``, ``HTTP``)."""

    def __init__(
        self,
        start: StartServer,
        on_change: Callable[[str | None], None] = lambda reason: None,
        *,
        name: str = "gRPC",
        first_backoff: float = 0.05,
        max_backoff: float = 5.0,
        healthy_after: float = 10.0,
    ) -> None:
        self._start = start
        self.name = name
        self._on_change = on_change
        self._first_backoff = first_backoff
        self._max_backoff = max_backoff
        self._healthy_after = healthy_after
        self.server: Any = None
        self.port = 0
        self.restarts = 0
        self._stopping = False
        self._task: asyncio.Task[None] | None = None

    async def start(self, port: int) -> int:
        """Start the first server (on ``port``; 0: any) and its supervision; return the port.

        Raises:
            OSError: the address cannot be bound.
        """
        self.server, self.port = await self._start(port)
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"{self.name}-listener"
        )
        return self.port

    async def stop(self, grace: float | None) -> None:
        """Stop supervising, then the server (calls in flight get ``grace`` seconds)."""
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        if self.server is not None:
            await self.server.stop(grace)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        backoff = self._first_backoff
        while not self._stopping:
            began = loop.time()
            reason = await _ended(self.server)
            if self._stopping:
                return
            if loop.time() - began >= self._healthy_after:
                backoff = self._first_backoff
            self._on_change(f"the {self.name} listener stopped ({reason}); restarting")
            log.error("listener_stopped", listener=self.name, reason=reason, port=self.port)
            while not self._stopping:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._max_backoff)
                try:
                    self.server, _ = await self._start(self.port)
                    break
                except OSError as exc:
                    reason = f"cannot bind: {exc}"
                    self._on_change(f"the {self.name} listener stopped ({reason}); restarting")
            if self._stopping:
                return
            self.restarts += 1
            log.warning(
                "listener_restarted", listener=self.name, port=self.port, restarts=self.restarts
            )
            self._on_change(None)


async def _ended(server: Any) -> str:
    """Wait until ``server`` ends; why it did. Cancelling the wait leaves the server be
    (grpc.aio's own wait would cancel the future its shutdown waits on)."""
    waiting = asyncio.ensure_future(_termination(server))
    return await asyncio.shield(waiting)


async def _termination(server: Any) -> str:
    try:
        await server.wait_for_termination()
    except Exception as exc:  # grpc.aio re-raises whatever ended its loop
        return f"{type(exc).__name__}: {exc}"
    return "its server ended"

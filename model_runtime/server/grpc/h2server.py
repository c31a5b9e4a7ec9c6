"""The gRPC listener on h2corn, a native HTTP/2 server that runs on the daemon's event loop.

h2corn (Rust: HTTP/2, HPACK, TLS, flow control and their flood limits) hands each stream to
:class:`~.native.GrpcApp` as an ASGI call. The listener's limits, as grpc.aio's:
``max_connections`` open connections, ``max_streams`` concurrent streams per connection, idle
connections closed after ``idle_timeout``, an answer held behind a closed flow-control window
for ``write_timeout`` seconds ends its stream (h2corn's response-stall timeout),
:class:`~.budget.CallBudget` over the unary calls, and :class:`~.shares.Shares` (each
connection's calls open, its refusals held back while others are open). TLS from the
daemon's files (mutual TLS: a client certificate the root signed is required).
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import h2corn

from model_runtime.server.grpc.budget import CallBudget
from model_runtime.server.grpc.listensock import ListenerSettings, listening_socket
from model_runtime.server.grpc.native import GrpcApp
from model_runtime.server.grpc.shares import Shares
from model_runtime.server.security.tls import TLSFiles

__all__ = ["H2Listener", "start_h2_listener"]


class H2Listener:
    """A started h2corn server: the daemon's :class:`~..daemon.listeners.Listening`."""

    def __init__(
        self, server: Any, task: asyncio.Task[None], app: GrpcApp, sock: socket.socket
    ) -> None:
        self._server = server
        self._task = task
        self._sock = sock
        task.add_done_callback(lambda _: sock.close())
        self.app = app
        self.budget: CallBudget | None = None

    async def wait_for_termination(self) -> None:
        """Return when the server ends (raises what ended it, if it failed)."""
        await asyncio.shield(self._task)

    async def stop(self, grace: float | None) -> None:
        """Stop accepting; calls in flight get the server's graceful budget, then end."""
        if self._task.done():
            return
        self._server.shutdown()
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout=(grace or 0) * 2 + 1)
        except TimeoutError:
            self._task.cancel()
        except Exception:
            return


async def start_h2_listener(
    handlers: dict[str, Any], settings: ListenerSettings
) -> tuple[H2Listener, int]:
    """Serve ``handlers`` (grpc's method handlers by name) as ``settings`` say; return the
    listener and its bound port.

    Raises:
        OSError: the address cannot be bound, or the TLS files cannot be used.
    """
    s = settings
    app = GrpcApp(
        handlers,
        max_message_size=s.max_message_size,
        restrictions=s.restrictions,
        counter=s.counter,
        budget=s.budget,
        shares=Shares(max_streams=s.max_streams, write_timeout=s.write_timeout),
    )
    host, port = s.host, s.port
    bind = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    sock = listening_socket(host, port, s.reuse_port, s.backlog)
    config = h2corn.Config(
        bind=(f"fd://{sock.fileno()}",),
        grpc=True,
        http1=False,
        lifespan="off",
        access_log=False,
        log_format="json",  # its one start-up line in the daemon's encoding
        date_header=False,
        max_concurrent_streams=s.max_streams,
        timeout_keep_alive=s.idle_timeout,
        h2_timeout_response_stall=s.write_timeout,
        limit_connections=s.max_connections,
        timeout_graceful_shutdown=1.0,
        runtime_threads=1,
        **_tls_options(s.tls),
    )
    server = h2corn.Server(app, config)  # type: ignore[arg-type]  # ASGI's dicts, untyped
    task = asyncio.get_running_loop().create_task(server.serve(), name="grpc-h2corn")
    try:
        await server.wait_started()
    except Exception as exc:
        task.cancel()
        sock.close()
        raise OSError(f"cannot serve gRPC on {bind}: {exc}") from exc
    return H2Listener(server, task, app, sock), int(sock.getsockname()[1])


def _tls_options(tls: TLSFiles | None) -> dict[str, Any]:
    if tls is None:
        return {}
    options: dict[str, Any] = {"certfile": tls.cert, "keyfile": tls.key}
    if tls.root is not None:
        options["ca_certs"] = tls.root
    if tls.mutual:
        options["cert_reqs"] = "required"
    return options

"""What the gRPC listeners of both native transports (h2corn, nghttp2) share: the settings
they are started with and their listening socket."""

from __future__ import annotations

import socket
from dataclasses import dataclass

from model_runtime.server.grpc.budget import CallBudget
from model_runtime.server.security.restrict import RestrictionCounter, Restrictions
from model_runtime.server.security.tls import TLSFiles

__all__ = ["ListenerSettings", "listening_socket"]


@dataclass(frozen=True, slots=True)
class ListenerSettings:
    """Where a gRPC listener listens and its limits, built once by the daemon's wiring
    (:func:`~.server.start_native_grpc_server`) for whichever transport serves."""

    host: str
    #: 0: a free one (the listener says which it bound).
    port: int
    #: The largest message a call may send or be answered with, compressed or inflated.
    max_message_size: int
    #: A connection without calls for this long is closed.
    idle_timeout: float
    #: Concurrent streams per connection (SETTINGS_MAX_CONCURRENT_STREAMS).
    max_streams: int
    #: An answer held behind a closed flow-control window this long ends its stream.
    write_timeout: float
    #: Open connections (one past it is closed at once).
    max_connections: int
    restrictions: Restrictions | None = None
    counter: RestrictionCounter | None = None
    #: The listener's TLS files (None: plaintext).
    tls: TLSFiles | None = None
    reuse_port: bool = False
    backlog: int = 2048
    #: The unary calls' budget (big messages are counted before they are read).
    budget: CallBudget | None = None


def listening_socket(host: str, port: int, reuse_port: bool, backlog: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` whose connections have Nagle's algorithm off
    (Linux's accepted sockets inherit TCP_NODELAY): an answer's frames go out as written, not
    held until the client acknowledges the previous segment.

    Raises:
        OSError: the address cannot be bound.
    """
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind(address)
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock

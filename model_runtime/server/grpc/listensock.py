"""The gRPC listeners' socket, shared by both native transports (h2corn, nghttp2)."""

from __future__ import annotations

import socket

__all__ = ["listening_socket"]


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

"""One gRPC call on a native transport, as its handler and its transport see it.

:class:`NativeContext` stands in for grpc.aio's context (``abort``, ``time_remaining``,
``peer``, ``invocation_metadata``); :class:`StreamExtension` is what a transport may offer a
call besides ASGI's events (a unary answer in one step); and the constants every answered call
sends (:data:`START_HEADERS`, :data:`OK`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, Protocol

import grpc

from model_runtime.server.grpc.framing import ACCEPT_ENCODING, GrpcAbort, status_trailers
from model_runtime.server.grpc.shares import Connection

__all__ = [
    "GRPC",
    "OK",
    "SERVICE_PATH",
    "START_HEADERS",
    "STREAM_EXTENSION",
    "NativeContext",
    "Send",
    "StreamExtension",
    "header_of",
]

#: The ``:path`` prefix of Triton's service.
SERVICE_PATH = b"/inference.GRPCInferenceService/"
#: gRPC's content type (a request's may have a ``+proto`` suffix).
GRPC = b"application/grpc"
#: The headers of every answer with messages, and the trailers of every call that succeeds
#: (lists the process keeps: the nghttp2 transport caches their header arrays).
START_HEADERS = [(b"content-type", GRPC), (b"grpc-accept-encoding", ACCEPT_ENCODING)]
OK = status_trailers(grpc.StatusCode.OK)


class NativeContext:
    """What a handler may ask of its call (grpc.aio's ``ServicerContext``, the part used)."""

    __slots__ = (
        "_conn",
        "_deadline",
        "_headers",
        "_loop",
        "_peer",
        "message_bytes",
        "raw_inputs",
        "shed",
    )

    def __init__(
        self,
        peer: str,
        headers: list[tuple[bytes, bytes]],
        deadline: float | None,
        loop: asyncio.AbstractEventLoop,
        conn: Connection | None = None,
    ) -> None:
        self._peer = peer
        self._headers = headers
        self._deadline = deadline
        self._loop = loop
        self._conn = conn
        #: The request's bytes the call budget is to count (0: the transport counts them).
        self.message_bytes = 0
        #: A big ModelInfer request's raw input contents, as views of the received message
        #: (its ``raw_input_contents`` is then empty: :mod:`.rawsplit`); None: in the message.
        self.raw_inputs: list[memoryview] | None = None
        #: The call was refused by admission (load shed): its refusal may be held back.
        self.shed = False

    def mark_shed(self) -> None:
        """Admission refused this call to shed load (not a queue policy's answer, which is
        sent when due)."""
        self.shed = True

    def connection_calls(self) -> int:
        """The calls open on this call's connection, this one included (1: unknown)."""
        return 1 if self._conn is None else self._conn.open

    def peer(self) -> str:
        """The client's address (``ipv4:HOST:PORT``): one connection's calls share it."""
        return self._peer

    def time_remaining(self) -> float | None:
        """Seconds left before the call's deadline (None: no deadline)."""
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - self._loop.time())

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        """The call's metadata (its headers but HTTP/2's and gRPC's own)."""
        return tuple(
            (k.decode("latin-1"), v.decode("latin-1"))
            for k, v in self._headers
            if not k.startswith((b":", b"grpc-")) and k not in (b"content-type", b"te")
        )

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn:
        """End the call with ``code`` and ``details``.

        Raises:
            GrpcAbort: always (the transport answers it).
        """
        raise GrpcAbort(code, details)


Send = Callable[[dict[str, Any]], Awaitable[None]]

#: The scope's ``extensions`` key of a transport's :class:`StreamExtension`.
STREAM_EXTENSION = "model_runtime.grpc_stream"


class StreamExtension(Protocol):
    """What a transport may offer a call besides ASGI's events (:mod:`.h2proto` does): a
    unary answer in one step, and word of the stream's end without waiting for it."""

    def answer(
        self, headers: list[tuple[bytes, bytes]], body: bytes, trailers: list[tuple[bytes, bytes]]
    ) -> bool:
        """Send the whole answer; False: the stream is closed."""

    def on_end(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the stream has ended (at once if it has), within the write
        timeout of its answer."""


def header_of(headers: list[tuple[bytes, bytes]]) -> Callable[[str], str | None]:
    """A reader of ``headers``' values by name (``None``: absent), as
    :func:`~model_runtime.server.security.restrict.grpc_refusal` asks."""

    def get(name: str) -> str | None:
        key = name.encode("latin-1")
        for k, v in headers:
            if k == key:
                return v.decode("latin-1")
        return None

    return get

"""One HTTP/2 stream of the nghttp2 gRPC transport (:mod:`.h2proto`): a call's request as
received and its answer as sent, with the ASGI ``receive``/``send`` GrpcApp is driven by and the
:class:`~.call.StreamExtension` shortcut; and the ``nghttp2_nv`` header arrays answers need.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from model_runtime.server.grpc import nghttp2 as ng
from model_runtime.server.grpc.nghttp2 import ffi

if TYPE_CHECKING:
    from model_runtime.server.grpc.h2blocks import Block

__all__ = ["HIGH_WATER", "H2Stream", "StreamOwner", "cache_headers", "headers_nv", "trailers_nv"]

log = structlog.get_logger(__name__)

#: A streaming answer's unsent bytes past this make its ``send`` wait for the client to read.
HIGH_WATER = 1 << 20
_DISCONNECT = {"type": "http.disconnect"}


class StreamOwner(Protocol):
    """What a stream asks of its connection (:class:`~.h2proto.H2Protocol`)."""

    loop: asyncio.AbstractEventLoop
    session: Any
    write_timeout: float

    def consume(self, stream: H2Stream, size: int) -> None:
        """The app took ``size`` bytes of ``stream``'s body."""

    def submit(self, stream: H2Stream, flush: bool = True) -> None:
        """``stream`` has more of its answer to send (``flush``: written this turn)."""

    def answer_ready(self) -> None:
        """An answer was submitted: write it now or with this turn's others."""

    def reset(self, stream_id: int, code: int) -> None:
        """Reset a stream."""

    def flush(self) -> None:
        """Write what the session has to send."""

    def want_flush(self) -> None:
        """Write what the session has to send, once this turn of the loop is done."""


def _nv_array(pairs: list[tuple[bytes, bytes]], flags: int = 0) -> tuple[Any, int, list[Any]]:
    """An ``nghttp2_nv`` array of ``pairs``, its length, and the buffers it points into (keep
    them alive while it is used; with ``flags`` :data:`~.nghttp2.NV_FLAG_NO_COPY`, as long as
    nghttp2 may send what it was submitted with)."""
    arr = ffi.new("nghttp2_nv[]", len(pairs))
    keep = [arr]
    for i, (name, value) in enumerate(pairs):
        n, v = ffi.new("uint8_t[]", name), ffi.new("uint8_t[]", value)
        keep += (n, v)
        nv = arr[i]
        nv.name, nv.namelen, nv.value, nv.valuelen, nv.flags = n, len(name), v, len(value), flags
    return arr, len(pairs), keep


class H2Stream:
    """One call: its request as received, its answer as sent."""

    __slots__ = ("block", "chunks", "closed", "conn", "drained", "end_told", "ended", "ended_call",
                 "expect_trailers", "finished", "finished_at", "headers", "id", "length",
                 "opened", "out", "out_len", "path", "received", "start", "status", "submitted",
                 "task", "trailers", "unconsumed", "wait", "waiter")  # fmt: skip

    def __init__(self, conn: StreamOwner, stream_id: int, opened: float = 0.0) -> None:
        self.conn = conn
        self.id = stream_id
        #: When its headers came (the loop's clock, as of the read that brought them).
        self.opened = opened
        #: Where its call is: not started (0), or :data:`~.h2proto.STARTED` and the like.
        self.wait = 0
        #: Its headers but pseudo-headers (shared with the other streams of the same block:
        #: read only), and its ``:path``.
        self.headers: list[tuple[bytes, bytes]] = []
        self.path = b""
        #: The decoded header block it came with (None: none), whose ``note`` its call keeps.
        self.block: Block | None = None
        self.chunks: deque[bytes] = deque()
        self.unconsumed = 0
        #: Its request's ``content-length`` (None: none), and the body's bytes received.
        self.length: int | None = None
        self.received = 0
        self.ended = self.end_told = self.closed = False
        self.waiter: asyncio.Future[None] | None = None
        #: The call's task, or the future of its outputs (:mod:`.unary`): cancelled when the
        #: stream closes unanswered.
        self.task: asyncio.Future[Any] | None = None
        self.status = 200
        self.start: list[tuple[bytes, bytes]] | None = None
        self.out: deque[bytes] = deque()
        self.out_len = 0
        self.submitted = self.finished = self.expect_trailers = False
        self.finished_at = 0.0
        self.trailers: list[tuple[bytes, bytes]] | None = None
        self.drained: asyncio.Future[None] | None = None
        self.ended_call: Callable[[], None] | None = None

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def receive(self) -> dict[str, Any]:
        """The next chunk of the request body (ASGI ``http.request``), or ``http.disconnect``
        once the stream ended."""
        while True:
            chunks = self.chunks
            if chunks:
                chunk = chunks.popleft()
                self.conn.consume(self, len(chunk))
                more = bool(chunks) or not self.ended
                self.end_told = not more
                return {"type": "http.request", "body": chunk, "more_body": more}
            if self.closed:
                return _DISCONNECT
            if self.ended and not self.end_told:
                self.end_told = True
                return {"type": "http.request", "body": b"", "more_body": False}
            self.waiter = self.conn.loop.create_future()
            await self.waiter

    async def send(self, event: dict[str, Any]) -> None:
        """Send an ASGI response event on the stream.

        Raises:
            ConnectionError: the stream or its connection is closed.
        """
        conn = self.conn
        if self.closed or conn.session is None:
            raise ConnectionError("the stream is closed")
        kind = event["type"]
        if kind == "http.response.body":
            body = event.get("body", b"")
            if body:
                self.out.append(body)
                self.out_len += len(body)
            if not event.get("more_body", False) and not self.expect_trailers:
                self._finish(None)
            elif body:
                conn.submit(self)
            if self.out_len > HIGH_WATER:
                await self._drain()
        elif kind == "http.response.start":
            self.status = event["status"]
            self.start = event["headers"]
            self.expect_trailers = bool(event.get("trailers"))
        elif kind == "http.response.trailers":
            self._finish(event["headers"])

    def task_done(self, task: asyncio.Task[None]) -> None:
        """The call's task ended: a stream it left unanswered is reset."""
        if not task.cancelled() and task.exception() is not None:
            log.error("grpc_stream_failed", exc_info=task.exception())
        if not self.closed and not self.finished:
            self.conn.reset(self.id, ng.INTERNAL_ERROR)

    def answer(
        self,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        trailers: list[tuple[bytes, bytes]],
        now: bool = True,
    ) -> bool:
        """Send a whole answer (200, ``headers``, ``body``, ``trailers``), written at once
        (``now``; else with the other answers of this turn of the loop); False: the stream is
        closed (:class:`~.call.StreamExtension`). An empty ``body`` with ``grpc-status``
        among ``headers`` is gRPC's trailers-only answer (one HEADERS frame)."""
        if self.closed or self.conn.session is None:
            return False
        self.start = headers
        if body:
            self.out.append(body)
            self.out_len += len(body)
        self._finish(trailers, flush=False)
        if now:
            self.conn.flush()  # written now, not after the loop's other ready callbacks
        else:
            self.conn.answer_ready()
        return True

    def on_end(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the stream has ended (at once if it has)."""
        if self.closed:
            callback()
        else:
            self.ended_call = callback

    def _finish(self, trailers: list[tuple[bytes, bytes]] | None, flush: bool = True) -> None:
        if self.finished:
            return
        self.finished = True
        self.trailers = trailers
        self.finished_at = self.conn.loop.time()
        self.conn.submit(self, flush=flush)

    async def _drain(self) -> None:
        """Wait until the client read enough of this stream's answer.

        Raises:
            ConnectionError: it did not within the write timeout (the stream is reset).
        """
        conn = self.conn
        self.drained = conn.loop.create_future()
        try:
            async with asyncio.timeout(conn.write_timeout):
                await self.drained
        except TimeoutError:
            conn.reset(self.id, ng.CANCEL)
            raise ConnectionError("the client did not read the answer in time") from None
        if self.closed:
            raise ConnectionError("the stream is closed")


def headers_nv(status: int, pairs: list[tuple[bytes, bytes]]) -> tuple[Any, int, list[Any]]:
    if status == 200:
        cached = _CACHE.get((id(pairs), True))
        if cached is not None and cached[0] is pairs:
            return cached[1]
    return _nv_array([(b":status", str(status).encode()), *pairs])


def trailers_nv(pairs: list[tuple[bytes, bytes]]) -> tuple[Any, int, list[Any]]:
    cached = _CACHE.get((id(pairs), False))
    if cached is not None and cached[0] is pairs:
        return cached[1]
    return _nv_array(pairs)


#: nv arrays of header lists that live as long as the process (the hot path's constants):
#: by the list's id, with the list (an id is only reused once its list is gone).
_CACHE: dict[tuple[int, bool], tuple[list[tuple[bytes, bytes]], tuple[Any, int, list[Any]]]] = {}


def cache_headers(pairs: list[tuple[bytes, bytes]], *, status: bool) -> None:
    """Build the nv array of ``pairs`` (response headers after ``:status 200`` if ``status``,
    else trailers) once: ``pairs`` must live as long as the process, unchanged."""
    listed = [(b":status", b"200"), *pairs] if status else pairs
    # nghttp2 need not copy them at each submission: they live as long as the process.
    _CACHE[id(pairs), status] = (pairs, _nv_array(listed, ng.NV_FLAG_NO_COPY))

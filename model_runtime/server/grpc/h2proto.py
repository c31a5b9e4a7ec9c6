"""One HTTP/2 connection of the gRPC listener on libnghttp2 (:mod:`.nghttp2`), on the event loop.

:class:`H2Protocol` is an ``asyncio.Protocol``: each read goes through
``nghttp2_session_mem_recv`` whole; the calls whose headers it completed are then started, each
as a task of the ASGI app (:class:`~.native.GrpcApp`, the contract h2corn gives it: ``receive``
yields the request body's chunks then ``http.disconnect`` once the stream ends; ``send`` takes
``http.response.start``/``body``/``trailers``). What is sent goes out drained from
``nghttp2_session_mem_send`` into one ``transport.write``: with the read's own write for what
the read's calls submit (an answer made in place among them), at once for an answer made later
on a connection with no other stream open, else once per loop turn (answers made together
share a write).

Promises: flow control follows the app's reads (a chunk's window is given back when the app
takes it, so a message the app refuses is never buffered past one window); a stream the client
resets, or a connection it closes, cancels the call's task; an answer that waits behind a
closed window past ``write_timeout`` resets its stream; a connection without calls for
``idle_timeout`` is closed (GOAWAY first); a header block past :data:`MAX_HEADER_LIST` resets
its stream and ends the connection (GOAWAY: its open calls go on); header blocks are read by
:mod:`.h2blocks` from the bytes nghttp2 is given, not by a callback per header. Rapid reset
(CVE-2023-44487): a client's resets of streams it opened less than :data:`RESET_GRACE` before
are counted in a token bucket (:data:`RESET_BURST`, refilled at :data:`RESET_RATE` a second);
past it the connection is ended (GOAWAY ENHANCE_YOUR_CALM). A reset of an older stream costs
nothing: such a stream held one of the connection's ``max_streams`` for that long, so the
concurrency limit bounds them, and a client that cancels many calls at once (its deadline
passed) keeps its connection. nghttp2's own limits stay on:
its reset limit (a backstop far above ours), PING/SETTINGS floods (outbound ACKs capped),
CONTINUATION floods.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, cast

from model_runtime.server.grpc import h2callbacks as callbacks, nghttp2 as ng
from model_runtime.server.grpc.call import STREAM_EXTENSION
from model_runtime.server.grpc.h2blocks import (
    LOST,
    MAX_CONTINUATIONS,
    MAX_HEADER_LIST,
    HeaderBlocks,
)
from model_runtime.server.grpc.h2callbacks import STARTED, WAITING, FastCalls
from model_runtime.server.grpc.h2stream import H2Stream, headers_nv
from model_runtime.server.grpc.nghttp2 import ffi, lib

unpack = ffi._backend.unpack  # ffi.unpack without its Python wrapper

__all__ = ["MAX_HEADER_LIST", "H2Protocol", "ProtocolLimits"]


App = Callable[[dict[str, Any], Any, Any], Coroutine[Any, Any, None]]


#: Each stream's receive window, and the connection's: what a client may send unread.
STREAM_WINDOW = 1 << 20
CONNECTION_WINDOW = 8 << 20
#: Resets of young streams a client may send at once, and a second after (more: its
#: connection is ended); a stream is young until it has been open RESET_GRACE seconds.
RESET_BURST, RESET_RATE, RESET_GRACE = 100, 33.0, 0.1
#: nghttp2's own reset limit (every reset counts): a backstop behind ours.
NGHTTP2_RESET_BURST, NGHTTP2_RESET_RATE = 10_000, 1_000


class ProtocolLimits:
    """What every connection of a listener shares: the app, its limits, the open connections."""

    __slots__ = ("app", "connections", "fast", "idle_timeout", "max_connections",
                 "max_streams", "write_timeout")  # fmt: skip

    def __init__(
        self, app: App, *, max_streams: int, idle_timeout: float, write_timeout: float,
        max_connections: int, fast: FastCalls | None = None,
    ) -> None:  # fmt: skip
        self.app = app
        self.fast = fast
        self.max_streams = max_streams
        self.idle_timeout = idle_timeout
        self.write_timeout = write_timeout
        self.max_connections = max_connections
        self.connections: set[H2Protocol] = set()


class H2Protocol(asyncio.Protocol):
    """One client connection (see the module docstring)."""

    def __init__(self, limits: ProtocolLimits) -> None:
        self.limits = limits
        self.write_timeout = limits.write_timeout
        self.loop = asyncio.get_running_loop()
        self.session: Any = None
        self.streams: dict[int, H2Stream] = {}
        #: The request header blocks and stream ends and resets, read from the bytes nghttp2
        #: is given (:mod:`.h2blocks`), and the requests nghttp2 refused in this read.
        self.header_blocks = HeaderBlocks()
        self.blocks = self.header_blocks.blocks
        self.resets = self.header_blocks.resets
        self.invalid: set[int] = set()
        self.transport: asyncio.Transport | None = None
        self.peer: tuple[str, int] | None = None
        self.fast = limits.fast
        #: The peer as gRPC names it (``ipv4:HOST:PORT``).
        self.grpc_peer = "unknown"
        self.ready: list[H2Stream] = []
        #: Streams whose answer is ended while their client is still sending.
        self._stop_sending: list[H2Stream] = []
        self._flushing = False
        self._paused = False
        self.last = self.loop.time()
        self._timer: asyncio.TimerHandle | None = None
        self._out = ffi.new("const char **")
        #: The reset bucket's tokens (:data:`RESET_BURST` at most), as of ``_refilled``.
        self._resets = float(RESET_BURST)
        self._refilled = self.last
        self._calm = False
        #: Bytes of the requests taken whole in this read (:meth:`taken`), not yet consumed.
        self._taken = 0
        #: A GOAWAY was sent or received: each flush asks whether the session is over (else
        #: only a read's flush does: nghttp2 may end it for what it read).
        self.ending = False

    # -- asyncio.Protocol --

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)  # uvloop's: no subclass
        limits = self.limits
        if len(limits.connections) >= limits.max_connections:
            transport.abort()
            return
        limits.connections.add(self)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            self.peer = (str(peer[0]), int(peer[1]))
            self.grpc_peer = f"ipv4:{peer[0]}:{peer[1]}"
        holder = ffi.new("nghttp2_session **")
        if lib.nghttp2_session_server_new2(holder, callbacks.CALLBACKS, ffi.NULL, OPTION) != 0:
            transport.abort()
            return
        self.session = holder[0]
        settings = ffi.new(
            "nghttp2_settings_entry[]",
            [
                (ng.SETTINGS_MAX_CONCURRENT_STREAMS, limits.max_streams),
                (ng.SETTINGS_INITIAL_WINDOW_SIZE, STREAM_WINDOW),
                (ng.SETTINGS_MAX_HEADER_LIST_SIZE, MAX_HEADER_LIST),
            ],
        )
        lib.nghttp2_submit_settings(self.session, 0, settings, 3)
        lib.nghttp2_session_set_local_window_size(self.session, 0, 0, CONNECTION_WINDOW)
        self._arm()
        self.flush()

    def data_received(self, data: bytes) -> None:
        session = self.session
        if session is None:
            return
        self.last = self.loop.time()
        frames = self.header_blocks
        frames.feed(data)
        if self.invalid:
            self.invalid.clear()
        callbacks.current = self
        read = lib.nghttp2_session_mem_recv(session, data, len(data))
        if read < 0:
            self._close()
            return
        if frames.broken is not None:  # (nghttp2 ended the session for these frames too)
            lib.nghttp2_session_terminate_session(session, ng.PROTOCOL_ERROR)
            self.ending = True
        else:
            if frames.blocks:
                self._opened()
            if frames.ends:
                self._ended(frames.ends)
            if frames.resets:  # resets of streams not open (those open: _on_stream_close)
                for _ in range(len(frames.resets)):
                    self.reset_received(None)
                frames.resets.clear()
            if frames.goaway:
                self.ending = True
            if frames.lost is not None and not self.ending:  # no more calls can start
                self.goaway()
        if self._calm:  # rapid reset: the calls of this read are not started either
            self._calm = False
            self.ready.clear()
        if self.ready:
            # What the calls submit now (an answer made in place among them) is written by
            # this read's flush below, not by one more turn of the loop.
            self._flushing = True
            try:
                self._start_ready()
            except BaseException:
                self._flushing = False
                raise
            if self._taken:  # one window update for the requests taken whole
                lib.nghttp2_session_consume_connection(session, self._taken)
                self._taken = 0
        ending, self.ending = self.ending, True  # (a read may end the session)
        self.flush()
        if not ending and not self._paused:  # (paused: the flush on resuming asks)
            self.ending = False

    def _start_ready(self) -> None:
        """Start the calls whose headers (or whole request, for a fast call) came in this read."""
        ready, self.ready = self.ready, []
        app, client, create = self.limits.app, self.peer, self.loop.create_task
        fast = self.limits.fast
        for stream in ready:
            if stream.closed or stream.wait == STARTED:
                continue
            if fast is not None and stream.path == fast.path:
                if stream.ended:
                    if fast.start(self, stream):
                        stream.wait = STARTED
                        continue
                elif stream.wait == 0 and stream.unconsumed <= fast.max_wait:
                    stream.wait = WAITING  # ready again once it ends (or sends more)
                    continue
            stream.wait = STARTED
            path = stream.path
            try:
                text = path.decode()
            except UnicodeDecodeError:  # not a path any method has: its stream only ends
                self.reset(stream.id, ng.PROTOCOL_ERROR)
                continue
            scope = {"type": "http", "client": client, "headers": stream.headers,
                     "raw_path": path, "path": text,
                     "extensions": {STREAM_EXTENSION: stream}}  # fmt: skip
            task = stream.task = create(app(scope, stream.receive, stream.send))
            task.add_done_callback(stream.task_done)

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.limits.connections.discard(self)
        if self._timer is not None:
            self._timer.cancel()
        streams, self.streams = self.streams, {}
        for stream in streams.values():
            self.on_close(stream)
        session, self.session = self.session, None
        if session is not None:
            lib.nghttp2_session_del(session)
        self.header_blocks.close()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self.flush()

    # -- what the streams call --

    def consume(self, stream: H2Stream, size: int) -> None:
        """The app took ``size`` bytes of ``stream``'s body: give their window back."""
        stream.unconsumed -= size
        if self.session is not None and not stream.closed:
            lib.nghttp2_session_consume(self.session, stream.id, size)
            self.want_flush()

    def taken(self, stream: H2Stream) -> None:
        """The whole request of ``stream`` (ended) was taken during this read: its bytes'
        window is given back to the connection (sent with the read's flush)."""
        self._taken += stream.unconsumed
        stream.unconsumed = 0
        stream.chunks.clear()

    def submit(self, stream: H2Stream, flush: bool = True) -> None:
        """``stream`` has more of its answer to send (``flush``: written this turn; else the
        caller flushes)."""
        session = self.session
        if session is None or stream.closed:
            return
        if not stream.submitted:
            stream.submitted = True
            start = stream.start if stream.start is not None else []
            if (
                stream.finished
                and not stream.out
                and stream.trailers is not None
                and any(k == b"grpc-status" for k, _ in start)
            ):  # gRPC's trailers-only answer: one HEADERS that ends the stream
                nva, count, _keep = headers_nv(stream.status, start)
                lib.nghttp2_submit_response(session, stream.id, nva, count, ffi.NULL)
                self.after_end(stream)
            else:
                nva, count, _keep = headers_nv(stream.status, start)
                lib.nghttp2_submit_response(session, stream.id, nva, count, callbacks.PROVIDER)
        else:
            lib.nghttp2_session_resume_data(session, stream.id)
        if flush:
            self.want_flush()

    def answer_ready(self) -> None:
        """An answer was submitted: written now when nothing else of this connection could
        join its write (no flush is due, no other stream is open), else with the others of
        this turn of the loop."""
        if not self._flushing and len(self.streams) == 1:
            self.flush()
        else:
            self.want_flush()

    def after_end(self, stream: H2Stream) -> None:
        """Our side of ``stream`` is ended; a client still sending is told to stop once the
        end is written (a reset submitted earlier would drop the answer)."""
        if not stream.ended:
            self._stop_sending.append(stream)

    def reset(self, stream_id: int, code: int) -> None:
        """Reset a stream (its call's task is cancelled when the reset is sent)."""
        if self.session is not None:
            lib.nghttp2_submit_rst_stream(self.session, 0, stream_id, code)
            self.want_flush()

    def want_flush(self) -> None:
        if not self._flushing:
            self._flushing = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write all the session has to send, in one write."""
        self._flushing = False
        session, transport = self.session, self.transport
        if session is None or transport is None or self._paused:
            return
        callbacks.current = self
        out = self._out
        pieces = []
        while True:
            while (size := lib.nghttp2_session_mem_send(session, out)) > 0:
                pieces.append(unpack(out[0], size))
            if size < 0:
                self._close()
                return
            if not self._stop_sending:
                break
            stop, self._stop_sending = self._stop_sending, []
            for stream in stop:  # their answers' last frames are written (in pieces)
                if not stream.closed and not stream.ended:
                    lib.nghttp2_submit_rst_stream(session, 0, stream.id, ng.NO_ERROR)
        if pieces:
            transport.write(pieces[0] if len(pieces) == 1 else b"".join(pieces))
        if (
            self.ending
            and not lib.nghttp2_session_want_read(session)
            and not lib.nghttp2_session_want_write(session)
        ):  # (a GOAWAY sent or received, and its last stream closed)
            transport.close()

    def goaway(self) -> None:
        """Tell the client no new calls are taken (those open go on)."""
        if self.session is not None:
            self.ending = True
            last = lib.nghttp2_session_get_last_proc_stream_id(self.session)
            lib.nghttp2_submit_goaway(self.session, 0, last, ng.NO_ERROR, ffi.NULL, 0)
            self.flush()

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def reset_received(self, stream: H2Stream | None) -> None:
        """The client reset ``stream`` (None: one not open): a young one costs a token of the
        reset bucket; the connection is ended once it is empty."""
        now = self.last
        if stream is not None and now - stream.opened >= RESET_GRACE:
            return
        tokens = min(float(RESET_BURST), self._resets + (now - self._refilled) * RESET_RATE)
        self._refilled = now
        if tokens < 1.0:
            if not self._calm and self.session is not None:
                # Ended now, from within nghttp2's callback: the rest of the read's header
                # blocks are ignored by nghttp2 (no callbacks), then the connection closes.
                lib.nghttp2_session_terminate_session(self.session, ng.ENHANCE_YOUR_CALM)
                self.ending = True
            self._calm = True
            self._resets = 0.0
            return
        self._resets = tokens - 1.0

    # -- timers: the write timeout of answers, the idle timeout of the connection --

    def _arm(self) -> None:
        limits = self.limits
        period = max(0.05, min(limits.write_timeout, limits.idle_timeout) / 4)
        self._timer = self.loop.call_later(period, self._sweep)

    def _sweep(self) -> None:
        if self.session is None:
            return
        now = self.loop.time()
        limits = self.limits
        for stream in list(self.streams.values()):
            if stream.finished and now - stream.finished_at > limits.write_timeout:
                self.reset(stream.id, ng.CANCEL)
        if not self.streams and now - self.last > limits.idle_timeout:
            self.goaway()
            self._close()
            return
        self._arm()

    # -- what nghttp2 took of a read (its callbacks, and what the read's frames say) --

    def open_stream(self, stream_id: int) -> H2Stream | None:
        """The stream ``stream_id`` whose header block came in this read, opened (its call
        ready); None: no such block, or one nghttp2 or the transport refused."""
        block = self.blocks.get(stream_id)
        if block is None or stream_id in self.invalid:
            return None
        if block.size is None:  # past MAX_HEADER_LIST, or its block not decoded (LOST)
            self.invalid.add(stream_id)
            # this stream (refused: a client may retry it elsewhere); the open ones go on
            self.reset(stream_id, ng.REFUSED_STREAM if block is LOST else ng.INTERNAL_ERROR)
            return None
        stream = self.streams[stream_id] = H2Stream(self, stream_id, self.last)
        stream.block = block
        stream.path = block.path
        stream.headers = block.headers
        stream.length = block.length
        self.ready.append(stream)
        return stream

    def _opened(self) -> None:
        """Open the streams whose header block came in this read and no DATA opened: those
        nghttp2 took (open, and not refused)."""
        session, streams = self.session, self.streams
        for stream_id in self.blocks:
            if (
                stream_id not in streams
                and lib.nghttp2_session_find_stream(session, stream_id) != ffi.NULL
            ):
                self.open_stream(stream_id)

    def _ended(self, ends: list[int]) -> None:
        """The client ended these streams' requests (in this read), where nghttp2 took it."""
        streams, session, ready = self.streams, self.session, self.ready
        for stream_id in ends:
            stream = streams.get(stream_id)
            if (
                stream is None
                or stream.ended
                or lib.nghttp2_session_get_stream_remote_close(session, stream_id) != 1
                or (stream.length is not None and stream.length != stream.received)
            ):  # (the last: nghttp2 resets the stream, PROTOCOL_ERROR)
                continue
            stream.ended = True
            if stream.waiter is not None:  # (a task reads it: wake it)
                stream.wake()
            if stream.wait == WAITING:
                ready.append(stream)

    def on_close(self, stream: H2Stream) -> None:
        stream.closed = True
        if stream.unconsumed and self.session is not None:
            lib.nghttp2_session_consume_connection(self.session, stream.unconsumed)
            stream.unconsumed = 0
        stream.chunks.clear()
        if stream.waiter is not None:  # (a task reads it: wake it)
            stream.wake()
        drained = stream.drained
        if drained is not None and not drained.done():
            drained.set_result(None)
        ended_call = stream.ended_call
        if ended_call is not None:
            stream.ended_call = None
            ended_call()
        task = stream.task
        if task is not None and not stream.finished and not task.done():
            task.cancel()  # the client reset the stream or left: the call is cancelled
        self.last = self.loop.time()


def _option() -> Any:
    holder = ffi.new("nghttp2_option **")
    lib.nghttp2_option_new(holder)
    option = holder[0]
    lib.nghttp2_option_set_no_auto_window_update(option, 1)  # windows follow the app's reads
    lib.nghttp2_option_set_max_outbound_ack(option, 1000)  # PING/SETTINGS floods
    lib.nghttp2_option_set_max_settings(option, 32)
    lib.nghttp2_option_set_max_deflate_dynamic_table_size(option, 4096)
    # Rapid reset: counted by the connection (H2Protocol.reset_received); nghttp2's count of
    # every reset is a backstop far above it.
    lib.nghttp2_option_set_stream_reset_rate_limit(option, NGHTTP2_RESET_BURST, NGHTTP2_RESET_RATE)
    lib.nghttp2_option_set_max_continuations(option, MAX_CONTINUATIONS)  # CONTINUATION floods
    return option


OPTION = _option() if lib is not None else None  # None: no libnghttp2 (nghttp2.MISSING)

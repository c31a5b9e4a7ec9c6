"""One HTTP/2 connection of the gRPC listener on libnghttp2 (:mod:`.nghttp2`), on the event loop.

:class:`H2Protocol` is an ``asyncio.Protocol``: each read goes through
``nghttp2_session_mem_recv`` whole; the calls whose headers it completed are then started, each
as a task of the ASGI app (:class:`~.native.GrpcApp`, the contract h2corn gives it: ``receive``
yields the request body's chunks then ``http.disconnect`` once the stream ends; ``send`` takes
``http.response.start``/``body``/``trailers``). A unary answer is written as soon as it is
made (``nghttp2_session_mem_send`` drained into one ``transport.write``); the rest the calls and
the session have to send, once per loop turn.

Promises: flow control follows the app's reads (a chunk's window is given back when the app
takes it, so a message the app refuses is never buffered past one window); a stream the client
resets, or a connection it closes, cancels the call's task; an answer that waits behind a
closed window past ``write_timeout`` resets its stream; a connection without calls for
``idle_timeout`` is closed (GOAWAY first); a header block past :data:`MAX_HEADER_LIST` resets
its stream. Rapid reset (CVE-2023-44487): a client's resets of streams it opened less than
:data:`RESET_GRACE` before are counted in a token bucket (:data:`RESET_BURST`, refilled at
:data:`RESET_RATE` a second); past it the connection is ended (GOAWAY ENHANCE_YOUR_CALM). A
reset of an older stream costs nothing: such a stream held one of the connection's
``max_streams`` for that long, so the concurrency limit bounds them, and a client that cancels
many calls at once (its deadline passed) keeps its connection. nghttp2's own limits stay on:
its reset limit (a backstop far above ours), PING/SETTINGS floods (outbound ACKs capped),
CONTINUATION floods.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, cast

from model_runtime.server.grpc import nghttp2 as ng
from model_runtime.server.grpc.call import STREAM_EXTENSION
from model_runtime.server.grpc.h2stream import HIGH_WATER, H2Stream, headers_nv, trailers_nv
from model_runtime.server.grpc.nghttp2 import ffi, lib

__all__ = ["MAX_HEADER_LIST", "H2Protocol", "ProtocolLimits"]

unpack = ffi._backend.unpack  # ffi.unpack without its Python wrapper (per header)


App = Callable[[dict[str, Any], Any, Any], Coroutine[Any, Any, None]]


class FastCalls(Protocol):
    """Calls the transport may hand over without a task (:class:`~.unary.UnaryInfer`)."""

    path: bytes
    #: A call of :attr:`path` whose request has not ended waits for its end (unstarted)
    #: while it has sent at most this many bytes.
    max_wait: int

    def start(self, conn: H2Protocol, stream: H2Stream) -> bool:
        """Take the call of ``stream`` (its method's ``:path`` is :attr:`path`, its request
        ended); False: nothing was done (the app serves it)."""


#: A stream's header block (names and values) past this many bytes resets the stream.
MAX_HEADER_LIST = 64 << 10
#: Each stream's receive window, and the connection's: what a client may send unread.
STREAM_WINDOW = 1 << 20
CONNECTION_WINDOW = 8 << 20
#: Resets of young streams a client may send at once, and a second after (more: its
#: connection is ended); a stream is young until it has been open RESET_GRACE seconds.
RESET_BURST, RESET_RATE, RESET_GRACE = 100, 33.0, 0.1
#: A stream's ``wait``: its call not started; waiting for the end of its request (a fast
#: call's); no longer (too big: the app's); started.
WAITING, TOO_BIG, STARTED = 1, 2, 3
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
        self.transport: asyncio.Transport | None = None
        self.peer: tuple[str, int] | None = None
        #: The peer as gRPC names it (``ipv4:HOST:PORT``).
        self.grpc_peer = "unknown"
        self._ready: list[H2Stream] = []
        #: Streams whose answer is ended while their client is still sending.
        self._stop_sending: list[H2Stream] = []
        self._flushing = False
        self._paused = False
        self._last = self.loop.time()
        self._timer: asyncio.TimerHandle | None = None
        self._out = ffi.new("uint8_t **")
        #: The reset bucket's tokens (:data:`RESET_BURST` at most), as of ``_refilled``.
        self._resets = float(RESET_BURST)
        self._refilled = self._last
        self._calm = False

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
        if lib.nghttp2_session_server_new2(holder, _CALLBACKS, ffi.NULL, _OPTION) != 0:
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
        self._last = self.loop.time()
        global _conn
        _conn = self
        read = lib.nghttp2_session_mem_recv(session, data, len(data))
        if read < 0:
            self._close()
            return
        if self._calm:  # rapid reset: no new streams, then the connection ends
            self._calm = False
            self._ready.clear()
            lib.nghttp2_session_terminate_session(session, ng.ENHANCE_YOUR_CALM)
        if self._ready:
            ready, self._ready = self._ready, []
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
        self.flush()

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.limits.connections.discard(self)
        if self._timer is not None:
            self._timer.cancel()
        streams, self.streams = self.streams, {}
        for stream in streams.values():
            self._on_close(stream)
        session, self.session = self.session, None
        if session is not None:
            lib.nghttp2_session_del(session)

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
        size, stream.unconsumed = stream.unconsumed, 0
        stream.chunks.clear()
        if size and self.session is not None:
            lib.nghttp2_session_consume_connection(self.session, size)

    def submit(self, stream: H2Stream) -> None:
        """``stream`` has more of its answer to send."""
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
                self._after_end(stream)
            else:
                nva, count, _keep = headers_nv(stream.status, start)
                lib.nghttp2_submit_response(session, stream.id, nva, count, _PROVIDER)
        else:
            lib.nghttp2_session_resume_data(session, stream.id)
        self.want_flush()

    def _after_end(self, stream: H2Stream) -> None:
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
        global _conn
        _conn = self
        out = self._out
        pieces = []
        while True:
            while (size := lib.nghttp2_session_mem_send(session, out)) > 0:
                pieces.append(ffi.buffer(out[0], size)[:])
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
        if not lib.nghttp2_session_want_read(session) and not lib.nghttp2_session_want_write(
            session
        ):
            transport.close()

    def goaway(self) -> None:
        """Tell the client no new calls are taken (those open go on)."""
        if self.session is not None:
            last = lib.nghttp2_session_get_last_proc_stream_id(self.session)
            lib.nghttp2_submit_goaway(self.session, 0, last, ng.NO_ERROR, ffi.NULL, 0)
            self.flush()

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def reset_received(self, stream: H2Stream | None) -> None:
        """The client reset ``stream`` (None: one not open): a young one costs a token of the
        reset bucket; the connection is ended once it is empty."""
        now = self._last
        if stream is not None and now - stream.opened >= RESET_GRACE:
            return
        tokens = min(float(RESET_BURST), self._resets + (now - self._refilled) * RESET_RATE)
        self._refilled = now
        if tokens < 1.0:
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
        if not self.streams and now - self._last > limits.idle_timeout:
            self.goaway()
            self._close()
            return
        self._arm()

    # -- nghttp2's callbacks (through the module's functions below) --

    def _on_close(self, stream: H2Stream) -> None:
        stream.closed = True
        if stream.unconsumed and self.session is not None:
            lib.nghttp2_session_consume_connection(self.session, stream.unconsumed)
            stream.unconsumed = 0
        stream.chunks.clear()
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
        self._last = self.loop.time()


# The connection whose session nghttp2 is calling back into (set before each mem_recv/send:
# the event loop runs one at a time).
_conn: H2Protocol | None = None


def _on_begin_headers(session: Any, frame: Any, user_data: Any) -> int:
    global _hs
    conn = _conn
    assert conn is not None
    stream_id = frame.hd.stream_id
    if stream_id in conn.streams:
        _hs = None  # the request's trailers: not read
    else:
        _hs = conn.streams[stream_id] = H2Stream(conn, stream_id, conn._last)
    return 0


#: The stream whose header block is being received (None: one not read).
_hs: H2Stream | None = None


def _on_header(
    session: Any, frame: Any, name: Any, namelen: int, value: Any, valuelen: int, flags: int,
    user_data: Any,
) -> int:  # fmt: skip
    stream = _hs
    if stream is None:
        return 0
    stream.header_bytes += namelen + valuelen + 32
    if stream.header_bytes > MAX_HEADER_LIST:
        return ng.ERR_TEMPORAL_CALLBACK_FAILURE  # this stream is reset, the others go on
    key = unpack(name, namelen)
    if key[0] != 58:  # not a pseudo-header (":")
        stream.headers.append((key, unpack(value, valuelen)))
    elif key == b":path":
        stream.path = unpack(value, valuelen)
    return 0


def _on_frame_recv(session: Any, frame: Any, user_data: Any) -> int:
    conn = _conn
    assert conn is not None
    hd = frame.hd
    kind = hd.type
    if kind == ng.HEADERS or kind == ng.DATA:
        stream = conn.streams.get(hd.stream_id)
        if stream is None:
            return 0
        if kind == ng.HEADERS and stream is _hs:  # a request's headers (not its trailers)
            conn._ready.append(stream)
        if hd.flags & ng.FLAG_END_STREAM:
            stream.ended = True
            stream.wake()
            if stream.wait == WAITING:
                conn._ready.append(stream)
    elif kind == ng.RST_STREAM:
        conn.reset_received(conn.streams.get(hd.stream_id))
    return 0


def _on_data_chunk(
    session: Any, flags: int, stream_id: int, data: Any, size: int, user_data: Any
) -> int:
    conn = _conn
    assert conn is not None
    stream = conn.streams.get(stream_id)
    if stream is None:
        lib.nghttp2_session_consume_connection(session, size)
        return 0
    stream.chunks.append(ffi.buffer(data, size)[:])
    stream.unconsumed += size
    stream.wake()
    if stream.wait == WAITING:
        fast = conn.limits.fast
        if fast is not None and stream.unconsumed > fast.max_wait:
            stream.wait = TOO_BIG  # the app reads it as it comes
            conn._ready.append(stream)
    return 0


def _on_stream_close(session: Any, stream_id: int, error_code: int, user_data: Any) -> int:
    conn = _conn
    assert conn is not None
    stream = conn.streams.pop(stream_id, None)
    if stream is not None:
        conn._on_close(stream)
    return 0


def _read_answer(
    session: Any, stream_id: int, buf: Any, length: int, data_flags: Any, source: Any,
    user_data: Any,
) -> int:  # fmt: skip
    conn = _conn
    assert conn is not None
    stream = conn.streams.get(stream_id)
    if stream is None:
        return ng.ERR_CALLBACK_FAILURE
    out = stream.out
    sent = 0
    while out and sent < length:
        chunk = out[0]
        take = min(len(chunk), length - sent)
        if take == len(chunk):
            out.popleft()
            ffi.memmove(buf + sent, chunk, take)
        else:
            ffi.memmove(buf + sent, memoryview(chunk)[:take], take)
            out[0] = chunk[take:]
        sent += take
    stream.out_len -= sent
    drained = stream.drained
    if drained is not None and not drained.done() and stream.out_len <= HIGH_WATER // 2:
        drained.set_result(None)
    if not out and stream.finished:
        trailers = stream.trailers
        if trailers is None:
            data_flags[0] = ng.DATA_FLAG_EOF
        else:
            data_flags[0] = ng.DATA_FLAG_EOF | ng.DATA_FLAG_NO_END_STREAM
            nva, count, _keep = trailers_nv(trailers)
            lib.nghttp2_submit_trailer(session, stream_id, nva, count)
        conn._after_end(stream)
    elif sent == 0:
        return ng.ERR_DEFERRED
    return sent


def _callbacks() -> Any:
    holder = ffi.new("nghttp2_session_callbacks **")
    lib.nghttp2_session_callbacks_new(holder)
    cbs = holder[0]
    for setter, kind, function in (
        ("on_begin_headers", "nghttp2_on_begin_headers_callback", _on_begin_headers),
        ("on_header", "nghttp2_on_header_callback", _on_header),
        ("on_frame_recv", "nghttp2_on_frame_recv_callback", _on_frame_recv),
        ("on_data_chunk_recv", "nghttp2_on_data_chunk_recv_callback", _on_data_chunk),
        ("on_stream_close", "nghttp2_on_stream_close_callback", _on_stream_close),
    ):
        callback = ffi.callback(kind, function)
        _KEEP.append(callback)
        getattr(lib, f"nghttp2_session_callbacks_set_{setter}_callback")(cbs, callback)
    return cbs


#: The C callbacks (alive as long as the process).
_KEEP: list[Any] = []


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
    lib.nghttp2_option_set_max_continuations(option, 8)  # CONTINUATION floods
    return option


_CALLBACKS = _callbacks()
_OPTION = _option()
_PROVIDER = ffi.new("nghttp2_data_provider *")
_KEEP.append(ffi.callback("nghttp2_data_source_read_callback", _read_answer))
_PROVIDER.read_callback = _KEEP[-1]

"""nghttp2's callbacks into Python for the gRPC transport's connections (:mod:`.h2proto`).

nghttp2 calls these while a connection hands it a read (``nghttp2_session_mem_recv``) or asks
it what to send (``nghttp2_session_mem_send``); the connection sets :data:`current` first (the
event loop runs one at a time). They keep each stream's body chunks as they come (a stream's
first chunk opens it: its header block was read from the same bytes by :mod:`.h2blocks`), tell
the connection of closed streams and of those the client reset, and feed answers' bytes and
trailers to nghttp2 from each stream's queue. A call costs three: a chunk, its answer, its
close (the frames nghttp2 takes without them, and the ends of requests, the connection reads
after nghttp2 took the read).
"""

from __future__ import annotations

from typing import Any, Protocol

from model_runtime.server.grpc import nghttp2 as ng
from model_runtime.server.grpc.h2stream import HIGH_WATER, H2Stream, StreamOwner, trailers_nv
from model_runtime.server.grpc.nghttp2 import ffi, lib

__all__ = ["CALLBACKS", "PROVIDER", "STARTED", "TOO_BIG", "WAITING", "CallbackOwner",
           "FastCalls", "current"]  # fmt: skip

unpack = ffi._backend.unpack  # ffi.unpack without its Python wrapper (per chunk)
memmove = ffi._backend.memmove  # (the same for ffi.memmove, per answer)
#: A stream's ``wait``: its call not started; waiting for the end of its request (a fast
#: call's); no longer (too big: the app's); started.
WAITING, TOO_BIG, STARTED = 1, 2, 3


class FastCalls(Protocol):
    """Calls the transport may hand over without a task (:class:`~.unary.UnaryInfer`)."""

    path: bytes
    #: A call of :attr:`path` whose request has not ended waits for its end (unstarted)
    #: while it has sent at most this many bytes.
    max_wait: int

    def start(self, conn: Any, stream: H2Stream) -> bool:
        """Take the call of ``stream`` (its method's ``:path`` is :attr:`path`, its request
        ended); False: nothing was done (the app serves it)."""


class CallbackOwner(StreamOwner, Protocol):
    """What the callbacks need of a connection (:class:`~.h2proto.H2Protocol`)."""

    streams: dict[int, H2Stream]
    #: The streams the read nghttp2 is given resets (RST_STREAM frames, :mod:`.h2blocks`).
    resets: list[int]
    #: The streams whose request headers nghttp2 refused in this read.
    invalid: set[int]
    #: Streams whose call may start now (headers complete), in the order they came.
    ready: list[H2Stream]

    #: Calls the transport may take without a task (None: none).
    fast: FastCalls | None

    def open_stream(self, stream_id: int) -> H2Stream | None:
        """The stream ``stream_id`` whose header block came in this read, opened (its call
        ready); None: no such block, or one nghttp2 or the transport refused."""

    def on_close(self, stream: H2Stream) -> None:
        """``stream`` is closed (ended both ways, or reset)."""

    def after_end(self, stream: H2Stream) -> None:
        """Our side of ``stream`` is ended."""

    def reset_received(self, stream: H2Stream | None) -> None:
        """The client reset ``stream`` (None: one not open)."""


# The connection whose session nghttp2 is calling back into (set before each mem_recv/send:
# the event loop runs one at a time).
current: CallbackOwner | None = None


def _on_data_chunk(session: int, flags: int, stream_id: int, data: Any, size: int) -> int:
    conn = current
    assert conn is not None
    stream = conn.streams.get(stream_id)
    if stream is None:
        stream = conn.open_stream(stream_id)  # (its first DATA: its header block came first)
        if stream is None:
            lib.nghttp2_session_consume_connection(conn.session, size)
            return 0
    stream.chunks.append(unpack(data, size))
    stream.unconsumed += size
    stream.received += size
    if stream.waiter is not None:  # (a task reads it: wake it)
        stream.wake()
    if stream.wait == WAITING:
        fast = conn.fast
        if fast is not None and stream.unconsumed > fast.max_wait:
            stream.wait = TOO_BIG  # the app reads it as it comes
            conn.ready.append(stream)
    return 0


def _on_stream_close(session: int, stream_id: int, error_code: int) -> int:
    conn = current
    assert conn is not None
    stream = conn.streams.pop(stream_id, None)
    resets = conn.resets
    if resets and stream_id in resets:  # the client reset it (this read's RST_STREAM)
        resets.remove(stream_id)
        conn.reset_received(stream)
    if stream is not None:
        conn.on_close(stream)
    return 0


def _on_invalid_frame(session: int, frame: Any, error: int) -> int:
    if frame.type == ng.HEADERS:  # a request nghttp2 refused (it resets the stream)
        assert current is not None
        current.invalid.add(frame.stream_id)
    return 0


def _read_answer(session: int, stream_id: int, buf: Any, length: int, data_flags: Any) -> int:
    conn = current
    assert conn is not None
    stream = conn.streams.get(stream_id)
    if stream is None:
        return ng.ERR_CALLBACK_FAILURE
    out = stream.out
    sent = 0
    if len(out) == 1 and len(out[0]) <= length:  # (a unary answer: its one message)
        chunk = out.popleft()
        sent = len(chunk)
        memmove(buf, chunk, sent)
    while out and sent < length:
        chunk = out[0]
        take = min(len(chunk), length - sent)
        if take == len(chunk):
            out.popleft()
            memmove(buf + sent, chunk, take)
        else:
            memmove(buf + sent, memoryview(chunk)[:take], take)
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
            lib.nghttp2_submit_trailer(conn.session, stream_id, nva, count)
        conn.after_end(stream)
    elif sent == 0:
        return ng.ERR_DEFERRED
    return sent


def _callbacks() -> Any:
    holder = ffi.new("nghttp2_session_callbacks **")
    lib.nghttp2_session_callbacks_new(holder)
    cbs = holder[0]
    for setter, kind, function in (
        ("on_data_chunk_recv", "nghttp2_on_data_chunk_recv_callback", _on_data_chunk),
        ("on_stream_close", "nghttp2_on_stream_close_callback", _on_stream_close),
        ("on_invalid_frame_recv", "nghttp2_on_invalid_frame_recv_callback", _on_invalid_frame),
    ):
        callback = ffi.callback(kind, function)
        _KEEP.append(callback)
        getattr(lib, f"nghttp2_session_callbacks_set_{setter}_callback")(cbs, callback)
    return cbs


#: The C callbacks (alive as long as the process).
_KEEP: list[Any] = []


CALLBACKS = _callbacks() if lib is not None else None  # None: no libnghttp2 (ng.MISSING)
PROVIDER = ffi.new("nghttp2_data_provider *")
_KEEP.append(ffi.callback("nghttp2_data_source_read_callback", _read_answer))
PROVIDER.read_callback = _KEEP[-1]

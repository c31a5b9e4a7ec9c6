"""The nghttp2 gRPC transport (``--grpc-transport nghttp2``) on loopback, as a client sees it:
grpcio's client for answers and statuses, a raw HTTP/2 socket for what happens on the wire (a
message split across frames and reads, a message refused before its bytes are sent, a window
never opened, an idle connection). One listener (and one with short timeouts, one over mutual
TLS) shared by the module, on a loop thread."""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from model_runtime.server.grpc.call import OK, START_HEADERS
from model_runtime.server.grpc.framing import frame
from model_runtime.server.grpc.h2proto import CONNECTION_WINDOW, H2Protocol, ProtocolLimits
from model_runtime.server.grpc.listensock import ListenerSettings
from model_runtime.server.grpc.ngserver import NgListener, start_nghttp2_listener
from model_runtime.server.security.tls import TLSFiles
from model_runtime.server.triton import grpc_service_pb2 as pb
from tests.attack.grpc_wire import (
    ACK,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    INFER_PATH,
    PREFACE,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    frame as h2frame,
    grpc_headers,
    h2_connect,
    settings,
)
from tests.pki import write_pki

pytestmark = pytest.mark.timeout(20)

MAX_MESSAGE = 4 << 20


class Server:
    """Listeners on a loop of their own thread; ``calls`` counts the handler's calls and
    ``cancelled`` is set when a waiting call is cancelled."""

    def __init__(self, pki: dict[str, Path]) -> None:
        self.loop = asyncio.new_event_loop()
        self.started = threading.Event()
        self.waiting = threading.Event()
        self.cancelled = threading.Event()
        self.listeners: list[NgListener] = []
        self.ports: dict[str, int] = {}
        self.pki = pki
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    async def _echo(self, request: Any, context: Any) -> Any:
        if request.model_name == "wait":
            self.waiting.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        raw = context.raw_inputs or request.raw_input_contents  # big ones: split off
        size = len(raw[0]) if raw else 0
        return pb.ModelInferResponse(model_name=request.model_name, id=f"{request.id}:{size}")

    async def _start(self) -> None:
        handlers = {
            "ModelInfer": grpc.unary_unary_rpc_method_handler(
                self._echo, pb.ModelInferRequest.FromString, pb.ModelInferResponse.SerializeToString
            )
        }
        common: dict[str, Any] = {"max_message_size": MAX_MESSAGE, "max_streams": 16}
        plain: dict[str, Any] = {"idle_timeout": 30.0, "write_timeout": 5.0, "max_connections": 64}
        short: dict[str, Any] = {"idle_timeout": 0.3, "write_timeout": 0.3, "max_connections": 2}
        tls = TLSFiles(self.pki["server"], self.pki["server_key"], self.pki["ca"], mutual=True)
        for name, limits, files in (("plain", plain, None), ("short", short, None),
                                    ("tls", plain, tls)):  # fmt: skip
            settings = ListenerSettings("127.0.0.1", 0, tls=files, **common, **limits)
            listener, port = await start_nghttp2_listener(handlers, settings)
            self.listeners.append(listener)
            self.ports[name] = port

    def stop(self) -> None:
        async def stop_all() -> None:
            for listener in self.listeners:
                await listener.stop(0)

        asyncio.run_coroutine_threadsafe(stop_all(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = Server(write_pki(tmp_path_factory.mktemp("pki"), ("server", "client")))
    yield s
    s.stop()


def infer(channel: grpc.Channel, request: pb.ModelInferRequest, **kw: Any) -> Any:
    call = channel.unary_unary(
        INFER_PATH.decode(),
        request_serializer=pb.ModelInferRequest.SerializeToString,
        response_deserializer=pb.ModelInferResponse.FromString,
    )
    return call(request, timeout=5, **kw)


def message(model: str = "m", id_: str = "1", size: int = 0) -> bytes:
    return frame(
        pb.ModelInferRequest(
            model_name=model, id=id_, raw_input_contents=[b"x" * size] if size else []
        ).SerializeToString()
    )


Frame = tuple[int, int, int, bytes]


def frames(
    sock: socket.socket, until: Any, seconds: float = 5.0
) -> list[tuple[int, int, int, bytes]]:
    """(type, flags, stream, payload) of the frames the server sends, until ``until(frames)``
    holds, the connection closes or ``seconds`` pass."""
    sock.settimeout(seconds)
    buf = b""
    seen: list[Frame] = []
    while not until(seen):
        try:
            data = sock.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            data = b""
        if not data:
            seen.append((-1, 0, 0, b""))  # closed
            break
        buf += data
        while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
            size = int.from_bytes(buf[:3], "big")
            stream = int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
            seen.append((buf[3], buf[4], stream, buf[9 : 9 + size]))
            buf = buf[9 + size :]
    return seen


def ended(stream: int) -> Any:
    return lambda seen: any(
        (t == HEADERS and f & END_STREAM and s == stream) or (t == RST_STREAM and s == stream)
        for t, f, s, _ in seen
    )


def test_grpcio_calls_are_answered_small_and_past_the_window(server: Server) -> None:
    """Messages of 2 MB cross many frames, reads and window updates (a stream's window is
    1 MiB, the connection's reopened as the app reads)."""
    with grpc.insecure_channel(f"127.0.0.1:{server.ports['plain']}") as channel:
        assert infer(channel, pb.ModelInferRequest(model_name="m", id="a")).id == "a:0"
        for i in range(2):
            big = pb.ModelInferRequest(
                model_name="m", id=str(i), raw_input_contents=[b"y" * 2_000_000]
            )
            assert infer(channel, big).id == f"{i}:2000000"


def test_a_message_split_across_frames_and_reads_is_answered(server: Server) -> None:
    body = message(id_="split", size=1000)
    sock = h2_connect(server.ports["plain"])
    try:
        sock.sendall(h2frame(HEADERS, END_HEADERS, 1, grpc_headers(INFER_PATH)))
        pieces = [body[:3], body[3:9], body[9:500], body[500:]]
        for i, piece in enumerate(pieces):
            sock.sendall(h2frame(DATA, END_STREAM if i == len(pieces) - 1 else 0, 1, piece))
        seen = frames(sock, ended(1))
    finally:
        sock.close()
    data = b"".join(p for t, _, s, p in seen if t == DATA and s == 1)
    assert data[:1] == b"\0"
    assert pb.ModelInferResponse.FromString(data[5:]).id == "split:1000"


def test_a_client_going_away_has_its_open_call_answered_then_its_connection_closed(
    server: Server,
) -> None:
    """A client's GOAWAY sent with a call open: the call is answered, then the server closes
    the connection (not after the idle timeout, 30 s here)."""
    sock = h2_connect(server.ports["plain"])
    try:
        sock.sendall(
            h2frame(HEADERS, END_HEADERS, 1, grpc_headers(INFER_PATH))
            + h2frame(DATA, END_STREAM, 1, message(id_="last"))
            + h2frame(GOAWAY, 0, 0, struct.pack(">II", 0, 0))
        )
        seen = frames(sock, lambda seen: False, 5.0)
    finally:
        sock.close()
    data = b"".join(p for t, _, s, p in seen if t == DATA and s == 1)
    assert pb.ModelInferResponse.FromString(data[5:]).id == "last:0", seen
    assert ended(1)(seen), seen
    assert seen[-1][0] == -1, seen  # closed within the 5 s waited


class _TakeWhole:
    """A fast path that takes every ModelInfer call whole and answers it on the next turn."""

    path = INFER_PATH
    max_wait = 16 << 10

    def start(self, conn: Any, stream: Any) -> bool:
        conn.taken(stream)
        stream.ended_call = lambda: None
        stream.answer(START_HEADERS, message(), OK, now=False)
        return True


class _Wire:
    """A transport that keeps what the server writes."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.writes = 0

    def write(self, data: bytes) -> None:
        self.out += data
        self.writes += 1

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 5555)

    def close(self) -> None:
        pass

    abort = close


def written(out: bytes) -> list[Frame]:
    seen: list[Frame] = []
    while len(out) >= 9:
        size = int.from_bytes(out[:3], "big")
        seen.append((out[3], out[4], int.from_bytes(out[5:9], "big"), bytes(out[9 : 9 + size])))
        out = out[9 + size :]
    return seen


def test_requests_taken_whole_give_their_bytes_back_to_the_connection_window() -> None:
    """More than the connection's receive window of requests, each taken whole by the fast
    path (no app reads them): the window is given back as they are taken, so every call is
    answered and the connection is not ended for flow control."""
    body = message(id_="x" * 15_000)
    calls = CONNECTION_WINDOW // len(body) + 50

    async def run() -> bytes:
        async def app(*_: Any) -> None:
            raise AssertionError("every call is taken whole")

        limits = ProtocolLimits(
            app, max_streams=16, idle_timeout=30.0, write_timeout=5.0, max_connections=1,
            fast=_TakeWhole(),
        )  # fmt: skip
        conn = H2Protocol(limits)
        wire = _Wire()
        conn.connection_made(wire)  # type: ignore[arg-type]
        conn.data_received(PREFACE + settings() + h2frame(SETTINGS, ACK, 0))
        for i in range(calls):
            stream = 1 + 2 * i
            conn.data_received(
                h2frame(HEADERS, END_HEADERS, stream, grpc_headers(INFER_PATH))
                + h2frame(DATA, END_STREAM, stream, body)
            )
            await asyncio.sleep(0)  # its answer is written
        return bytes(wire.out)

    seen = written(asyncio.run(run()))
    assert not any(t == GOAWAY for t, _, _, _ in seen), seen[-3:]
    given_back = sum(
        int.from_bytes(p, "big") for t, _, s, p in seen if t == WINDOW_UPDATE and s == 0
    )
    assert given_back >= calls * len(body) - CONNECTION_WINDOW
    answered = {s for t, f, s, _ in seen if t == HEADERS and f & END_STREAM}
    assert len(answered) == calls


class _AnswerNow(_TakeWhole):
    """A fast path that answers each call as it takes it (a model run in place)."""

    def start(self, conn: Any, stream: Any) -> bool:
        conn.taken(stream)
        stream.ended_call = lambda: None
        stream.answer(START_HEADERS, message(), OK, now=False)
        return True


async def _settled(fast: Any) -> tuple[H2Protocol, _Wire]:
    """A connection whose calls ``fast`` takes, past its preface and settings."""
    limits = ProtocolLimits(
        _never_app, max_streams=16, idle_timeout=30.0, write_timeout=5.0,
        max_connections=1, fast=fast,
    )  # fmt: skip
    conn = H2Protocol(limits)
    wire = _Wire()
    conn.connection_made(wire)  # type: ignore[arg-type]
    conn.data_received(PREFACE + settings() + h2frame(SETTINGS, ACK, 0))
    await asyncio.sleep(0)
    return conn, wire


def test_an_answer_made_while_its_read_is_handled_is_written_by_that_read_alone() -> None:
    """A call answered as its request is read: the answer (headers, message, trailers) goes
    out in one write before the read's handling returns, and no flush is left for a later
    turn of the loop (each would cost the loop a turn per call)."""

    async def run() -> tuple[list[int], int, int]:
        conn, wire = await _settled(_AnswerNow())
        flushes = 0
        flush = conn.flush

        def counted() -> None:
            nonlocal flushes
            flushes += 1
            flush()

        conn.flush = counted  # type: ignore[method-assign]
        sizes = []
        writes = wire.writes
        for i in range(3):
            before = len(wire.out)
            conn.data_received(
                h2frame(HEADERS, END_HEADERS, 1 + 2 * i, grpc_headers(INFER_PATH))
                + h2frame(DATA, END_STREAM, 1 + 2 * i, message())
            )
            sizes.append(len(wire.out) - before)
            for _ in range(3):
                await asyncio.sleep(0)
            assert len(wire.out) - before == sizes[-1]  # nothing more came later
        return sizes, wire.writes - writes, flushes

    sizes, writes, flushes = asyncio.run(run())
    assert all(size > 0 for size in sizes)
    assert writes == 3
    assert flushes == 3  # one per read: the read's own


class _AnswerSoon(_TakeWhole):
    """A fast path whose answers are made a turn after their calls are taken (outputs of a
    batch run elsewhere)."""

    def start(self, conn: Any, stream: Any) -> bool:
        conn.taken(stream)
        stream.ended_call = lambda: None
        conn.loop.call_soon(stream.answer, START_HEADERS, message(), OK, False)
        return True


def test_an_answer_is_written_as_it_is_made_unless_others_may_join_its_write() -> None:
    """The answer of a connection's only open call is written as it is made (not a turn of
    the loop later); the answers of calls open together go out in one write."""

    async def run() -> tuple[bytes, int, int]:
        conn, wire = await _settled(_AnswerSoon())
        call = h2frame(HEADERS, END_HEADERS, 1, grpc_headers(INFER_PATH)) + h2frame(
            DATA, END_STREAM, 1, message()
        )
        before = len(wire.out)
        conn.data_received(call)
        await asyncio.sleep(0)  # the turn its answer is made in
        alone = bytes(wire.out[before:])
        two = b"".join(
            h2frame(HEADERS, END_HEADERS, s, grpc_headers(INFER_PATH))
            + h2frame(DATA, END_STREAM, s, message())
            for s in (3, 5)
        )
        writes = wire.writes
        conn.data_received(two)
        for _ in range(3):
            await asyncio.sleep(0)
        together = wire.writes - writes
        answered = {s for t, f, s, _ in written(bytes(wire.out)) if t == HEADERS and f & END_STREAM}
        return alone, together, len(answered)

    alone, together, answered = asyncio.run(run())
    assert any(t == HEADERS and f & END_STREAM and s == 1 for t, f, s, _ in written(alone))
    assert (together, answered) == (1, 3)


async def _never_app(*_: Any) -> None:
    raise AssertionError("every call is answered by the fast path")


def test_a_message_past_the_limit_is_refused_before_its_bytes_are_sent(server: Server) -> None:
    """Only the 5-byte prefix of a 100 MB message is sent: the call is answered (and its
    stream reset, the client need send no more), and the connection serves the next call."""
    sock = h2_connect(server.ports["plain"])
    try:
        prefix = b"\0" + (100 << 20).to_bytes(4, "big")
        sock.sendall(h2frame(HEADERS, END_HEADERS, 1, grpc_headers(INFER_PATH))
                     + h2frame(DATA, 0, 1, prefix + b"z" * 10))  # fmt: skip
        seen = frames(sock, lambda seen: any(t == RST_STREAM and s == 1 for t, _, s, _ in seen))
        assert any(t == HEADERS and f & END_STREAM and s == 1 for t, f, s, _ in seen), seen
        assert (RST_STREAM, 0, 1, struct.pack(">I", 0)) in seen, seen
        sock.sendall(h2frame(HEADERS, END_HEADERS, 3, grpc_headers(INFER_PATH))
                     + h2frame(DATA, END_STREAM, 3, message(id_="next")))  # fmt: skip
        seen = frames(sock, ended(3))
        data = b"".join(p for t, _, s, p in seen if t == DATA and s == 3)
        assert pb.ModelInferResponse.FromString(data[5:]).id == "next:0"
    finally:
        sock.close()
    with grpc.insecure_channel(f"127.0.0.1:{server.ports['plain']}") as channel:
        big = pb.ModelInferRequest(model_name="m", raw_input_contents=[b"y" * (MAX_MESSAGE + 1)])
        with pytest.raises(grpc.RpcError) as refused:
            infer(channel, big)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "larger than max" in (refused.value.details() or "")


@pytest.mark.parametrize("leave", ["reset", "close"])
def test_a_client_that_resets_its_stream_or_leaves_cancels_the_call(
    server: Server, leave: str
) -> None:
    server.waiting.clear()
    server.cancelled.clear()
    channel = grpc.insecure_channel(f"127.0.0.1:{server.ports['plain']}")
    call = channel.unary_unary(
        INFER_PATH.decode(),
        request_serializer=pb.ModelInferRequest.SerializeToString,
        response_deserializer=pb.ModelInferResponse.FromString,
    ).future(pb.ModelInferRequest(model_name="wait"))
    assert server.waiting.wait(5)
    if leave == "reset":
        call.cancel()
    channel.close()
    assert server.cancelled.wait(2)  # at once, not at a timeout


def test_an_answer_behind_a_window_never_opened_resets_its_stream(server: Server) -> None:
    sock = h2_connect(server.ports["short"], initial=settings(initial_window_size=0))
    try:
        sock.sendall(h2frame(HEADERS, END_HEADERS, 1, grpc_headers(INFER_PATH))
                     + h2frame(DATA, END_STREAM, 1, message()))  # fmt: skip
        seen = frames(sock, lambda seen: any(t == RST_STREAM for t, _, _, _ in seen), 3.0)
    finally:
        sock.close()
    assert not any(t == DATA for t, _, _, _ in seen), seen
    assert any(t == RST_STREAM and s == 1 for t, _, s, _ in seen), seen


def test_an_idle_connection_is_closed_and_connections_past_the_limit_at_once(
    server: Server,
) -> None:
    first = h2_connect(server.ports["short"])
    second = h2_connect(server.ports["short"])
    third = h2_connect(server.ports["short"])
    try:
        assert frames(third, lambda seen: False, 2.0)[-1][0] == -1  # past max_connections
        seen = frames(first, lambda seen: False, 3.0)  # idle past 0.3 s
        assert seen[-1][0] == -1 and any(t == GOAWAY for t, _, _, _ in seen), seen
    finally:
        for sock in (first, second, third):
            sock.close()


def test_mutual_tls_offers_h2_and_needs_a_client_certificate(server: Server) -> None:
    pki = server.pki
    credentials = grpc.ssl_channel_credentials(
        pki["ca"].read_bytes(), pki["client_key"].read_bytes(), pki["client"].read_bytes()
    )
    with grpc.secure_channel(f"localhost:{server.ports['tls']}", credentials) as channel:
        assert infer(channel, pb.ModelInferRequest(model_name="m", id="tls")).id == "tls:0"
    context = ssl.create_default_context(cafile=str(pki["ca"]))
    context.load_cert_chain(pki["client"], pki["client_key"])
    context.set_alpn_protocols(["h2"])
    raw = socket.create_connection(("127.0.0.1", server.ports["tls"]), timeout=5)
    with context.wrap_socket(raw, server_hostname="localhost") as tls:
        assert tls.selected_alpn_protocol() == "h2"
    no_cert = grpc.ssl_channel_credentials(pki["ca"].read_bytes())
    with (
        grpc.secure_channel(f"localhost:{server.ports['tls']}", no_cert) as channel,
        pytest.raises(grpc.RpcError) as refused,
    ):
        infer(channel, pb.ModelInferRequest(model_name="m"))
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE

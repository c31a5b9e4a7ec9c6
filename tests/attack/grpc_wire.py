"""Harness for the gRPC attack tests: HTTP/2 frames written by hand, a well-behaved client
(HTTP keep-alive and a persistent gRPC channel, 1-row infer requests one after another)
measured before, during and after an attack on the real daemon, and issue 41's done criteria.
(No tests in here.)"""

from __future__ import annotations

import http.client
import json
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import tritonclient.grpc as grpcclient

from tests.attack.measure import Phase, rss, watch_after
from tests.integration.test_daemon_support import MODEL, Daemon, infer_doc, samples

#: Issue 41's done criteria: gRPC fails at most this share of the client's requests, HTTP none
MAX_GRPC_FAILED = 0.01
#: ... with a p99 within this many times its baseline, or this many seconds, whichever is more
P99_FACTOR = 20.0
P99_FLOOR = 0.050
#: ... and the daemon's resident memory grows by at most this much.
MAX_RSS_GROWTH = 300 << 20

#: ``attack(stop, in_place)``: see :func:`run_attack`.
Attack = Callable[[threading.Event, threading.Event], None]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0, 1, 3, 4, 6, 7, 8
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1
SETTINGS_INITIAL_WINDOW_SIZE = 4


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    """One HTTP/2 frame."""
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes([kind, flags])
        + struct.pack(">I", stream)
        + payload
    )


def literal(name: bytes, value: bytes) -> bytes:
    """An HPACK literal header field without indexing, new name, no Huffman (values < 127)."""
    assert len(name) < 127 and len(value) < 127
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


def grpc_headers(path: bytes) -> bytes:
    """The header block of a gRPC call to ``path``: POST, http, then literals."""
    fields = [(b":path", path), (b":authority", b"x"), (b"content-type", b"application/grpc"),
              (b"te", b"trailers")]  # fmt: skip
    return b"\x83\x86" + b"".join(literal(n, v) for n, v in fields)


def settings(**values: int) -> bytes:
    """A SETTINGS frame: ``initial_window_size=0`` and the like."""
    ids = {"initial_window_size": SETTINGS_INITIAL_WINDOW_SIZE, "max_concurrent_streams": 3}
    return frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", ids[k], v) for k, v in values.items()))


def h2_connect(port: int, *, initial: bytes = b"") -> socket.socket:
    """A TCP connection to ``port`` that has sent the preface, SETTINGS and ``initial``."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(PREFACE + settings() + frame(SETTINGS, ACK, 0) + initial)
    return sock


def _frames(sock: socket.socket, seconds: float) -> Iterator[tuple[int, int, bytes]]:
    """(type, stream, payload) of each frame the server sends within ``seconds`` or until it
    closes."""
    sock.settimeout(0.1)
    buf, ends = b"", time.monotonic() + seconds
    while time.monotonic() < ends:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError:
            break
        if not chunk:
            break
        buf += chunk
        while len(buf) >= 9:
            length = int.from_bytes(buf[:3], "big")
            if len(buf) < 9 + length:
                break
            yield buf[3], int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF, buf[9 : 9 + length]
            buf = buf[9 + length :]


def frames_seen(sock: socket.socket, seconds: float) -> list[tuple[int, int]]:
    """(type, stream) of each frame the server sends within ``seconds`` or until it closes."""
    return [(kind, stream) for kind, stream, _ in _frames(sock, seconds)]


def goaway_code(sock: socket.socket, seconds: float) -> int | None:
    """The error code of the first GOAWAY the server sends within ``seconds`` (None: none)."""
    for kind, _, payload in _frames(sock, seconds):
        if kind == GOAWAY:
            return int.from_bytes(payload[4:8], "big")
    return None


class WellBehaved:
    """Issue 41's client: HTTP on one keep-alive connection (a new one after a failure) and
    gRPC on one channel, each a thread sending a 1-row request, waiting for its answer, then
    pausing ``pause`` seconds. ``phase`` names where the counts go."""

    def __init__(self, daemon: Daemon, pause: float = 0.002) -> None:
        self.daemon, self.pause = daemon, pause
        self.phase = "before"
        self.seen: dict[tuple[str, str], Phase] = {}
        self._stop = threading.Event()
        pixels, _ = samples()
        self._body = json.dumps(infer_doc(pixels[:1])).encode()
        self._input = grpcclient.InferInput("pixels", [1, *pixels.shape[1:]], "FP32")
        self._input.set_data_from_numpy(pixels[:1].astype(np.float32))
        self._threads = [threading.Thread(target=t, daemon=True) for t in (self._http, self._grpc)]

    def at(self, protocol: str, phase: str) -> Phase:
        return self.seen.setdefault((protocol, phase), Phase())

    def _call(self, protocol: str, call: Callable[[], None]) -> None:
        phase, t0 = self.phase, time.perf_counter()
        try:
            call()
            self.at(protocol, phase).latencies.append(time.perf_counter() - t0)
        except Exception as exc:
            seen = self.at(protocol, phase)
            seen.failed += 1
            seen.errors.append(f"{type(exc).__name__}: {exc}"[:160])
            time.sleep(0.05)
        time.sleep(self.pause)

    def _http(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.daemon.port, timeout=5)

        def call() -> None:
            nonlocal conn
            try:
                conn.request("POST", f"/v2/models/{MODEL}/infer", self._body)
                resp = conn.getresponse()
                resp.read()
            except Exception:
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.daemon.port, timeout=5)
                raise
            if resp.status != 200:
                raise AssertionError(f"HTTP {resp.status}")

        while not self._stop.is_set():
            self._call("http", call)
        conn.close()

    def _grpc(self) -> None:
        with grpcclient.InferenceServerClient(f"127.0.0.1:{self.daemon.grpc_port}") as client:
            while not self._stop.is_set():
                self._call("grpc", lambda: client.infer(MODEL, [self._input], client_timeout=5))

    @contextmanager
    def running(self) -> Iterator[WellBehaved]:
        for t in self._threads:
            t.start()
        try:
            yield self
        finally:
            self._stop.set()
            for t in self._threads:
                t.join(10)

    def report(self) -> str:
        return "\n".join(f"{p} {ph}: {s}" for (p, ph), s in sorted(self.seen.items()))


def run_attack(
    daemon: Daemon, attack: Attack, *, seconds: float, onset: float = 30.0
) -> tuple[WellBehaved, int]:
    """Measure the well-behaved client for ``seconds`` before and during the attack, and after
    it until it is served again (:func:`tests.attack.measure.watch_after`):
    ``attack(stop, in_place)`` runs in a thread until ``stop`` is set and sets ``in_place``
    once it holds what it means to hold (at most ``onset`` seconds; the client's counts go to
    phase "onset" meanwhile). Return the client and the daemon's largest RSS growth (sampled
    every 0.1 s from the start of the attack) over the RSS before."""
    client, stop, in_place = WellBehaved(daemon), threading.Event(), threading.Event()
    thread = threading.Thread(target=attack, args=(stop, in_place), daemon=True)
    with client.running():
        time.sleep(seconds)
        start = peak = rss(daemon)
        client.phase = "onset"
        thread.start()
        ends = time.monotonic() + onset
        while not in_place.is_set() and time.monotonic() < ends:
            peak = max(peak, rss(daemon))
            time.sleep(0.05)
        assert in_place.is_set(), f"the attack was not in place within {onset} s"
        client.phase = "during"
        ends = time.monotonic() + seconds
        while time.monotonic() < ends:
            peak = max(peak, rss(daemon))
            time.sleep(0.1)
        stop.set()
        thread.join(30)
        client.phase = "after"

        def answered() -> int:
            return min(len(client.at(p, "after").latencies) for p in ("http", "grpc"))

        peak, _ = watch_after(daemon, answered, seconds, peak)
    print(client.report(), f"\nRSS growth {(peak - start) / 2**20:.0f} MiB")
    return client, peak - start


def assert_served(client: WellBehaved, rss_growth: int, daemon: Daemon) -> None:
    """Issue 41's done criteria for one attack (see the module's constants)."""
    assert daemon.proc.poll() is None, "the daemon died"
    for protocol in ("http", "grpc"):
        after = client.at(protocol, "after")
        assert after.latencies and not after.failed, f"{protocol} after the attack: {after}"
    http_, grpc_ = client.at("http", "during"), client.at("grpc", "during")
    assert http_.total and not http_.failed, f"HTTP during the attack: {http_}"
    assert grpc_.total and grpc_.failed <= MAX_GRPC_FAILED * grpc_.total, f"gRPC: {grpc_}"
    for protocol, during in (("http", http_), ("grpc", grpc_)):
        bound = max(P99_FACTOR * client.at(protocol, "before").p99(), P99_FLOOR)
        assert during.p99() <= bound, f"{protocol} p99 past {bound * 1e3:.0f} ms: {during}"
    assert rss_growth <= MAX_RSS_GROWTH, f"RSS grew {rss_growth / 2**20:.0f} MiB"


def infer_message(rows: int = 1) -> bytes:
    """A ModelInfer request of ``rows`` demo rows, framed as one gRPC message."""
    from model_runtime.server.triton import grpc_service_pb2 as pb

    pixels, _ = samples()
    rows_ = pixels[:rows].astype(np.float32)
    tensor = pb.ModelInferRequest.InferInputTensor(
        name="pixels", datatype="FP32", shape=list(rows_.shape)
    )
    request = pb.ModelInferRequest(
        model_name=MODEL, inputs=[tensor], raw_input_contents=[rows_.tobytes()]
    )
    body = request.SerializeToString()
    return b"\x00" + struct.pack(">I", len(body)) + body


INFER_PATH = b"/inference.GRPCInferenceService/ModelInfer"


def infer_calls(first_stream: int, count: int, message: bytes) -> bytes:
    """``count`` ModelInfer calls on streams ``first_stream``, +2, ...: HEADERS, then DATA."""
    headers = grpc_headers(INFER_PATH)
    out = []
    for i in range(count):
        stream = first_stream + 2 * i
        out.append(frame(HEADERS, END_HEADERS, stream, headers))
        out.append(frame(DATA, END_STREAM, stream, message))
    return b"".join(out)


def hold(
    socks: list[socket.socket],
    stop: threading.Event,
    in_place: threading.Event,
    streams: int,
    message: bytes,
    in_place_at: int,
) -> None:
    """Keep ``streams`` ModelInfer calls open on each of ``socks`` (connections that opened a
    zero window), reading what the server sends and never opening a window, until ``stop``:
    a call the server ends (refused, reset) is replaced by a new one. Set ``in_place`` once
    ``in_place_at`` calls in all have answers begun (HEADERS) that wait."""
    import selectors

    sel = selectors.DefaultSelector()
    n = len(socks)
    inbuf, outbuf = [b""] * n, [b""] * n
    next_stream = [1 + 2 * streams] * n
    held: list[set[int]] = [set() for _ in range(n)]
    for i, s in enumerate(socks):
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, i)
    while not stop.is_set():
        for key, events in sel.select(0.05):
            i, sock = key.data, key.fileobj
            assert isinstance(sock, socket.socket)
            if events & selectors.EVENT_WRITE and outbuf[i]:
                try:
                    outbuf[i] = outbuf[i][sock.send(outbuf[i]) :]
                except BlockingIOError:
                    pass
            if not events & selectors.EVENT_READ:
                continue
            try:
                chunk = sock.recv(1 << 16)
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""
            if not chunk:
                sel.unregister(sock)
                continue
            buf = inbuf[i] + chunk
            while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
                kind, flags = buf[3], buf[4]
                stream = int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
                if kind == HEADERS and not flags & END_STREAM:
                    held[i].add(stream)
                elif stream and (kind == RST_STREAM or flags & END_STREAM):
                    held[i].discard(stream)
                    outbuf[i] += infer_calls(next_stream[i], 1, message)
                    next_stream[i] += 2
                buf = buf[9 + int.from_bytes(buf[:3], "big") :]
            inbuf[i] = buf
            mask = selectors.EVENT_READ | (selectors.EVENT_WRITE if outbuf[i] else 0)
            sel.modify(sock, mask, i)
        if sum(map(len, held)) >= in_place_at:
            in_place.set()
    sel.close()

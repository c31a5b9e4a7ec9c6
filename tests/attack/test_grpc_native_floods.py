"""HTTP/2 abuse against the native gRPC transport (nghttp2, or h2corn where
``MODEL_RUNTIME_GRPC_TRANSPORT=native``; otherwise the defaults), the way servers are
attacked: rapid reset (CVE-2023-44487), PING, SETTINGS and CONTINUATION floods, and
connections that never open their flow-control window while holding every stream they may.
During each, the well-behaved client (HTTP and gRPC) is served within issue 41's bounds, and
after it as before. Short here; full size with --long."""

from __future__ import annotations

import os
import socket
import struct
import threading
from collections.abc import Callable, Iterator

import pytest

from tests.attack.grpc_wire import (
    END_HEADERS,
    HEADERS,
    INFER_PATH,
    PING,
    RST_STREAM,
    assert_served,
    frame,
    grpc_headers,
    h2_connect,
    hold,
    infer_calls,
    infer_message,
    literal,
    run_attack,
    settings,
)
from tests.integration.test_daemon_support import Daemon, start_daemon, stop_daemon

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

CONTINUATION = 9
CANCEL = struct.pack(">I", 8)
#: (seconds of each phase, make test) and (the same, --long).
SHORT, LONG = 1.0, 10.0


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    # A native transport: nghttp2 (the default), or h2corn where the environment chooses it.
    native = "native" if os.environ.get("MODEL_RUNTIME_GRPC_TRANSPORT") == "native" else "nghttp2"
    d = start_daemon(tmp_path_factory.mktemp("native_floods"), "--grpc-transport", native)
    yield d
    stop_daemon(d)


@pytest.fixture(params=[pytest.param(SHORT), pytest.param(LONG, marks=pytest.mark.long)])
def seconds(request: pytest.FixtureRequest) -> float:
    return float(request.param)


def flooding(port: int, first: bytes, again: Callable[[int], bytes], sent: list[int]) -> object:
    """An attack: a connection that sends ``first``, then ``again(i)`` for i = 0, 1, ... as
    fast as the server takes it; a new connection when the server closes one."""

    def attack(stop: threading.Event, in_place: threading.Event) -> None:
        while not stop.is_set():
            try:
                sock = h2_connect(port, initial=first)
                sock.settimeout(1.0)
                in_place.set()
                i = 0
                while not stop.is_set():
                    sock.sendall(again(i))
                    sent.append(1)
                    i += 1
            except OSError:
                pass
            finally:
                sock.close()

    return attack


def _judge(daemon: Daemon, attack: object, seconds: float, sent: list[int]) -> None:
    client, growth = run_attack(daemon, attack, seconds=seconds)  # type: ignore[arg-type]
    print(f"{len(sent)} writes of the attack")
    assert sent, "the attack sent nothing"
    assert_served(client, growth, daemon)
    assert daemon.get("/v2/health/ready")[0] == 200


def test_rapid_reset(daemon: Daemon, seconds: float) -> None:
    headers = grpc_headers(INFER_PATH)
    burst = b"".join(
        frame(HEADERS, END_HEADERS, s, headers) + frame(RST_STREAM, 0, s, CANCEL)
        for s in range(1, 400, 2)
    )

    def again(i: int) -> bytes:  # the next 200 streams, opened and reset at once
        base = 401 + 400 * i
        return b"".join(
            frame(HEADERS, END_HEADERS, s, headers) + frame(RST_STREAM, 0, s, CANCEL)
            for s in range(base, base + 400, 2)
        )

    sent: list[int] = []
    _judge(daemon, flooding(daemon.grpc_port, burst, again, sent), seconds, sent)


def test_ping_flood(daemon: Daemon, seconds: float) -> None:
    pings = b"".join(frame(PING, 0, 0, struct.pack(">Q", n)) for n in range(500))
    sent: list[int] = []
    _judge(daemon, flooding(daemon.grpc_port, b"", lambda i: pings, sent), seconds, sent)


def test_settings_flood(daemon: Daemon, seconds: float) -> None:
    flood = settings(initial_window_size=65535) * 500
    sent: list[int] = []
    _judge(daemon, flooding(daemon.grpc_port, b"", lambda i: flood, sent), seconds, sent)


def test_continuation_flood(daemon: Daemon, seconds: float) -> None:
    """One header block that never ends: HEADERS without END_HEADERS, then CONTINUATION frames
    of new header fields, forever (the 2024 CONTINUATION flood)."""
    opening = frame(HEADERS, 0, 1, grpc_headers(INFER_PATH))
    more = frame(CONTINUATION, 0, 1, b"".join(literal(b"x-%d" % n, b"y" * 100) for n in range(80)))
    sent: list[int] = []
    _judge(daemon, flooding(daemon.grpc_port, opening, lambda i: more * 8, sent), seconds, sent)


@pytest.mark.long
def test_window_never_opened(daemon: Daemon, seconds: float) -> None:
    """20 connections with a zero window, each keeping 256 ModelInfer calls open (a call the
    server ends is sent again), never reading an answer. In place once 1,000 answers wait
    unread. Each connection's share holds (``server/grpc/shares.py``): few of its calls are
    computed at once, its refusals are sent as its calls end (not at once, which would make its
    resent calls a flood), answers stalled past the write timeout end their streams, and
    admission refuses the crowded connections' calls, not the well-behaved client's."""
    message = infer_message()

    def attack(stop: threading.Event, in_place: threading.Event) -> None:
        socks: list[socket.socket] = []
        try:
            for _ in range(20):
                socks.append(
                    h2_connect(
                        daemon.grpc_port,
                        initial=settings(initial_window_size=0) + infer_calls(1, 256, message),
                    )
                )
            hold(socks, stop, in_place, 256, message, 1000)
        finally:
            for s in socks:
                s.close()

    client, growth = run_attack(daemon, attack, seconds=seconds)
    assert_served(client, growth, daemon)

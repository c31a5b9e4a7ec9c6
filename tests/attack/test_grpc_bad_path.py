"""Issue 41, attack 1: HTTP/2 HEADERS frames whose ``:path`` is not UTF-8, on the gRPC port of
the real daemon (default settings), cost their own stream only: the listener goes on serving
the well-behaved client, which fails nothing; the daemon stays ready."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from tests.attack.grpc_wire import (
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    RST_STREAM,
    assert_served,
    frame,
    frames_seen,
    grpc_headers,
    h2_connect,
    run_attack,
)
from tests.integration.test_daemon_support import Daemon, start_daemon, stop_daemon

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

BAD_PATH = b"/\xff\xfe"
#: Bad calls made during the traffic test's attack, at the least.
MIN_BAD_CALLS = 20


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_daemon(tmp_path_factory.mktemp("bad_path"))
    yield d
    stop_daemon(d)


def bad_call(port: int, wait: float = 1.0) -> list[tuple[int, int]]:
    """One connection, one call with a non-UTF-8 ``:path``: the frames the server answered."""
    sock = h2_connect(
        port, initial=frame(HEADERS, END_HEADERS | END_STREAM, 1, grpc_headers(BAD_PATH))
    )
    try:
        return frames_seen(sock, wait)
    finally:
        sock.close()


def test_a_bad_path_resets_its_stream_and_the_port_serves_on(daemon: Daemon) -> None:
    seen = bad_call(daemon.grpc_port)
    assert (RST_STREAM, 1) in seen, seen  # its own stream ends ...
    assert not any(kind == GOAWAY for kind, _ in seen), seen  # ... its connection need not
    assert daemon.get("/v2/health/ready")[0] == 200
    events = daemon.events()
    (listening,) = (e for e in events if e.get("event") == "daemon_listening")
    if listening["grpc_transport"] == "aio":  # our guard dropped it (native: never decoded)
        assert any(e.get("event") == "grpc_call_dropped_bad_method_name" for e in events)


def test_bad_paths_during_traffic_cost_the_client_nothing(daemon: Daemon) -> None:
    def attack(stop: threading.Event, in_place: threading.Event) -> None:
        in_place.set()
        # At least MIN_BAD_CALLS, however slowly a loaded host lets them go: the client's
        # "during" phase lasts until this thread ends (run_attack joins it first).
        while not stop.is_set() or len(sent) < MIN_BAD_CALLS:
            sent.append(bad_call(daemon.grpc_port, 0.02))

    sent: list[object] = []
    client, growth = run_attack(daemon, attack, seconds=2.0)
    assert len(sent) >= MIN_BAD_CALLS
    assert_served(client, growth, daemon)
    assert daemon.get("/v2/health/ready")[0] == 200
    assert not any(e.get("event") == "listener_stopped" for e in daemon.events())

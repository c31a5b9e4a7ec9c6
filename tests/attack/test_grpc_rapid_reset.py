"""Issue 41, attack 4: rapid reset (CVE-2023-44487): ModelInfer calls opened and reset at
once, 200 per connection, then a new connection, for a few seconds; the well-behaved client is
measured throughout (real daemon, default settings: the native transport, whose HTTP/2 layer
counts and refuses resets). grpc.aio (``--grpc-transport aio``) still fails this: grpc's core
takes every stream (about a million in 4 s here) on the threads the daemon's event loop needs,
and no server option of grpc.aio tried (max_requests_per_read, max_pending_requests) changed
that. Runs with --long."""

from __future__ import annotations

import struct
import threading
from collections.abc import Iterator

import pytest

from tests.attack.grpc_wire import (
    END_HEADERS,
    HEADERS,
    INFER_PATH,
    RST_STREAM,
    assert_served,
    frame,
    grpc_headers,
    h2_connect,
    run_attack,
)
from tests.integration.test_daemon_support import Daemon, start_daemon, stop_daemon

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow, pytest.mark.long]

PER_CONNECTION = 200
CANCEL = struct.pack(">I", 8)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_daemon(tmp_path_factory.mktemp("rapid_reset"))
    yield d
    stop_daemon(d)


def rapid_reset(port: int, sent: list[int]) -> object:
    headers = grpc_headers(INFER_PATH)
    burst = b"".join(
        frame(HEADERS, END_HEADERS, s, headers) + frame(RST_STREAM, 0, s, CANCEL)
        for s in range(1, 2 * PER_CONNECTION, 2)
    )

    def attack(stop: threading.Event, in_place: threading.Event) -> None:
        in_place.set()
        while not stop.is_set():
            try:
                sock = h2_connect(port, initial=burst)
                sock.close()
                sent.append(PER_CONNECTION)
            except OSError:
                pass

    return attack


def test_rapid_reset_costs_the_client_at_most_one_percent(daemon: Daemon) -> None:
    sent: list[int] = []
    client, growth = run_attack(daemon, rapid_reset(daemon.grpc_port, sent), seconds=4.0)  # type: ignore[arg-type]
    print(f"{sum(sent)} streams opened and reset")
    assert_served(client, growth, daemon)

"""Issue 41, attack 3: idle gRPC connections past gRPC's connection limit (the issue's 20,000,
scaled to the limit and 256 more). grpc closes those past its limit at once, so the daemon's
descriptors stay bounded: new HTTP connections are taken throughout, the well-behaved client
is served, and a new gRPC connection is taken once the idle ones go."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import tritonclient.grpc as grpcclient

from model_runtime.server.grpc.server import grpc_max_connections
from model_runtime.server.security.fdlimit import default_max_connections
from tests.attack.grpc_wire import assert_served, h2_connect, run_attack
from tests.integration.test_daemon_support import Daemon, start_daemon, stop_daemon

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

#: The daemon's gRPC connection limit with this machine's open-file limit (the daemon raises
#: its soft limit to the hard one, as this test process does below).
EXTRA = 256


def open_fds(daemon: Daemon) -> int:
    return len(os.listdir(f"/proc/{daemon.proc.pid}/fd"))


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_daemon(tmp_path_factory.mktemp("idle"))
    yield d
    stop_daemon(d)


def test_idle_grpc_connections_past_the_limit_cost_no_descriptors(daemon: Daemon) -> None:
    from model_runtime.server.security.fdlimit import raise_open_file_limit

    raise_open_file_limit()
    limit = grpc_max_connections(default_max_connections())
    before = open_fds(daemon)
    peak = [before]
    http_during: list[int] = []

    def attack(stop: threading.Event, in_place: threading.Event) -> None:
        socks: list[socket.socket] = []
        try:
            for _ in range(limit + EXTRA):
                try:
                    socks.append(h2_connect(daemon.grpc_port))
                except OSError:
                    pass
            in_place.set()
            while not stop.is_set():
                peak[0] = max(peak[0], open_fds(daemon))
                http_during.append(daemon.get("/v2/health/ready")[0])  # a new connection
                time.sleep(0.2)
        finally:
            for s in socks:
                s.close()

    client, growth = run_attack(daemon, attack, seconds=3.0)
    assert_served(client, growth, daemon)
    assert http_during and set(http_during) == {200}
    assert peak[0] <= before + limit + 64, (peak[0], before, limit)
    with grpcclient.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}") as fresh:
        assert fresh.is_server_ready()

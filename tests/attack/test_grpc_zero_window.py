"""Issue 41, attack 2: connections that open a zero flow-control window and keep as many
ModelInfer calls open as their streams allow (a call refused is sent again), never reading an
answer. Their answers wait on them;
they must not hold the slots other clients need: once every call is answered (or refused) and
its answer waits, the well-behaved client is served as before (real daemon, default settings).
Scaled down from the issue's 24 x 256 held 40 s to 20 x 256 (past grpc's old limit of 4,096
calls in flight) held 3 s. (While the burst of calls is accepted the client waits behind it:
the "onset" phase, not judged here; on the native transport a connection that has not had an
answer written gets few calls computed at once, so the burst reaches the models slowly.)"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from tests.attack.grpc_wire import (
    assert_served,
    h2_connect,
    hold,
    infer_calls,
    infer_message,
    run_attack,
    settings,
)
from tests.integration.test_daemon_support import Daemon, start_daemon, stop_daemon

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

STREAMS = 256
#: Answers waiting before the attack is in place: what grpc's own limit (4,096) would allow.
HELD = 4000


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_daemon(tmp_path_factory.mktemp("zero_window"))
    yield d
    stop_daemon(d)


@pytest.mark.parametrize(
    ("connections", "seconds"),
    # Both in `make attack` (--long) only: each holds the attack for 3 x 3 s and 3 x 40 s, past
    # `make test`'s time.
    [
        pytest.param(20, 3.0, marks=pytest.mark.long),
        pytest.param(24, 40.0, marks=pytest.mark.long),  # the size
    ],
)
def test_answers_no_one_reads_do_not_hold_the_slots_others_need(
    daemon: Daemon, connections: int, seconds: float
) -> None:
    message = infer_message()

    def attack(stop: threading.Event, in_place: threading.Event) -> None:
        socks: list[socket.socket] = []
        try:
            for _ in range(connections):
                socks.append(
                    h2_connect(
                        daemon.grpc_port,
                        initial=settings(initial_window_size=0) + infer_calls(1, STREAMS, message),
                    )
                )
            hold(socks, stop, in_place, STREAMS, message, HELD)
        finally:
            for s in socks:
                s.close()

    client, growth = run_attack(daemon, attack, seconds=seconds)
    assert_served(client, growth, daemon)

"""Issue 41: more slow clients than the connection cap (4,096 by default), each sending a
request head one byte every 2 s and replaced as soon as it is closed, must not keep a client
that sends whole requests from being served."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.attack.http_wire import PATH, assert_served, attack_daemon, run_attack
from tests.integration.test_daemon_support import Daemon, stop_daemon

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

#: The attack: this many connections (past the default cap of 4,096), a byte every 2 s.
CONNECTIONS = 4200
EVERY = 2.0
HEAD = f"POST {PATH} HTTP/1.1\r\nHost: x\r\nX-Slow: {'s' * 200}\r\n".encode()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = attack_daemon(tmp_path_factory.mktemp("slowloris"))
    yield d
    stop_daemon(d)


def _slowloris(daemon: Daemon, stop: threading.Event) -> threading.Thread:
    """A thread that keeps ``CONNECTIONS`` connections sending a head a byte at a time,
    opening a new one for each that is closed or refused, until ``stop``."""

    def connect() -> socket.socket | None:
        try:
            sock = socket.create_connection(("127.0.0.1", daemon.port), timeout=1)
        except OSError:
            return None
        sock.setblocking(False)
        return sock

    def attack() -> None:
        socks: list[tuple[socket.socket | None, int]] = []
        try:
            while not stop.is_set():
                round_ends = time.monotonic() + EVERY
                while len(socks) < CONNECTIONS and not stop.is_set():
                    socks.append((connect(), 0))
                for i, (sock, sent) in enumerate(socks):
                    if stop.is_set():
                        return
                    try:
                        if sock is None:
                            raise OSError
                        sock.send(HEAD[sent % len(HEAD) : sent % len(HEAD) + 1])
                        socks[i] = (sock, sent + 1)
                    except OSError:
                        if sock is not None:
                            sock.close()
                        socks[i] = (connect(), 0)  # refilled
                stop.wait(max(0.0, round_ends - time.monotonic()))
        finally:
            for sock, _ in socks:
                if sock is not None:
                    sock.close()

    return threading.Thread(target=attack, daemon=True)


def test_slow_heads_past_the_cap_do_not_shut_out_a_client_that_sends_whole_requests(
    daemon: Daemon,
) -> None:
    stop = threading.Event()
    client, growth = run_attack(daemon, _slowloris(daemon, stop), stop, seconds=8)
    assert_served(client, growth, daemon)

"""Issue 41: one HTTP/1.1 connection that pipelines 1-row infer requests as fast as it can
(reading the answers, or never reading them) must cost the daemon what its requests cost, no
more: the well-behaved client keeps its latency and the daemon its memory."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from tests.attack.http_wire import assert_served, attack_daemon, infer_request, run_attack
from tests.integration.test_daemon_support import Daemon, stop_daemon

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = attack_daemon(tmp_path_factory.mktemp("pipelining"))
    yield d
    stop_daemon(d)


def _pipeliner(daemon: Daemon, stop: threading.Event, *, reads: bool) -> threading.Thread:
    """A thread that sends pipelined requests on one connection until ``stop`` (and, if
    ``reads``, reads whatever comes back, as fast as it comes)."""
    blob = infer_request() * 2000

    def read(sock: socket.socket) -> None:
        while not stop.is_set():
            try:
                if not sock.recv(1 << 20):
                    return
            except TimeoutError:
                continue
            except OSError:
                return

    def attack() -> None:
        sock = socket.create_connection(("127.0.0.1", daemon.port))
        sock.settimeout(0.2)
        reader = threading.Thread(target=read, args=(sock,), daemon=True)
        if reads:
            reader.start()
        view = memoryview(blob)
        sent = 0
        try:
            while not stop.is_set():
                try:
                    sent += sock.send(view[sent % len(blob) :])
                except TimeoutError:
                    continue
                except OSError:
                    return
        finally:
            stop.set()
            if reads:
                reader.join(5)
            sock.close()

    return threading.Thread(target=attack, daemon=True)


@pytest.mark.parametrize("reads", [True, False], ids=["reads", "never-reads"])
def test_a_pipelining_connection_does_not_slow_the_others(daemon: Daemon, reads: bool) -> None:
    stop = threading.Event()
    client, growth = run_attack(daemon, _pipeliner(daemon, stop, reads=reads), stop, seconds=3)
    assert_served(client, growth, daemon)


@pytest.mark.long
@pytest.mark.timeout(300)
@pytest.mark.parametrize("reads", [True, False], ids=["reads", "never-reads"])
def test_a_pipelining_connection_for_20_s_does_not_slow_the_others(
    daemon: Daemon, reads: bool
) -> None:
    """The issue's run: 20 s of attack (the memory it held grew with time)."""
    stop = threading.Event()
    client, growth = run_attack(daemon, _pipeliner(daemon, stop, reads=reads), stop, seconds=20)
    assert_served(client, growth, daemon)

"""Issue 41: clients that send most of a large body (60 of 64 MiB) and stop must not hold the
daemon's memory: bodies not yet in hand count against a memory budget, and a request past it
is refused at once (503), its body not buffered."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from tests.attack.http_wire import PATH, assert_served, attack_daemon, run_attack
from tests.integration.test_daemon_support import Daemon, read_raw_answer, stop_daemon

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

#: The attack: this many connections each announce ``ANNOUNCED`` bytes, send ``SENT``, wait.
CLIENTS = 32
ANNOUNCED = 64 << 20
SENT = 60 << 20


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = attack_daemon(tmp_path_factory.mktemp("bodies"))
    yield d
    stop_daemon(d)


def _hanging_bodies(daemon: Daemon, stop: threading.Event) -> tuple[threading.Thread, list[int]]:
    """A thread that opens ``CLIENTS`` connections, each sending ``SENT`` bytes of a body of
    ``ANNOUNCED`` and then nothing until ``stop``; and the statuses of the answers they
    were given meanwhile (filled in as the attack ends)."""
    head = f"POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: {ANNOUNCED}\r\n\r\n".encode()
    chunk = b"0" * (1 << 20)
    statuses: list[int] = []

    def one(socks: list[socket.socket]) -> None:
        try:
            sock = socket.create_connection(("127.0.0.1", daemon.port), timeout=20)
            socks.append(sock)
            sock.sendall(head)
            for _ in range(SENT // len(chunk)):
                if stop.is_set():
                    return
                sock.sendall(chunk)
        except OSError:
            return

    def attack() -> None:
        socks: list[socket.socket] = []
        senders = [threading.Thread(target=one, args=(socks,), daemon=True) for _ in range(CLIENTS)]
        for t in senders:
            t.start()
        stop.wait()
        for t in senders:
            t.join(20)
        for sock in socks:
            sock.settimeout(0.5)
            try:
                statuses.append(read_raw_answer(sock, bytearray())[0])
            except (OSError, AssertionError):
                pass
            sock.close()

    return threading.Thread(target=attack, daemon=True), statuses


def test_hanging_bodies_are_refused_past_the_memory_budget_not_buffered(daemon: Daemon) -> None:
    stop = threading.Event()
    attack, statuses = _hanging_bodies(daemon, stop)
    client, growth = run_attack(daemon, attack, stop, seconds=8)
    assert_served(client, growth, daemon)
    # Those refused were told why, in Triton's words (the others still wait for their body).
    assert statuses and set(statuses) == {503}, statuses
    print(f"{len(statuses)} of {CLIENTS} refused at once")
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=5) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        text = read_raw_answer(sock, bytearray())[2].decode()
    assert "model_runtime_http_requests_refused_memory_budget_total" in text

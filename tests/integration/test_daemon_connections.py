"""The real daemon's connection limits and logs, over loopback: slow request heads are closed
while it serves, one access line per request, no request id in the logs of what a /load
started, and HTTP/2 on the HTTP port costs one warning line, never a traceback."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_daemon_support import MODEL, Daemon, infer_doc, running, samples, wait_for

from model_runtime.server.daemon.options import DaemonOptions
from model_runtime.server.http.connection import H2_PREFACE

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]
HEADER_TIMEOUT = 1.0  # shortened for the test; the default is pinned below


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    args = ["--header-timeout", str(HEADER_TIMEOUT), "--model-control-mode", "explicit"]
    with running(tmp_path_factory.mktemp("conns"), *args, "--load-model", MODEL) as d:
        yield d


def _connect(daemon: Daemon) -> socket.socket:
    return socket.create_connection(("127.0.0.1", daemon.port), timeout=10)


def _closed_within(sock: socket.socket, limit: float) -> float:
    """Seconds until the daemon closes ``sock`` (EOF or reset); fails past ``limit``."""
    t0 = time.monotonic()
    sock.settimeout(limit)
    try:
        while sock.recv(1024):
            pass
    except ConnectionError:
        pass
    return time.monotonic() - t0


def test_the_default_header_timeout_is_at_most_30_s() -> None:
    assert DaemonOptions().header_timeout <= 30


def test_dribbled_heads_are_closed_while_the_daemon_serves(daemon: Daemon) -> None:
    socks = [_connect(daemon) for _ in range(36)]
    t0 = time.monotonic()
    for s in socks:
        s.sendall(b"POST /v2/models/x/infer HTTP/1.1\r\nHost: a\r\n")
    pixels, _ = samples()
    for i in range(3):  # a good client is served meanwhile
        for s in socks[i::3]:
            try:
                s.sendall(b"X-Drip: 1\r\n")
            except OSError:
                pass
        status, out = daemon.post(f"/v2/models/{MODEL}/infer", infer_doc(pixels[:2]))
        assert status == 200, out
        time.sleep(0.2)
    for s in socks:
        _closed_within(s, HEADER_TIMEOUT + 5)
        s.close()
    assert time.monotonic() - t0 < HEADER_TIMEOUT + 5
    assert daemon.get("/v2/health/live")[0] == 200


def test_one_access_line_per_request_and_no_request_id_past_a_load(daemon: Daemon) -> None:
    import urllib.request

    req = urllib.request.Request(
        daemon.url(f"/v2/repository/models/{MODEL}/load"),
        data=b"{}",
        method="POST",
        headers={"X-Request-ID": "load-abc"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.status == 200 and resp.headers["X-Request-ID"] == "load-abc"
    pixels, _ = samples()
    assert daemon.post(f"/v2/models/{MODEL}/infer", infer_doc(pixels[:3]))[0] == 200

    def access_lines() -> list[dict[str, object]]:
        return [e for e in daemon.events() if e.get("event") == "http_request"]

    def infer_logged_after_load() -> bool:  # lines come in batches, in order
        ids = [e["request_id"] for e in access_lines()]
        return "load-abc" in ids and any(
            e["path"].endswith("/infer") for e in access_lines()[ids.index("load-abc") :]
        )

    wait_for(infer_logged_after_load, 10, "logs")
    load = [e for e in access_lines() if e["request_id"] == "load-abc"]
    assert len(load) == 1 and load[0]["status"] == 200 and load[0]["method"] == "POST"
    assert isinstance(load[0]["duration_ms"], float) and load[0]["level"] == "info"
    # What the load started (the new version's runner, its actors) logs without its id.
    started = [e for e in daemon.events() if e.get("event") == "runner_started"]
    assert len(started) >= 2
    leaked = [e for e in daemon.events() if e.get("request_id") == "load-abc"]
    assert leaked == load, leaked


def test_http2_on_the_http_port_is_one_warning_not_a_traceback(daemon: Daemon) -> None:
    for _ in range(3):
        s = _connect(daemon)
        s.sendall(H2_PREFACE + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        data = b""
        while chunk := s.recv(4096):
            data += chunk
        s.close()
        assert data[3] == 0x04 and data[12] == 0x07  # SETTINGS, then GOAWAY
    s = _connect(daemon)
    s.sendall(b"GARBAGE\x01\x02 / HTTP/1.1\r\n\r\n")
    assert s.recv(4096).split(b" ")[1] == b"400"
    s.close()
    assert daemon.get("/v2/health/live")[0] == 200
    text = daemon.log_path.read_text()
    assert "Traceback" not in text
    warned = [e["event"] for e in daemon.events() if e.get("level") == "warning"]
    assert warned.count("http2_preface_refused") == 1


def test_the_access_log_can_be_turned_off(tmp_path: Path) -> None:
    with running(tmp_path, "--no-access-log") as d:
        assert d.get("/v2/health/live")[0] == 200
        assert d.get("/v2/health/ready")[0] == 200
    assert not [e for e in d.events() if e.get("event") == "http_request"]

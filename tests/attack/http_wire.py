"""Harness for the HTTP attack tests: a well-behaved client (HTTP keep-alive and a persistent
gRPC channel, 1-row infer requests one after another) measured before, during and after an
attack on the real daemon, and the daemon's resident memory. (No tests in here.)"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from tests.attack.measure import BEFORE_S, Phase, rss, watch_after
from tests.integration.test_daemon_support import (
    MODEL,
    Daemon,
    infer_doc,
    read_raw_answer,
    samples,
    start_daemon,
)

PATH = f"/v2/models/{MODEL}/infer"
#: The done criteria of issue 41: HTTP fails at most this share of its requests ...
MAX_HTTP_FAILED = 0.01
#: ... with a p99 within this many times its baseline, or this many seconds, whichever is more
P99_FACTOR = 20.0
P99_FLOOR = 0.050
#: ... (and, here, either protocol's rate of requests falls at most this many times) ...
MAX_SLOWDOWN = 4
#: ... and the daemon's resident memory grows by at most this much.
MAX_RSS_GROWTH = 300 * 10**6


def attack_daemon(tmp_path: Path, *args: str) -> Daemon:
    """The daemon with the default settings (and ``args``), on devices of its own: a
    module-scoped daemon starts before the per-test device directory is set."""
    devices = tmp_path / "devices"
    devices.mkdir()
    env = {"MODEL_RUNTIME_DIR": str(devices), "MODEL_RUNTIME_DEVICES": "cpu:4x1"}
    return start_daemon(tmp_path, *args, env=env)


def infer_request(rows: int = 1, *, close: bool = False) -> bytes:
    """One plain HTTP/1.1 JSON infer request of ``rows`` demo rows."""
    pixels, _ = samples()
    body = json.dumps(infer_doc(pixels[:rows])).encode()
    extra = "Connection: close\r\n" if close else ""
    head = f"POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    return head.encode() + body


class WellBehaved:
    """The client of issue 41: HTTP on one keep-alive connection (a new one after a failure)
    and gRPC on one channel, each a thread sending a 1-row request, waiting for its answer,
    then pausing ``pause`` seconds. ``phase`` names where the counts go."""

    def __init__(self, daemon: Daemon, pause: float = 0.002) -> None:
        self.daemon = daemon
        self.pause = pause
        self.phase = "before"
        self.seen: dict[tuple[str, str], Phase] = {}
        #: Seconds each phase was measured (set by :func:`run_attack`).
        self.lasted: dict[str, float] = {}
        self._stop = threading.Event()
        self._request = infer_request()
        pixels, _ = samples()
        inp = grpcclient.InferInput("pixels", [1, pixels.shape[1]], "FP32")
        inp.set_data_from_numpy(pixels[:1].astype(np.float32))
        self._grpc_inputs = [inp]
        self._threads = [
            threading.Thread(target=self._http, daemon=True),
            threading.Thread(target=self._grpc, daemon=True),
        ]

    def at(self, protocol: str, phase: str | None = None) -> Phase:
        return self.seen.setdefault((protocol, phase or self.phase), Phase())

    def _http(self) -> None:
        sock: socket.socket | None = None
        buf = bytearray()
        while not self._stop.is_set():
            phase = self.phase
            t0 = time.perf_counter()
            try:
                if sock is None:
                    sock = socket.create_connection(("127.0.0.1", self.daemon.port), timeout=5)
                    buf = bytearray()
                sock.sendall(self._request)
                status, _, body = read_raw_answer(sock, buf)
                if status != 200:
                    raise AssertionError(f"{status} {body[:80]!r}")
                self.at("http", phase).latencies.append(time.perf_counter() - t0)
            except (OSError, AssertionError) as exc:
                seen = self.at("http", phase)
                seen.failed += 1
                seen.errors.append(repr(exc)[:120])
                if sock is not None:
                    sock.close()
                sock = None
                time.sleep(0.05)
            time.sleep(self.pause)
        if sock is not None:
            sock.close()

    def _grpc(self) -> None:
        with grpcclient.InferenceServerClient(f"127.0.0.1:{self.daemon.grpc_port}") as client:
            while not self._stop.is_set():
                phase = self.phase
                t0 = time.perf_counter()
                try:
                    client.infer(MODEL, self._grpc_inputs, client_timeout=5)
                    self.at("grpc", phase).latencies.append(time.perf_counter() - t0)
                except Exception as exc:
                    seen = self.at("grpc", phase)
                    seen.failed += 1
                    seen.errors.append(repr(exc)[:120])
                    time.sleep(0.05)
                time.sleep(self.pause)

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
    daemon: Daemon, attack: threading.Thread, stop: threading.Event, *, seconds: float
) -> tuple[WellBehaved, int]:
    """Measure the well-behaved client before the attack (at most :data:`BEFORE_S`), during it
    (``attack`` running ``seconds`` until ``stop`` is set) and after it, until it is served
    again (:func:`watch_after`); returns it and the daemon's largest RSS growth (sampled every
    0.1 s from the start of the attack) over the RSS before. ``client.lasted`` holds how long
    each phase was measured."""
    client = WellBehaved(daemon)
    with client.running():
        t0 = time.monotonic()
        time.sleep(min(seconds, BEFORE_S))
        start = rss(daemon)
        client.phase = "during"
        t1 = time.monotonic()
        attack.start()
        peak = start
        ends = t1 + seconds
        while time.monotonic() < ends:
            peak = max(peak, rss(daemon))
            time.sleep(0.1)
        stop.set()
        attack.join(30)
        client.phase = "after"
        t2 = time.monotonic()
        client.lasted = {"before": t1 - t0, "during": t2 - t1}

        def answered() -> int:
            return min(len(client.at(p, "after").latencies) for p in ("http", "grpc"))

        peak, client.lasted["after"] = watch_after(daemon, answered, seconds, peak)
    print(client.report(), f"\nRSS growth {(peak - start) / 2**20:.0f} MiB")
    return client, peak - start


def assert_served(client: WellBehaved, rss_growth: int, daemon: Daemon) -> None:
    """Issue 41's done criteria for one attack (see the module's constants)."""
    assert daemon.proc.poll() is None, "the daemon died"
    for protocol in ("http", "grpc"):
        after = client.at(protocol, "after")
        assert after.latencies, f"{protocol} not served after the attack: {after}"
    grpc = client.at("grpc", "during")
    assert grpc.latencies and not grpc.failed, f"gRPC during the attack: {grpc}"
    http = client.at("http", "during")
    assert http.total and http.failed <= MAX_HTTP_FAILED * http.total, f"HTTP: {http}"
    for protocol in ("http", "grpc"):
        during, base = client.at(protocol, "during"), client.at(protocol, "before")
        bound = max(P99_FACTOR * base.p99(), P99_FLOOR)
        assert during.p99() <= bound, (
            f"{protocol} p99 past {bound * 1e3:.0f} ms: {during} (before: {base})"
        )
        # Its requests one after another: a quarter of the rate it had is a slowdown a user
        # notices whatever the percentile says (rates: the phases differ in length).
        rate = during.total / client.lasted["during"]
        base_rate = base.total / client.lasted["before"]
        assert rate >= base_rate / MAX_SLOWDOWN, (
            f"{protocol}: {during} in {client.lasted['during']:.1f} s "
            f"(before: {base} in {client.lasted['before']:.1f} s)"
        )
    assert rss_growth <= MAX_RSS_GROWTH, f"RSS grew {rss_growth / 2**20:.0f} MiB"

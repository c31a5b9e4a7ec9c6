"""Harness for the daemon's integration tests: start the real daemon as a subprocess on a free
loopback port, wait until it is ready, read its JSON logs, stop it. (No tests in here.)"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from model_runtime.demo import DEMO_MODEL_NAME, load_demo_samples
from model_runtime.server.observability.logwriter import FLUSH_INTERVAL

MODEL = DEMO_MODEL_NAME
REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 60.0


@dataclass
class Daemon:
    """A running daemon subprocess."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    grpc_port: int = 0
    #: The metrics listener's port (0: none).
    metrics_port: int = 0

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def events(self) -> list[dict[str, Any]]:
        """The daemon's log events so far. It writes info lines in batches at most
        FLUSH_INTERVAL apart (model_runtime/server/observability/logwriter.py): what it logged
        before this call is in the file after twice that."""
        time.sleep(2 * FLUSH_INTERVAL)
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
        return out

    def get(self, path: str) -> tuple[int, Any]:
        return http("GET", self.url(path))

    def post(self, path: str, doc: Any = None) -> tuple[int, Any]:
        return http("POST", self.url(path), doc)

    def terminate(self, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise


def http(method: str, url: str, doc: Any = None, timeout: float = 10.0) -> tuple[int, Any]:
    """One request with a JSON body (or none); return the status and the parsed JSON body."""
    data = None if doc is None else json.dumps(doc).encode()
    req = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body = resp.read()
            status = resp.status
    except urllib.error.HTTPError as exc:
        body, status = exc.read(), exc.code
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body.decode(errors="replace")


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``predicate`` until true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def start_daemon(
    tmp_path: Path, *args: str, wait_ready: bool = True, env: dict[str, str] | None = None
) -> Daemon:
    """Start ``python -m model_runtime.server --port 0 --grpc-port 0 --metrics-port 0 ARGS``
    (with ``env`` over this process's environment) and wait until it is ready."""
    log_path = tmp_path / f"daemon-{time.monotonic_ns()}.log"
    env = dict(os.environ) | (env or {})
    env.setdefault("XDG_CACHE_HOME", str(tmp_path.parent / "xdg-cache"))
    env["PYTHONUNBUFFERED"] = "1"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "model_runtime.server", "--port", "0", "--grpc-port", "0",
             "--metrics-port", "0", "--log-format", "json", *args],
            stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT, env=env,
        )  # fmt: skip
    daemon = Daemon(proc, 0, log_path)
    try:

        def listening() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"daemon exited {proc.returncode}:\n{log_path.read_text()}")
            for e in daemon.events():
                if e.get("event") == "daemon_listening":
                    daemon.port = int(e["port"] or 0)
                    daemon.grpc_port = int(e["grpc_port"] or 0)
                    daemon.metrics_port = int(e.get("metrics_port") or 0)
                    return True
            return False

        wait_for(listening, START_TIMEOUT, "the daemon to listen")
        if wait_ready:
            wait_for(lambda: _ready(daemon), START_TIMEOUT, "the daemon to be ready")
    except BaseException:
        stop_daemon(daemon)
        raise
    return daemon


def _ready(daemon: Daemon) -> bool:
    if daemon.proc.poll() is not None:
        raise AssertionError(f"daemon exited:\n{daemon.log_path.read_text()}")
    try:
        return daemon.get("/v2/health/ready")[0] == 200
    except OSError:
        return False


def all_loaded(daemon: Daemon) -> bool:
    """True once every model of the repository is READY; a model that failed to load fails
    at once, with its reason (for ``wait_for``)."""
    status, index = daemon.post("/v2/repository/index")
    assert status == 200, index
    failed = [m for m in index if m["state"] == "UNAVAILABLE" and m.get("reason")]
    assert not failed, failed
    return all(m["state"] == "READY" for m in index)


def stop_daemon(daemon: Daemon) -> None:
    """SIGTERM, then SIGKILL if it does not exit within 20 s."""
    try:
        daemon.terminate()
    except subprocess.TimeoutExpired:
        pass


@contextmanager
def running(tmp_path: Path, *args: str) -> Iterator[Daemon]:
    """A daemon for the duration of a ``with`` block."""
    daemon = start_daemon(tmp_path, *args)
    try:
        yield daemon
    finally:
        stop_daemon(daemon)


def samples() -> tuple[np.ndarray, np.ndarray]:
    """Held-out demo pixels and the model's reference logits."""
    pixels, _, logits = load_demo_samples()
    return pixels, logits


def infer_doc(pixels: np.ndarray, **extra: Any) -> dict[str, Any]:
    """A JSON inference request for the demo model."""
    return {
        "inputs": [
            {"name": "pixels", "datatype": "FP32", "shape": list(pixels.shape),
             "data": pixels.ravel().tolist()}
        ],
        **extra,
    }  # fmt: skip


def metric(text: str, line_start: str) -> float | None:
    """The value of the first metric line starting with ``line_start``."""
    for line in text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return None


#: A raw HTTP/1.1 answer: status, headers (names lower-case), body.
RawAnswer = tuple[int, dict[str, str], bytes]


def read_raw_answer(sock: socket.socket, buf: bytearray) -> RawAnswer:
    """The next ``Content-Length`` answer on ``sock``; ``buf`` holds bytes read past the
    previous one (and keeps those past this one)."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        assert chunk, "connection closed before an answer"
        buf += chunk
    end = buf.index(b"\r\n\r\n")
    head = bytes(buf[:end]).decode("latin-1").split("\r\n")
    del buf[: end + 4]
    headers = {}
    for line in head[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers["content-length"])
    while len(buf) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed inside a body"
        buf += chunk
    body = bytes(buf[:length])
    del buf[:length]
    return int(head[0].split()[1]), headers, body

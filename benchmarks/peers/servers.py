"""Start the HTTP servers the benchmark compares, each a subprocess on a free loopback port.

The daemon runs from this checkout; the peers (MLServer, KServe's Python model server) run from
their own virtual environments under ``.venv-peers/`` (``make peers`` makes them: they pin
fastapi, pydantic, protobuf and uvicorn versions of their own, so they cannot share ``.venv``).
Every server gets the same model file and the same onnxruntime session options
(``ort_session.py``), logs nothing per request, and is stopped (its whole process group) when
the ``with`` block ends. A peer that cannot start raises :class:`PeerUnavailable`, with the
reason, so the benchmark skips it and keeps the others' results.
"""

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
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PEERS_DIR = Path(__file__).resolve().parent
PEER_VENVS = REPO / ".venv-peers"
START_TIMEOUT = 90.0


class PeerUnavailable(Exception):
    """A server could not be started (its venv is missing, or it died or never got ready)."""


@dataclass(frozen=True)
class Server:
    """A running server: where to POST v2 inference requests, and what it supports."""

    name: str
    url: str
    binary: bool  # the v2 binary tensor extension over HTTP
    version: str
    setup: str  # how it serves the model, in words (for the report)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except (OSError, urllib.error.URLError):
        return False


@contextmanager
def serve(
    name: str, cmd: Sequence[str], env: Mapping[str, str], ready_url: str, log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``cmd`` in its own process group until ``ready_url`` answers 200, yield its process;
    stop it after."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            list(cmd),
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
            cwd=REPO,
            start_new_session=True,  # its workers (MLServer's) share its group: stop them all
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not _ready(ready_url):
            if proc.poll() is not None:
                tail = log.read_text(errors="replace")[-1500:]
                raise PeerUnavailable(f"{name} exited {proc.returncode} at start:\n{tail}")
            if time.monotonic() > deadline:
                raise PeerUnavailable(f"{name} not ready after {START_TIMEOUT:.0f} s (log {log})")
            time.sleep(0.1)
        yield proc
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _peer_python(peer: str, package: str) -> tuple[Path, str]:
    """The peer venv's python and the installed version of ``package``."""
    venv = PEER_VENVS / peer
    python = venv / "bin" / "python"
    if not (venv / ".installed").exists() or not python.exists():
        raise PeerUnavailable(
            f"{venv.relative_to(REPO)} missing: `make peers` could not make it (no network?)"
        )
    code = f"from importlib.metadata import version; print(version({package!r}))"
    try:
        found = subprocess.run(
            [str(python), "-c", code], capture_output=True, text=True, check=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise PeerUnavailable(f"{venv.relative_to(REPO)} is broken: {exc}") from exc
    return python, found.stdout.strip()


def _has_option(option: str) -> bool:
    """Whether this checkout's daemon takes ``option``."""
    found = subprocess.run(
        [sys.executable, "-m", "model_runtime.server", "--help"],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )  # fmt: skip
    return option in found.stdout


@contextmanager
def daemon(
    model: Path, name: str, workdir: Path, devices: str, replicas: int, batch: int
) -> Iterator[Server]:
    """This checkout's daemon serving ``model`` as ``name`` (its defaults otherwise)."""
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "model_runtime.server", "--port", str(port), "--no-access-log",
        "--log-format", "json", "--replicas", str(replicas), "--batch-size", str(batch),
        "--executable-cache", str(workdir / "cache"), f"{name}={model}",
    ]  # fmt: skip
    if _has_option("--grpc-port"):  # gRPC beside HTTP: on a free port, never the default 8001
        cmd[3:3] = ["--grpc-port", "0"]
    if _has_option("--metrics-port"):  # the metrics listener too, never Triton's 8002
        cmd[3:3] = ["--metrics-port", "0"]
    env = {
        "MODEL_RUNTIME_DEVICES": devices,
        # Device locks of its own: other test runs on this machine hold the default ones.
        "MODEL_RUNTIME_DIR": str(workdir / "run"),
        "PYTHONUNBUFFERED": "1",
    }
    base = f"http://127.0.0.1:{port}"
    with serve("daemon", cmd, env, f"{base}/v2/models/{name}/ready", workdir / "daemon.log"):
        yield Server(
            "daemon",
            f"{base}/v2/models/{name}/infer",
            binary=True,
            version=version("model-runtime"),
            setup=f"devices {devices}, {replicas} replica(s), batch {batch}, default timeout",
        )


@contextmanager
def mlserver(
    model: Path,
    name: str,
    workdir: Path,
    threads: int,
    max_batch_size: int,
    max_batch_time: float,
    workers: int,
) -> Iterator[Server]:
    """MLServer with the custom runtime ``mlserver_runtime.OnnxModel`` and adaptive batching."""
    python, ver = _peer_python("mlserver", "mlserver")
    root = workdir / "mlserver"
    (root / name).mkdir(parents=True, exist_ok=True)
    port = free_port()
    settings = {
        "host": "127.0.0.1",
        "http_port": port,
        "grpc_port": free_port(),
        "metrics_port": free_port(),
        "debug": False,  # MLServer's access log is on with debug (its default)
        "parallel_workers": workers,
    }
    model_settings = {
        "name": name,
        "implementation": "mlserver_runtime.OnnxModel",
        "max_batch_size": max_batch_size,
        "max_batch_time": max_batch_time,
        "parameters": {"uri": str(model), "extra": {"threads": threads}},
    }
    (root / "settings.json").write_text(json.dumps(settings))
    (root / name / "model-settings.json").write_text(json.dumps(model_settings))
    cmd = [str(python.parent / "mlserver"), "start", str(root)]
    env = {"PYTHONPATH": str(PEERS_DIR), "PYTHONUNBUFFERED": "1"}
    base = f"http://127.0.0.1:{port}"
    with serve("mlserver", cmd, env, f"{base}/v2/models/{name}/ready", workdir / "mlserver.log"):
        yield Server(
            "mlserver",
            f"{base}/v2/models/{name}/infer",
            binary=False,  # its REST API has no binary tensor extension (gRPC only)
            version=ver,
            setup=(
                f"custom runtime on onnxruntime ({threads} thread), adaptive batching "
                f"max_batch_size {max_batch_size} / max_batch_time {max_batch_time * 1e3:g} ms, "
                f"parallel_workers {workers}"
            ),
        )


@contextmanager
def kserve(model: Path, name: str, workdir: Path, threads: int) -> Iterator[Server]:
    """KServe's ``ModelServer`` with a ``kserve.Model`` running onnxruntime per request."""
    python, ver = _peer_python("kserve", "kserve")
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    cmd = [
        str(python), str(PEERS_DIR / "kserve_server.py"), str(model), "--name", name,
        "--port", str(port), "--threads", str(threads),
    ]  # fmt: skip
    env = {"PYTHONPATH": str(PEERS_DIR), "PYTHONUNBUFFERED": "1"}
    base = f"http://127.0.0.1:{port}"
    with serve("kserve", cmd, env, f"{base}/v2/models/{name}/ready", workdir / "kserve.log"):
        yield Server(
            "kserve",
            f"{base}/v2/models/{name}/infer",
            binary=True,
            version=ver,
            setup=f"kserve.Model, onnxruntime ({threads} thread) per request, 1 worker",
        )

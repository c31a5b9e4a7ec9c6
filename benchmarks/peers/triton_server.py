"""Start NVIDIA's real Triton server (the nvidia-pytriton wheel's ``tritonserver``) on a model
repository of one python-backend model, for ``benchmarks/triton_peer.py``.

``make triton-peer`` lays the server out in ``.venv-peers/triton`` and describes it in
``triton-layout.json`` (``peers/triton_install.sh`` says why each piece is where it is). Here a
fresh repository is written for each start: ``NAME/config.pbtxt`` from
``triton_model/config.pbtxt.in``, ``NAME/1/model.py`` (one onnxruntime run per batch the dynamic
batcher forms) and ``NAME/1/ort_session.py`` (the session options every peer gets). Triton runs
with its defaults except: loopback addresses on free ports, metrics off (a port of its own that
nothing reads), strict readiness, exit on error. It is stopped, with its stub, when the ``with``
block ends. A server that cannot start raises :class:`servers.PeerUnavailable`, with the reason.
"""

from __future__ import annotations

import json
import os
import string
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.peers import servers

MODEL_DIR = servers.PEERS_DIR / "triton_model"
VENV = servers.PEER_VENVS / "triton"


@dataclass(frozen=True)
class Running:
    """A server started by :func:`serve`: its process (the group leader) and where it listens."""

    proc: subprocess.Popen[bytes]
    http: str  # host:port
    grpc: str  # host:port
    version: str
    setup: str
    command: tuple[str, ...]
    extra: Mapping[str, Any]


@contextmanager
def serve(
    name: str, cmd: Sequence[str], env: Mapping[str, str], ready_url: str, log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``cmd`` in its own process group until ``ready_url`` answers 200; stop the group
    after (SIGTERM, then SIGKILL).

    Raises:
        servers.PeerUnavailable: it exited, or was not ready within ``servers.START_TIMEOUT``.
    """
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            list(cmd),
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
            cwd=servers.REPO,
            start_new_session=True,  # Triton's stub shares its group: stop them together
        )
    try:
        deadline = time.monotonic() + servers.START_TIMEOUT
        while not servers._ready(ready_url):
            if proc.poll() is not None:
                tail = log.read_text(errors="replace")[-1500:]
                raise servers.PeerUnavailable(f"{name} exited {proc.returncode} at start:\n{tail}")
            if time.monotonic() > deadline:
                raise servers.PeerUnavailable(
                    f"{name} not ready after {servers.START_TIMEOUT:.0f} s (log {log})"
                )
            time.sleep(0.1)
        yield proc
    finally:
        servers._stop(proc)


def _get_json(url: str) -> dict[str, Any]:
    """The JSON document at ``url``, or ``{}`` when it cannot be had."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            doc: dict[str, Any] = json.loads(resp.read())
            return doc
    except (OSError, ValueError):
        return {}


def server_version(base: str) -> str:
    """The ``version`` of the server metadata (``GET /v2``) at ``base``, or ``?``."""
    return str(_get_json(f"{base}/v2").get("version", "?"))


def layout() -> dict[str, Any]:
    """``triton-layout.json`` of ``make triton-peer``.

    Raises:
        servers.PeerUnavailable: the peer was not made (no network when ``make peers`` ran).
    """
    path = VENV / "triton-layout.json"
    if not (VENV / ".installed").exists() or not path.exists():
        raise servers.PeerUnavailable(
            f"{VENV.relative_to(servers.REPO)} missing: `make triton-peer` could not make it "
            f"(see {VENV.relative_to(servers.REPO)}.log)"
        )
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def write_repository(
    root: Path,
    name: str,
    model: Path,
    *,
    threads: int,
    max_batch_size: int,
    max_queue_delay_us: int,
    io: tuple[str, int, str, int],
) -> Path:
    """A Triton model repository at ``root`` holding ``name``: the python-backend model over
    ``model``; ``io`` = (input name, input width, output name, output width)."""
    version_dir = root / name / "1"
    version_dir.mkdir(parents=True, exist_ok=True)
    for src in (MODEL_DIR / "model.py", servers.PEERS_DIR / "ort_session.py"):
        (version_dir / src.name).write_bytes(src.read_bytes())
    config = string.Template((MODEL_DIR / "config.pbtxt.in").read_text()).substitute(
        name=name,
        max_batch_size=max_batch_size,
        input=io[0],
        input_dim=io[1],
        output=io[2],
        output_dim=io[3],
        max_queue_delay_us=max_queue_delay_us,
        onnx_path=str(model.resolve()),
        threads=threads,
    )
    (root / name / "config.pbtxt").write_text(config)
    return root


@contextmanager
def triton(
    model: Path,
    name: str,
    workdir: Path,
    *,
    threads: int,
    max_batch_size: int,
    max_queue_delay_us: int,
    io: tuple[str, int, str, int],
    options: Sequence[str] = (),
) -> Iterator[Running]:
    """Triton serving ``model`` as the python-backend model ``name`` over HTTP and gRPC;
    ``options`` are added to its command line (e.g. ``--http-thread-count=16``).

    Raises:
        servers.PeerUnavailable: the peer is not made, or Triton did not start (its log's tail).
    """
    lay = layout()
    workdir.mkdir(parents=True, exist_ok=True)
    repo = write_repository(
        workdir / "repository",
        name,
        model,
        threads=threads,
        max_batch_size=max_batch_size,
        max_queue_delay_us=max_queue_delay_us,
        io=io,
    )
    http, grpc = servers.free_port(), servers.free_port()
    cmd = [
        lay["tritonserver"], "--model-repository", str(repo),
        "--backend-directory", lay["backend_directory"],
        "--cache-directory", lay["cache_directory"],
        "--http-address", "127.0.0.1", "--http-port", str(http),
        "--grpc-address", "127.0.0.1", "--grpc-port", str(grpc),
        "--allow-metrics", "false", "--allow-gpu-metrics", "false", "--allow-cpu-metrics", "false",
        "--strict-readiness", "true", "--exit-on-error", "true", *options,
    ]  # fmt: skip
    env = {
        "PATH": os.pathsep.join([*lay["path"], os.environ.get("PATH", "")]),
        "LD_LIBRARY_PATH": os.pathsep.join(
            [*lay["ld_library_path"], *filter(None, [os.environ.get("LD_LIBRARY_PATH")])]
        ),
    }
    base = f"http://127.0.0.1:{http}"
    log = workdir / "triton.log"
    with serve("triton", cmd, env, f"{base}/v2/models/{name}/ready", log) as proc:
        stub = _stub_report(log)
        yield Running(
            proc=proc,
            http=f"127.0.0.1:{http}",
            grpc=f"127.0.0.1:{grpc}",
            version=server_version(base),
            setup=(
                f"tritonserver (nvidia-pytriton {lay['versions']['nvidia-pytriton']}), python "
                f"backend, 1 instance (KIND_CPU), model.py: one onnxruntime run per batch "
                f"({threads} intra-op thread), max_batch_size {max_batch_size}, dynamic batching "
                f"max_queue_delay {max_queue_delay_us} us; Triton's defaults otherwise, "
                "metrics off"
            ),
            command=tuple(cmd),
            extra={
                "layout": lay,
                "env": env,
                "config_pbtxt": (repo / name / "config.pbtxt").read_text(),
                # as Triton completed it (its python backend fills in preferred_batch_size)
                "effective_config": _get_json(f"{base}/v2/models/{name}/config"),
                "stub": stub,
            },
        )


def _stub_report(log: Path) -> dict[str, Any]:
    """What ``model.py`` logged at initialize (the stub's Python prefix and package versions),
    read from Triton's log; empty if it is not there."""
    for line in log.read_text(errors="replace").splitlines():
        _, sep, rest = line.partition("triton_peer_model ")
        if sep:
            try:
                doc: dict[str, Any] = json.loads(rest.rstrip('"').replace('\\"', '"'))
                return doc
            except ValueError:
                return {"unparsed": rest}
    return {}

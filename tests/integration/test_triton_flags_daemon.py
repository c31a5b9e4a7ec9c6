"""tritonserver's flags on the real daemon: the metrics listener, listeners turned off with
``--allow-*=false``, ``--exit-on-error`` with a model that fails at start, ``--log-file``."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.integration.test_daemon_support import (
    MODEL,
    REPO_ROOT,
    http,
    infer_doc,
    running,
    samples,
    start_daemon,
    stop_daemon,
    wait_for,
)

grpcclient = pytest.importorskip("tritonclient.grpc")

pytestmark = [pytest.mark.timeout(120)]


def _metrics(port: int) -> tuple[int, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        return resp.status, resp.read().decode()


def test_the_metrics_port_serves_what_the_http_port_serves(tmp_path: Path) -> None:
    with running(tmp_path, "--strict-readiness=false", "--allow-metrics=true") as d:
        assert d.metrics_port not in (0, d.port, d.grpc_port)
        assert http("POST", d.url(f"/v2/models/{MODEL}/infer"), _one())[0] == 200
        status, text = _metrics(d.metrics_port)
        assert status == 200
        assert f'nv_inference_request_success{{model="{MODEL}",version="1"}} 1' in text
        assert d.get("/metrics")[0] == 200  # and on the HTTP port, as before


def test_the_metrics_port_is_restricted_as_the_http_port_is(tmp_path: Path) -> None:
    with running(tmp_path, "--http-restricted-api=statistics:metrics-key=s3cret") as d:
        url = f"http://127.0.0.1:{d.metrics_port}/metrics"
        assert http("GET", url)[0] == 403  # without the header
        request = urllib.request.Request(url, headers={"metrics-key": "s3cret"})
        with urllib.request.urlopen(request, timeout=10) as resp:
            assert resp.status == 200


def test_listeners_and_metrics_turned_off(tmp_path: Path) -> None:
    with running(tmp_path, "--allow-metrics=false", "--allow-grpc=false") as d:
        assert (d.metrics_port, d.grpc_port) == (0, 0)  # not listening
        assert d.get("/metrics")[0] == 404
        assert d.get("/v2/health/ready")[0] == 200
    d = start_daemon(tmp_path, "--allow-http=false", wait_ready=False)
    try:
        assert d.port == 0
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{d.grpc_port}")
        wait_for(lambda: _ready(client), 60, "gRPC readiness")
        assert _metrics(d.metrics_port)[0] == 200
    finally:
        stop_daemon(d)


def _ready(client: object) -> bool:
    try:
        return bool(client.is_server_ready())  # type: ignore[attr-defined]
    except Exception:
        return False


def _one() -> dict[str, object]:
    pixels, _ = samples()
    return infer_doc(pixels[:1])


@pytest.mark.parametrize("exit_on_error", ["true", "false"])
def test_exit_on_error_decides_whether_a_failed_model_stops_the_daemon(
    tmp_path: Path, exit_on_error: str
) -> None:
    repo = tmp_path / "models"
    repo.mkdir()
    (repo / "broken.mrx").write_bytes(b"not an executable")
    log = tmp_path / "server.log"
    cmd = [
        sys.executable, "-m", "model_runtime.server", "--port", "0", "--grpc-port", "0",
        "--metrics-port", "0", f"--model-repository={repo}", f"--exit-on-error={exit_on_error}",
        f"--log-file={log}", "--log-verbose=1",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        if exit_on_error == "true":
            assert proc.wait(60) == 1
        else:
            wait_for(lambda: "daemon_ready" in _text(log), 60, "the daemon to serve")
            assert proc.poll() is None  # the others (none here) serve on
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(30)
    events = [json.loads(line) for line in _text(log).splitlines() if line.startswith("{")]
    names = [e["event"] for e in events]
    assert "startup_load_failed" in names
    assert ("daemon_exit_on_error" in names) == (exit_on_error == "true")
    assert proc.stdout is not None and b"daemon_listening" not in proc.stdout.read()


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""

"""The real daemon over HTTP: every endpoint, JSON and binary tensors, concurrent clients, bad
input, a body over the limit, and the model repository. One daemon (the bundled demo model)
serves the module."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from test_daemon_support import (
    MODEL,
    Daemon,
    infer_doc,
    metric,
    running,
    samples,
    start_daemon,
    stop_daemon,
)

from model_runtime.demo import DEMO_ONNX_PATH

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]
ATOL = 1e-4


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_daemon(tmp_path_factory.mktemp("daemon"), "--max-body-size", "200000")
    yield d
    stop_daemon(d)
    assert d.proc.returncode == 0


def test_server_health_and_metadata(daemon: Daemon) -> None:
    assert daemon.get("/v2/health/live") == (200, {"live": True})
    assert daemon.get("/v2/health/ready") == (200, {"ready": True})
    status, meta = daemon.get("/v2")
    assert status == 200 and meta["name"] == "model-runtime"
    assert {"binary_tensor_data", "model_repository", "statistics"} <= set(meta["extensions"])
    status, model = daemon.get(f"/v2/models/{MODEL}")
    assert status == 200
    assert model["inputs"] == [{"name": "pixels", "datatype": "FP32", "shape": [-1, 64]}]
    assert {o["name"]: o["shape"] for o in model["outputs"]} == {
        "logits": [-1, 10],
        "probabilities": [-1, 10],
    }
    assert daemon.get(f"/v2/models/{MODEL}/versions/1")[1] == model
    assert daemon.get(f"/v2/models/{MODEL}/ready")[0] == 200
    assert daemon.get(f"/v2/models/{MODEL}/versions/1/ready")[0] == 200
    assert daemon.get("/v2/models/nope/ready")[0] == 400  # Triton's code for an unknown name


def test_json_inference_matches_the_reference(daemon: Daemon) -> None:
    pixels, logits = samples()
    doc = infer_doc(pixels[:5], id="req-42", outputs=[{"name": "logits"}])
    status, out = daemon.post(f"/v2/models/{MODEL}/infer", doc)
    assert status == 200, out
    assert out["id"] == "req-42" and out["model_name"] == MODEL
    assert [o["name"] for o in out["outputs"]] == ["logits"]
    got = np.array(out["outputs"][0]["data"], np.float32).reshape(out["outputs"][0]["shape"])
    np.testing.assert_allclose(got, logits[:5], atol=ATOL)
    nested = infer_doc(pixels[:2])
    nested["inputs"][0]["data"] = pixels[:2].tolist()
    status, out = daemon.post(f"/v2/models/{MODEL}/versions/1/infer", nested)
    assert status == 200 and {o["name"] for o in out["outputs"]} == {"logits", "probabilities"}


async def test_binary_tensor_data_both_ways(daemon: Daemon) -> None:
    pixels, logits = samples()
    x = np.ascontiguousarray(pixels[:7], "<f4")
    head = json.dumps(
        {
            "inputs": [{"name": "pixels", "datatype": "FP32", "shape": [7, 64],
                        "parameters": {"binary_data_size": x.nbytes}}],
            "outputs": [{"name": "logits", "parameters": {"binary_data": True}},
                        {"name": "probabilities"}],
        }
    ).encode()  # fmt: skip
    async with aiohttp.ClientSession() as s:
        resp = await s.post(
            daemon.url(f"/v2/models/{MODEL}/infer"),
            data=head + x.tobytes(),
            headers={"Inference-Header-Content-Length": str(len(head)),
                     "Content-Type": "application/octet-stream"},
        )  # fmt: skip
        assert resp.status == 200, await resp.text()
        n = int(resp.headers["Inference-Header-Content-Length"])
        body = await resp.read()
    header = json.loads(body[:n])
    assert header["outputs"][0]["parameters"] == {"binary_data_size": 7 * 10 * 4}
    got = np.frombuffer(body[n:], "<f4").reshape(7, 10)
    np.testing.assert_allclose(got, logits[:7], atol=ATOL)
    probs = np.array(header["outputs"][1]["data"]).reshape(7, 10)
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-5)


async def test_concurrent_clients_get_their_own_rows(daemon: Daemon) -> None:
    pixels, logits = samples()
    rng = np.random.default_rng(0)

    async def one(s: aiohttp.ClientSession, i: int) -> None:
        start = int(rng.integers(0, 40))
        rows = 1 + i % 8
        doc = infer_doc(pixels[start : start + rows], id=str(i))
        async with s.post(daemon.url(f"/v2/models/{MODEL}/infer"), json=doc) as resp:
            assert resp.status == 200, await resp.text()
            out = await resp.json()
        assert out["id"] == str(i)
        got = np.array(out["outputs"][0]["data"], np.float32).reshape(rows, 10)
        np.testing.assert_allclose(got, logits[start : start + rows], atol=ATOL)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as s:
        await asyncio.gather(*(one(s, i) for i in range(200)))


BAD = [
    (b"{not json", "not valid JSON"),
    (json.dumps({"inputs": [{"name": "pixels", "datatype": "FLOAT32", "shape": [1, 64],
                             "data": [0] * 64}]}).encode(), "unknown datatype 'FLOAT32'"),
    (json.dumps({"inputs": [{"name": "pixels", "datatype": "BYTES", "shape": [1],
                             "data": ["x"]}]}).encode(), "no BYTES input"),
    (json.dumps({"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [2, 64],
                             "data": [0] * 64}]}).encode(), "needs 128 elements"),
    (json.dumps({"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 63],
                             "data": [0] * 63}]}).encode(), "shape [1, 63]"),
    (json.dumps({"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 64],
                             "data": [0] * 64}]}).encode(), "unknown input 'image'"),
    (json.dumps({"inputs": [{"name": "pixels", "datatype": "FP32",
                             "shape": [10**12, 10**12], "data": [0] * 64}]}).encode(), "shape"),
    (json.dumps({"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64],
                             "parameters": {"binary_data_size": 256}}]}).encode() + b"\0" * 100,
     "Inference-Header-Content-Length"),
    (json.dumps({"inputs": []}).encode(), "expected 1 inputs but got 0 inputs"),
    (json.dumps({"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64],
                             "data": [0] * 64}], "outputs": [{"name": "x"}]}).encode(),
     "unexpected inference output 'x'"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "message"), BAD, ids=[m for _, m in BAD])
def test_bad_input_is_400_with_a_message(daemon: Daemon, body: bytes, message: str) -> None:
    status, out = _raw_post(daemon.url(f"/v2/models/{MODEL}/infer"), body)
    assert status == 400, out
    assert message in out["error"]
    assert daemon.get("/v2/health/ready")[0] == 200  # and the daemon is still fine


def _raw_post(
    url: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(url, data=body, method="POST", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_binary_sizes_that_do_not_add_up(daemon: Daemon) -> None:
    head = json.dumps({"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64],
                                   "parameters": {"binary_data_size": 256}}]}).encode()  # fmt: skip
    url = daemon.url(f"/v2/models/{MODEL}/infer")
    hdr = {"Inference-Header-Content-Length": str(len(head))}
    status, out = _raw_post(url, head + b"\0" * 200, hdr)
    assert status == 400 and "more than the 200 bytes" in out["error"]
    status, out = _raw_post(url, head + b"\0" * 300, hdr)
    assert status == 400 and "add up to 256 bytes, but 300" in out["error"]


def test_a_raw_binary_request_is_the_one_input_and_gets_every_output(daemon: Daemon) -> None:
    """``curl --data-binary @x.raw -H 'Inference-Header-Content-Length: 0'``, as Triton takes
    it: the body is the model's one input, its shape [1, 64] from the model; every output
    comes back as binary data behind a JSON header."""
    pixels, logits = samples()
    url = daemon.url(f"/v2/models/{MODEL}/infer")
    req = urllib.request.Request(
        url,
        data=np.ascontiguousarray(pixels[3], "<f4").tobytes(),
        headers={"Inference-Header-Content-Length": "0"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        n = int(resp.headers["Inference-Header-Content-Length"])
        body = resp.read()
    header = json.loads(body[:n])
    assert [(o["name"], o["shape"]) for o in header["outputs"]] == [
        ("logits", [1, 10]),
        ("probabilities", [1, 10]),
    ]
    got = np.frombuffer(body[n : n + 40], "<f4").reshape(1, 10)
    np.testing.assert_allclose(got, logits[3:4], atol=ATOL)
    status, out = _raw_post(url, b"\0" * 100, {"Inference-Header-Content-Length": "0"})
    assert (status, out["error"]) == (
        400,
        "[request id: <id_unknown>] input byte size mismatch for input 'pixels' for model "
        f"'{MODEL}'. Expected 256, got 100",
    )


def test_unknown_model_is_400_and_unknown_version_404_in_tritons_words(daemon: Daemon) -> None:
    pixels, _ = samples()
    status, out = daemon.post("/v2/models/nope/infer", infer_doc(pixels[:1]))
    assert (status, out["error"]) == (400, "Request for unknown model: 'nope' is not found")
    status, out = daemon.post(f"/v2/models/{MODEL}/versions/3/infer", infer_doc(pixels[:1]))
    assert status == 404
    assert out["error"] == f"Request for unknown model: '{MODEL}' version 3 is not found"
    assert daemon.get("/v2/no/such/route")[0] == 404


def test_body_over_the_limit_is_refused_before_it_is_read(daemon: Daemon) -> None:
    """A 1 GB Content-Length gets Triton's 400 at once, after the client sent only a few bytes,
    and the connection closes (the body is not read)."""
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=10) as sock:
        sock.sendall(
            f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: x\r\n"
            f"Content-Type: application/json\r\nContent-Length: {10**9}\r\n\r\n{{".encode()
        )
        reply = b""
        while b"}" not in reply and (chunk := sock.recv(4096)):  # the answer's JSON, whole
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 400") and b"Connection: close" in reply, reply[:200]
    words = (  # Triton's, with this daemon's --max-body-size
        rb"request JSON size of 1000000000 bytes exceeds the maximum allowed input size of "
        rb"\d+ bytes\. Use --http-max-input-size to increase the limit\."
    )
    assert re.search(words, reply), reply[:400]
    assert time.monotonic() - t0 < 5


def test_statistics_and_metrics(daemon: Daemon) -> None:
    pixels, _ = samples()
    assert daemon.post(f"/v2/models/{MODEL}/infer", infer_doc(pixels[:3]))[0] == 200
    status, stats = daemon.get(f"/v2/models/{MODEL}/stats")
    assert status == 200
    (model,) = stats["model_stats"]
    assert model["name"] == MODEL and model["inference_count"] >= 3
    assert model["inference_stats"]["success"]["count"] >= 1
    assert model["inference_stats"]["fail"]["count"] >= 1  # the bad-input tests
    assert model["replicas"][0]["state"] == "ready"
    status, text = daemon.get("/metrics")
    assert status == 200 and isinstance(text, str)
    assert (
        metric(text, f'model_runtime_requests_total{{model="{MODEL}",outcome="success"') or 0
    ) >= 1
    assert (metric(text, f'model_runtime_inferences_total{{model="{MODEL}"}}') or 0) >= 3
    assert metric(text, f'model_runtime_pending_requests{{model="{MODEL}"}}') == 0
    assert f'model="{MODEL}",replica="0",state="ready"}} 1.0' in text
    assert "model_runtime_request_duration_seconds_bucket" in text
    assert "model_runtime_replica_runs" in text


def test_model_repository_load_unload_and_path_tricks(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    repo.mkdir()
    shutil.copy(DEMO_ONNX_PATH, repo / "digits.onnx")
    shutil.copy(DEMO_ONNX_PATH, tmp_path / "outside.onnx")
    (repo / "escape.onnx").symlink_to(tmp_path / "outside.onnx")
    args = ("--model-control-mode", "explicit", "--load-model", "*")
    with running(tmp_path, "--model-repository", str(repo), *args) as d:
        status, index = d.post("/v2/repository/index")
        assert status == 200
        assert {(m["name"], m["state"]) for m in index} >= {("digits", "READY")}
        assert "escape" not in {m["name"] for m in index if m["state"] == "READY"}
        for name in ("..%2Foutside", "escape", "%2E%2E"):
            status, out = d.post(f"/v2/repository/models/{name}/load")
            assert status in (400, 404), (name, out)
        assert d.post("/v2/repository/models/digits/unload")[0] == 200
        status, out = d.get("/v2/models/digits/ready")
        assert status == 503 and out["ready"] is False
        # Triton's strict readiness: a model unloaded on purpose is not waited for.
        assert d.get("/v2/health/ready")[0] == 200
        assert d.post("/v2/repository/models/digits/load")[0] == 200
        assert d.get("/v2/models/digits/ready")[0] == 200
        pixels, logits = samples()
        status, out = d.post("/v2/models/digits/infer", infer_doc(pixels[:1]))
        assert status == 200
        got = np.array(out["outputs"][0]["data"], np.float32)
        np.testing.assert_allclose(got, logits[0], atol=ATOL)

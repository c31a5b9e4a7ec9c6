"""A client that leaves while its ensemble request is in its middle step (the ONNX classifier
of the ``preprocessing`` pipeline, slowed by the fault plan), over HTTP (a reset connection)
and gRPC (the call cancelled): the daemon drops the rest of its work (the post-processing
step never runs for it), counts it as Triton does (the ensemble's failure, reason
``CANCELED``; nothing pending), and serves the next request right."""

from __future__ import annotations

import json
import queue
import socket
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.ensemble_models import PIPELINE, expected_pipeline, write_pipeline
from tests.integration.test_daemon_support import (
    Daemon,
    metric,
    start_daemon,
    stop_daemon,
    wait_for,
)

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]
CLASSIFIER = "resnet50_trt"
POST = "postprocess"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """Every ONNX run (the classifier step's) first sleeps 0.5 s: an ensemble request stays
    in its middle step long enough for its client to leave."""
    tmp = tmp_path_factory.mktemp("leaving")
    write_pipeline(tmp / "models")
    d = start_daemon(
        tmp, "--model-repository", str(tmp / "models"),
        "--fault-plan", "slow:every=1:seconds=0.5",
    )  # fmt: skip
    yield d
    stop_daemon(d)
    assert d.proc.returncode == 0


def raw_image(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (1, 48)).astype(np.uint8)


def _metrics(d: Daemon) -> str:
    status, text = d.get("/metrics")
    assert status == 200
    return str(text)


def _pending(d: Daemon, model: str) -> float:
    return metric(_metrics(d), f'model_runtime_pending_requests{{model="{model}"') or 0.0


def _cancelled(d: Daemon) -> float:
    """The ensemble's failures with Triton's reason ``CANCELED``."""
    text = _metrics(d)
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("nv_inference_request_failure{")
        and f'model="{PIPELINE}"' in line
        and 'reason="CANCELED"' in line
    )


def _executions(d: Daemon, model: str) -> int:
    status, doc = d.get(f"/v2/models/{model}/stats")
    assert status == 200
    return int(doc["model_stats"][0]["execution_count"])


def _answers_right(d: Daemon, seed: int) -> None:
    """A plain HTTP request after: the pipeline's right answer."""
    raw = raw_image(seed)
    doc = {"inputs": [{"name": "INPUT", "datatype": "UINT8", "shape": [1, 48],
                       "data": raw.ravel().tolist()}]}  # fmt: skip
    status, body = d.post(f"/v2/models/{PIPELINE}/infer", doc)
    assert status == 200, body
    outputs = {o["name"]: o["data"] for o in body["outputs"]}
    scores, top, labels = expected_pipeline(raw)
    np.testing.assert_allclose(outputs["SCORES"], scores.ravel(), atol=1e-4)
    assert outputs["CLASS"] == top.tolist()
    assert outputs["LABEL"] == [label.decode() for label in labels]


def _gone(d: Daemon, leave: Any) -> None:
    """Send a request and leave (``leave(send)``) once it is in the classifier step; then
    check what is counted and that nothing more runs for it."""
    before, post_runs = _cancelled(d), _executions(d, POST)
    leave(lambda: wait_for(lambda: _pending(d, CLASSIFIER) == 1, 10, "the classifier step"))
    wait_for(lambda: _pending(d, PIPELINE) == 0, 10, "the ensemble request to be dropped")
    wait_for(lambda: _cancelled(d) == before + 1, 10, "the request counted as CANCELED")
    wait_for(lambda: _pending(d, CLASSIFIER) == 0, 10, "the classifier's run to end")
    assert _executions(d, POST) == post_runs  # its last step never ran
    assert _pending(d, POST) == 0


def test_a_client_that_resets_mid_ensemble_over_http_drops_the_rest(daemon: Daemon) -> None:
    body = json.dumps({"inputs": [{"name": "INPUT", "datatype": "UINT8", "shape": [1, 48],
                                   "data": raw_image(1).ravel().tolist()}]}).encode()  # fmt: skip
    head = (
        f"POST /v2/models/{PIPELINE}/infer HTTP/1.1\r\nHost: x\r\nX-Request-ID: gone-http\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )

    def leave(in_step: Any) -> None:
        sock = socket.create_connection(("127.0.0.1", daemon.port), timeout=10)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.sendall(head.encode() + body)
        in_step()
        sock.close()  # a reset while it is in the classifier

    _gone(daemon, leave)
    gone = [e for e in daemon.events() if e.get("request_id") == "gone-http"]
    assert [e["status"] for e in gone if e["event"] == "http_request"] == [499]
    _answers_right(daemon, 2)


def test_a_grpc_call_cancelled_mid_ensemble_drops_the_rest(daemon: Daemon) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}")
    raw = raw_image(3)
    inp = grpcclient.InferInput("INPUT", list(raw.shape), "UINT8")
    inp.set_data_from_numpy(raw)
    answers: queue.Queue[Any] = queue.Queue()

    def leave(in_step: Any) -> None:
        call = client.async_infer(
            PIPELINE, [inp], lambda result, error: answers.put((result, error)),
            request_id="gone-grpc",
        )  # fmt: skip
        in_step()
        call.cancel()

    _gone(daemon, leave)
    result, error = answers.get(timeout=10)
    assert result is None and "CANCELLED" in str(error)
    _answers_right(daemon, 4)
    client.close()

"""A text classifier whose sequence axis varies per request, served by the daemon (issue 29):
from a flat repository and from a Triton layout with ``dims: [ -1 ]``, over HTTP (JSON and
binary) and gRPC; every answer is onnxruntime's on that request alone; metadata says -1."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.integration.test_daemon_support import Daemon, running
from tests.models import make_text_classifier, save

pytestmark = pytest.mark.timeout(180)

LENGTHS = (1, 4, 16, 33, 64)
TRITON_CONFIG = """
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "ids" data_type: TYPE_INT64 dims: [ -1 ] } ]
output [
  { name: "logits" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "hidden" data_type: TYPE_FP32 dims: [ -1, 16 ] }
]
dynamic_batching { }
"""


def _flat(root: Path) -> Path:
    save(make_text_classifier(), root / "text.onnx")
    return root


def _triton(root: Path) -> Path:
    (root / "text" / "1").mkdir(parents=True)
    save(make_text_classifier(), root / "text" / "1" / "model.onnx")
    (root / "text" / "config.pbtxt").write_text(TRITON_CONFIG)
    return root


@pytest.fixture(params=["flat", "triton"])
def daemon(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Daemon]:
    root = tmp_path / "repo"
    root.mkdir()
    layout = _flat(root) if request.param == "flat" else _triton(root)
    with running(tmp_path, "--model-repository", str(layout), "--batch-size", "8") as d:
        yield d


def _reference() -> ort.InferenceSession:
    return ort.InferenceSession(
        make_text_classifier().SerializeToString(), providers=["CPUExecutionProvider"]
    )


def test_any_sequence_length_over_http_and_grpc(daemon: Daemon) -> None:
    status, meta = daemon.get("/v2/models/text")
    assert status == 200
    assert {t["name"]: t["shape"] for t in meta["inputs"]} == {"ids": [-1, -1]}
    assert {t["name"]: t["shape"] for t in meta["outputs"]} == {
        "logits": [-1, 4],
        "hidden": [-1, -1, 16],
    }
    status, config = daemon.get("/v2/models/text/config")
    assert status == 200 and config["input"][0]["dims"] == [-1]

    reference = _reference()
    rng = np.random.default_rng(0)
    http = httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}")
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}")
    for i, n in enumerate(LENGTHS * 2):
        ids = rng.integers(0, 100, (1 + i % 3, n)).astype(np.int64)
        logits, hidden = reference.run(None, {"ids": ids})
        binary = i % 2 == 0
        h_in = httpclient.InferInput("ids", list(ids.shape), "INT64")
        h_in.set_data_from_numpy(ids, binary_data=binary)
        outs = [
            httpclient.InferRequestedOutput(name, binary_data=binary)
            for name in ("logits", "hidden")
        ]
        got = http.infer("text", [h_in], outputs=outs)
        np.testing.assert_allclose(got.as_numpy("logits"), logits, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got.as_numpy("hidden"), hidden, rtol=1e-6)
        g_in = grpcclient.InferInput("ids", list(ids.shape), "INT64")
        g_in.set_data_from_numpy(ids)
        got_g = grpc.infer("text", [g_in])
        np.testing.assert_allclose(got_g.as_numpy("logits"), logits, rtol=1e-5, atol=1e-5)
        assert got_g.as_numpy("hidden").shape == hidden.shape
    # A rank the model does not take is the caller's error, named.
    status, body = daemon.post(
        "/v2/models/text/infer",
        {"inputs": [{"name": "ids", "datatype": "INT64", "shape": [1, 2, 2], "data": [1] * 4}]},
    )
    assert status == 400 and "'ids'" in body["error"]

"""Triton's ``L0_parameters/class_count_test.py`` against the daemon, over HTTP and gRPC: an
output asked for as its top classes (``class_count``) comes back as BYTES ``"value:index"``
written as Triton writes it (``1.000000:3``); a BYTES output cannot be classified, nor an
output of more than a million elements, and both are refused in Triton's words.

Triton's ``identity_fp32`` / ``identity_bytes`` are python identities; here they are ONNX."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.test_daemon_support import (
    Daemon,
    all_loaded,
    start_daemon,
    stop_daemon,
    wait_for,
)
from tests.models import save
from tests.triton_qa_models import config_text, identity_model

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("class_count")
    repo = tmp / "models"
    for name, dtype, kind in (
        ("identity_fp32", np.float32, "TYPE_FP32"),
        ("identity_bytes", object, "TYPE_STRING"),
    ):
        (repo / name / "1").mkdir(parents=True)
        save(identity_model(1, dtype, [-1], 64), repo / name / "1" / "model.onnx")
        (repo / name / "config.pbtxt").write_text(
            config_text(64, [("INPUT0", kind, [-1])], [("OUTPUT0", kind, [-1])])
        )
    d = start_daemon(tmp, "--model-repository", str(repo), wait_ready=False)
    try:
        wait_for(lambda: all_loaded(d), 120, "the models to load")
    except BaseException:
        stop_daemon(d)
        raise
    yield d
    stop_daemon(d)


@pytest.fixture(params=["http", "grpc"])
def client(request: pytest.FixtureRequest, daemon: Daemon) -> Iterator[Any]:
    if request.param == "http":
        c: Any = httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}")
    else:
        c = grpcclient.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}")
    yield c
    c.close()


def _call(client: Any, model: str, data: np.ndarray, datatype: str) -> Any:
    module = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
    inputs = [module.InferInput("INPUT0", list(data.shape), datatype)]
    inputs[0].set_data_from_numpy(data)
    outputs = [module.InferRequestedOutput(name="OUTPUT0", class_count=5)]
    return client.infer(model_name=model, inputs=inputs, outputs=outputs)


def test_classification(client: Any) -> None:
    result = _call(client, "identity_fp32", np.ones((1, 8), np.float32), "FP32")
    output = result.get_output("OUTPUT0")
    datatype = output["datatype"] if isinstance(output, dict) else output.datatype
    assert datatype == "BYTES"
    top = result.as_numpy("OUTPUT0")
    assert top.shape == (1, 5)
    assert all(bytes(v).decode().startswith("1.000000:") for v in top.ravel()), top
    ranked = _call(client, "identity_fp32", np.array([[0.5, 3, -1, 2]], np.float32), "FP32")
    assert [bytes(v) for v in ranked.as_numpy("OUTPUT0").ravel()] == [
        b"3.000000:1", b"2.000000:3", b"0.500000:0", b"-1.000000:2"
    ]  # fmt: skip


def test_classification_of_bytes_is_refused(client: Any) -> None:
    data = np.array([["test"] * 8], dtype=object)
    with pytest.raises(InferenceServerException) as info:
        _call(client, "identity_bytes", data, "BYTES")
    assert "class result not available for output due to unsupported type 'BYTES'" in str(
        info.value
    )
    assert info.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")


def test_classification_output_tensor_too_large(client: Any) -> None:
    data = np.ones((1, 1_000_001), np.float32)
    with pytest.raises(InferenceServerException) as info:
        _call(client, "identity_fp32", data, "FP32")
    assert "classification output tensor too large" in str(info.value)
    assert info.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")

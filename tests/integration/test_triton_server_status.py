"""Triton's ``L0_server_status`` (server and model metadata, unknown models and versions in
metadata and statistics) and the HTTP repository index's ``{"ready": true}``, against the
daemon over HTTP and gRPC.

Triton's ``test_basic`` also holds the server to being Triton: ``name == "triton"`` and its
version; those two are ours (``model-runtime`` and its version) and are not asserted here."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.test_daemon_support import (
    Daemon,
    start_daemon,
    stop_daemon,
    wait_for,
)
from tests.triton_qa_models import write_identity

pytestmark = pytest.mark.timeout(120)

#: the extensions Triton's test looks for
EXTENSIONS = [
    "classification",
    "sequence",
    "model_repository",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "cuda_shared_memory",
    "binary_tensor_data",
    "statistics",
]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("server_status")
    repo = tmp / "models"
    write_identity(repo, "onnx", 1, np.float32, [-1], 8)
    broken = repo / "broken" / "1"
    broken.mkdir(parents=True)
    (broken / "model.onnx").write_bytes(b"not a model")
    d = start_daemon(
        tmp, "--model-repository", str(repo), "--exit-on-error=false", wait_ready=False
    )
    try:
        wait_for(lambda: _loaded_but_broken(d), 120, "the model to load")
    except BaseException:
        stop_daemon(d)
        raise
    yield d
    stop_daemon(d)


def _loaded_but_broken(d: Daemon) -> bool:
    index = {m["name"]: m["state"] for m in d.post("/v2/repository/index")[1]}
    return index.get("onnx_zero_1_float32") == "READY" and index.get("broken") == "UNAVAILABLE"


@pytest.fixture(params=["http", "grpc"])
def client(request: pytest.FixtureRequest, daemon: Daemon) -> Iterator[Any]:
    if request.param == "http":
        c: Any = httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}")
    else:
        c = grpcclient.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}")
    yield c
    c.close()


def _get(doc: Any, key: str) -> Any:
    return doc[key] if isinstance(doc, dict) else getattr(doc, key)


def test_basic(client: Any) -> None:
    assert client.is_server_live()
    server = client.get_server_metadata()
    for extension in EXTENSIONS:
        assert extension in _get(server, "extensions")
    model = client.get_model_metadata("onnx_zero_1_float32")
    assert _get(model, "name") == "onnx_zero_1_float32"
    assert _get(model, "platform") == "onnxruntime_onnx"  # as its config says


def test_unknown_model(client: Any) -> None:
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata("foo")
    assert info.value.message().startswith("Request for unknown model: 'foo' is not found")
    with pytest.raises(InferenceServerException) as info:
        client.get_inference_statistics("foo")
    assert info.value.message().startswith("Request for unknown model: 'foo' is not found")


def test_unknown_model_version(client: Any) -> None:
    name = "onnx_zero_1_float32"
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata(name, model_version="99")
    assert info.value.message().startswith(
        f"Request for unknown model: '{name}' version 99 is not found"
    )
    with pytest.raises(InferenceServerException) as info:
        client.get_inference_statistics(name, model_version="99")
    assert info.value.message().startswith(
        f"Request for unknown model: '{name}' version 99 is not found"
    )


def test_repository_index_of_ready_models(daemon: Daemon) -> None:
    everything = requests.post(daemon.url("/v2/repository/index"), timeout=10).json()
    assert {m["name"] for m in everything} == {"onnx_zero_1_float32", "broken"}
    ready = requests.post(daemon.url("/v2/repository/index"), json={"ready": True}, timeout=10)
    assert [m["name"] for m in ready.json()] == ["onnx_zero_1_float32"]
    http = httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}")
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}")
    try:
        assert [m["name"] for m in http.get_model_repository_index()] == sorted(
            m["name"] for m in everything
        )
        ready_grpc = grpc.get_model_repository_index()  # tritonclient sends no 'ready'
        assert len(ready_grpc.models) == 2
    finally:
        http.close()
        grpc.close()
    bad = requests.post(daemon.url("/v2/repository/index"), json={"ready": "yes"}, timeout=10)
    assert bad.status_code == 400

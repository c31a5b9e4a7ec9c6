"""Triton's ``L0_parameters/parameters_test.py`` against the daemon: request parameters other
than Triton's own reach the model (a python model reads them in ``request.parameters()``; an
ONNX model ignores them), over HTTP, gRPC, their asyncio clients and the gRPC stream; Triton's
reserved ``triton_*`` names are refused over HTTP in Triton's words.

Out of reach here: the ``ensemble`` call of that suite (not ported: a request's parameters reaching
an ensemble's step is tests/integration/test_ensembles.py's) and header forwarding
(``--http-header-forward-pattern`` / ``--grpc-header-forward-pattern``: no such options)."""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio

from tests.integration.test_daemon_support import (
    Daemon,
    all_loaded,
    start_daemon,
    stop_daemon,
    wait_for,
)
from tests.models import save
from tests.triton_qa_models import config_text, identity_model

pytestmark = pytest.mark.timeout(120)

#: Triton's ``parameter`` model: each request's parameters back as ``key`` / ``value`` strings
PARAMETER_MODEL = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            parameters = json.loads(request.parameters())
            keys = np.asarray(list(parameters), dtype=object)
            values = np.asarray([str(v) for v in parameters.values()], dtype=object)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("key", keys), pb_utils.Tensor("value", values)]))
        return responses
"""

PARAMETER_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [
  { name: "key" data_type: TYPE_STRING dims: [ -1 ] },
  { name: "value" data_type: TYPE_STRING dims: [ -1 ] }
]
instance_group [ { kind: KIND_CPU } ]
"""

PARAMETERS: list[dict[str, Any]] = [
    {"key1": "value1", "key2": "value2"},
    {"key1": 1, "key2": 2},
    {"key1": 123.123, "key2": 321.321},
    {"key1": True, "key2": "value2"},
]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("parameters")
    repo = tmp / "models"
    (repo / "parameter" / "1").mkdir(parents=True)
    (repo / "parameter" / "1" / "model.py").write_text(PARAMETER_MODEL)
    (repo / "parameter" / "config.pbtxt").write_text(PARAMETER_CONFIG)
    (repo / "identity" / "1").mkdir(parents=True)
    save(identity_model(1, np.float32, [1], 0), repo / "identity" / "1" / "model.onnx")
    fp32 = [("INPUT0", "TYPE_FP32", [1])]
    (repo / "identity" / "config.pbtxt").write_text(
        config_text(0, fp32, [("OUTPUT0", "TYPE_FP32", [1])])
    )
    d = start_daemon(tmp, "--model-repository", str(repo), wait_ready=False)
    try:
        wait_for(lambda: all_loaded(d), 120, "the models to load")
    except BaseException:
        stop_daemon(d)
        raise
    yield d
    stop_daemon(d)


def _inputs(module: Any) -> list[Any]:
    tensor = module.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.asarray([1], dtype=np.float32))
    return [tensor]


def _check(result: Any, parameters: dict[str, Any]) -> None:
    keys = [bytes(k).decode() for k in result.as_numpy("key").ravel()]
    values = [bytes(v).decode() for v in result.as_numpy("value").ravel()]
    assert set(keys) == set(parameters)
    assert set(values) == {str(v) for v in parameters.values()}


@pytest.mark.parametrize("parameters", PARAMETERS, ids=["strings", "ints", "floats", "bool"])
def test_params(daemon: Daemon, parameters: dict[str, Any]) -> None:
    # This tritonclient's gRPC client refuses float parameters before sending them (newer ones
    # send them as double_param); they go over HTTP only.
    floats = any(isinstance(v, float) for v in parameters.values())
    http = httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}")
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}")
    try:
        for client, module in ((http, httpclient), (grpc, grpcclient))[: 1 if floats else 2]:
            _check(client.infer("parameter", _inputs(module), parameters=parameters), parameters)
            # an ONNX model takes them and ignores them
            out = client.infer("identity", _inputs(module), parameters=parameters)
            np.testing.assert_array_equal(out.as_numpy("OUTPUT0"), [1.0])
        _check(http.async_infer("parameter", _inputs(httpclient), parameters=parameters)
               .get_result(), parameters)  # fmt: skip
        if not floats:
            answers: queue.Queue[Any] = queue.Queue()

            def put(result: Any, error: Any) -> None:
                answers.put(result or error)

            grpc.async_infer("parameter", _inputs(grpcclient), put, parameters=parameters)
            _check(answers.get(timeout=30), parameters)
            grpc.start_stream(put)
            try:
                grpc.async_stream_infer("parameter", _inputs(grpcclient), parameters=parameters)
                _check(answers.get(timeout=30), parameters)
            finally:
                grpc.stop_stream()
    finally:
        http.close()
        grpc.close()

    async def with_asyncio() -> None:
        ahttp = httpaio.InferenceServerClient(f"127.0.0.1:{daemon.port}")
        agrpc = grpcaio.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}")
        try:
            for client, module in ((ahttp, httpclient), (agrpc, grpcclient))[: 1 if floats else 2]:
                result = await client.infer("parameter", _inputs(module), parameters=parameters)
                _check(result, parameters)
        finally:
            await ahttp.close()
            await agrpc.close()

    asyncio.run(with_asyncio())


@pytest.mark.parametrize(
    "key", ["triton_enable_empty_final_response", "triton_final_response",
            "triton_injected_via_header"],
)  # fmt: skip
def test_params_reserved_rejected_over_raw_http(daemon: Daemon, key: str) -> None:
    body = {
        "inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1.0]}],
        "parameters": {key: "dummy-value"},
    }
    r = requests.post(daemon.url("/v2/models/parameter/infer"), json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert "reserved for Triton usage" in r.text

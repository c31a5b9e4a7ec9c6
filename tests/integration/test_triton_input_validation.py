"""Triton's ``L0_input_validation``, ``L0_output_name`` and ``L0_nan_inf`` against the daemon,
over HTTP and gRPC: the texts a client matches on when a request lacks required inputs (with
and without optional ones), when BYTES data holds another number of elements than its shape,
when an input's bytes do not fit its shape, or when it asks for an output the model does not
have; and NaN / infinities in an output.

Triton's ``nan_inf_output`` and ``input_*`` models are python models: the first is written
here as ONNX, the others as the python models they are. Its TensorRT shape-tensor models
(``plan_*_int32``) are out of reach (no TensorRT here)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from model_runtime.server.triton import grpc_service_pb2 as pb, grpc_service_pb2_grpc as pb_grpc
from tests.integration.test_daemon_support import (
    Daemon,
    all_loaded,
    start_daemon,
    stop_daemon,
    wait_for,
)
from tests.models import save
from tests.triton_qa_models import (
    config_text,
    constant_model,
    identity_model,
    string_add_sub_model,
    write_identity,
)

pytestmark = pytest.mark.timeout(180)

PY_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = pb_utils.Tensor("OUTPUT0", np.array([1], np.float32))
        return [pb_utils.InferenceResponse([out]) for _ in requests]
"""

NAN_INF = np.array([np.nan, np.inf, -np.inf, 1, 2, 3], np.float32)


def _python_model(repo: Path, name: str, optional: list[bool]) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(PY_MODEL)
    inputs = ", ".join(
        f'{{ name: "INPUT{i}" data_type: TYPE_FP32 dims: [ -1 ] optional: {str(o).lower()} }}'
        for i, o in enumerate(optional)
    )
    (repo / name / "config.pbtxt").write_text(
        f'backend: "python"\ninput [ {inputs} ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        "instance_group [{ kind: KIND_CPU }]\n"
    )


def _onnx(repo: Path, name: str, model: Any, config: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    save(model, repo / name / "1" / "model.onnx")
    (repo / name / "config.pbtxt").write_text(config)


def _repository(repo: Path) -> None:
    _python_model(repo, "input_all_required", [False] * 3)
    _python_model(repo, "input_optional", [False] * 3 + [True])
    _python_model(repo, "input_all_optional", [True] * 3)
    write_identity(repo, "onnx_nobatch", 1, np.float32, [-1], 0)
    fp32, text = "TYPE_FP32", "TYPE_STRING"
    _onnx(
        repo,
        "nan_inf_output",
        constant_model(NAN_INF),
        config_text(0, [("INPUT0", fp32, [-1])], [("OUTPUT0", fp32, [6])]),
    )
    # Triton's pt_identity is a PyTorch identity with the same config
    _onnx(
        repo,
        "pt_identity",
        identity_model(1, np.float32, [8], 8),
        config_text(
            8,
            [("INPUT0", fp32, [8])],
            [("OUTPUT0", fp32, [8])],
            "dynamic_batching { max_queue_delay_microseconds: 1000000 }\n",
        ),
    )
    # dims -1 in the config where the model's are fixed: Triton serves it
    _onnx(
        repo,
        "fixed_as_variable",
        identity_model(1, np.float32, [1], 8),
        config_text(8, [("INPUT0", fp32, [-1])], [("OUTPUT0", fp32, [-1])]),
    )
    i32 = "TYPE_INT32"
    _onnx(repo, "onnx_object_int32_int32", string_add_sub_model(16),
          config_text(8, [("INPUT0", text, [16]), ("INPUT1", text, [16])],
                      [("OUTPUT0", i32, [16]), ("OUTPUT1", i32, [16])]))  # fmt: skip


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("input_validation")
    _repository(tmp / "models")
    d = start_daemon(tmp, "--model-repository", str(tmp / "models"), wait_ready=False)
    try:
        wait_for(lambda: all_loaded(d), 180, "the models to load")
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


def _module(client: Any) -> Any:
    return httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient


def _fp32(client: Any, name: str, data: np.ndarray) -> Any:
    tensor = _module(client).InferInput(name, list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    return tensor


def _refusal(client: Any, model: str, inputs: list[Any]) -> str:
    with pytest.raises(InferenceServerException) as info:
        client.infer(model_name=model, inputs=inputs)
    status = info.value.status()
    assert status in ("400", "StatusCode.INVALID_ARGUMENT"), status
    return str(info.value)


def test_required_inputs_missing(client: Any) -> None:
    assert (
        "expected 3 inputs but got 0 inputs for model 'input_all_required'. Got input(s) [], "
        "but missing required input(s) ['INPUT0','INPUT1','INPUT2']. Please provide all "
        "required input(s)."
    ) in _refusal(client, "input_all_required", [])
    one = [_fp32(client, "INPUT0", np.arange(1, dtype=np.float32))]
    assert (
        "expected 3 inputs but got 1 inputs for model 'input_all_required'. Got input(s) "
        "['INPUT0'], but missing required input(s) ['INPUT1','INPUT2']. Please provide all "
        "required input(s)."
    ) in _refusal(client, "input_all_required", one)


def test_optional_inputs_counted(client: Any) -> None:
    assert (
        "expected number of inputs between 3 and 4 but got 0 inputs for model "
        "'input_optional'. Got input(s) [], but missing required input(s) "
        "['INPUT0','INPUT1','INPUT2']. Please provide all required input(s)."
    ) in _refusal(client, "input_optional", [])
    one = [_fp32(client, "INPUT0", np.arange(1, dtype=np.float32))]
    assert (
        "expected number of inputs between 3 and 4 but got 1 inputs for model "
        "'input_optional'. Got input(s) ['INPUT0'], but missing required input(s) "
        "['INPUT1','INPUT2']. Please provide all required input(s)."
    ) in _refusal(client, "input_optional", one)


def test_all_optional_runs_without_inputs(client: Any) -> None:
    result = client.infer(model_name="input_all_optional", inputs=[])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), [1.0])


def test_input_byte_size_mismatch(client: Any) -> None:
    good = np.arange(8, dtype=np.float32)[None]
    out = client.infer(model_name="pt_identity", inputs=[_fp32(client, "INPUT0", good)])
    np.testing.assert_array_equal(out.as_numpy("OUTPUT0"), good)
    bad = _fp32(client, "INPUT0", np.arange(10, dtype=np.float32)[None])
    bad.set_shape([1, 8])  # a shape that the bytes do not fill
    assert (
        "input byte size mismatch for input 'INPUT0' for model 'pt_identity'. Expected 32, got 40"
    ) in _refusal(client, "pt_identity", [bad])


def _strings(client: Any, count: int, claimed: int) -> list[Any]:
    values = np.array([str(x).encode() for x in range(count)], dtype=object).reshape(1, count)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = _module(client).InferInput(name, [1, count], "BYTES")
        tensor.set_data_from_numpy(values)
        tensor.set_shape([1, claimed])
        inputs.append(tensor)
    return inputs


def test_string_element_counts(client: Any) -> None:
    model = "onnx_object_int32_int32"
    # Triton's test expects these texts for 'INPUT1' (both inputs are wrong; its core checks
    # them in the order of a hash map); the daemon checks them in the request's order.
    short = _refusal(client, model, _strings(client, 14, 16))
    assert (
        f"expected 16 string elements for inference input 'INPUT0' for model '{model}', got 14"
    ) in short
    over = _refusal(client, model, _strings(client, 18, 16))
    assert (
        "unexpected number of string elements 17 for inference input 'INPUT0' for model "
        f"'{model}', expecting 16"
    ) in over
    right = client.infer(model_name=model, inputs=_strings(client, 16, 16))
    np.testing.assert_array_equal(right.as_numpy("OUTPUT0"), 2 * np.arange(16)[None])


def test_unknown_output_name(daemon: Daemon) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{daemon.grpc_port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        request = pb.ModelInferRequest(
            model_name="onnx_nobatch_zero_1_float32", id="output name validation"
        )
        request.inputs.add(name="INPUT0", datatype="FP32", shape=[1])
        request.outputs.add(name="DUMMY")
        request.raw_input_contents.append(b"aaaa")
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(request, timeout=30)
    assert info.value.details().startswith(  # type: ignore[attr-defined]
        "unexpected inference output 'DUMMY' for model"
    )


def test_nan_and_infinities(client: Any, daemon: Daemon) -> None:
    inputs = [_fp32(client, "INPUT0", np.arange(1, dtype=np.float32))]
    out = client.infer(model_name="nan_inf_output", inputs=inputs).as_numpy("OUTPUT0")
    np.testing.assert_array_equal(out, NAN_INF)  # NaN equals NaN here
    payload = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1]}]}
    r = requests.post(
        daemon.url("/v2/models/nan_inf_output/infer"), data=json.dumps(payload), timeout=30
    )
    assert r.ok, r.text
    data = r.json()["outputs"][0]["data"]  # Python's json reads NaN and Infinity, as Triton
    np.testing.assert_array_equal(np.array(data, np.float32), NAN_INF)  # writes them


def test_config_minus_one_over_a_fixed_model_dimension(client: Any) -> None:
    meta = client.get_model_metadata("fixed_as_variable")
    inputs = (
        meta["inputs"]
        if isinstance(meta, dict)
        else [{"shape": list(i.shape)} for i in meta.inputs]
    )
    assert inputs[0]["shape"] == [-1, -1]  # as the config says
    x = np.array([[3.5]], np.float32)
    out = client.infer(model_name="fixed_as_variable", inputs=[_fp32(client, "INPUT0", x)])
    np.testing.assert_array_equal(out.as_numpy("OUTPUT0"), x)
    wider = [_fp32(client, "INPUT0", np.zeros((1, 2), np.float32))]
    assert "INPUT0" in _refusal(client, "fixed_as_variable", wider)  # the model's own size

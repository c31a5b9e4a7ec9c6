"""String (BYTES) tensors end to end: compile an ONNX model with STRING inputs and outputs,
run it through ``ModelRunner`` with many callers whose strings of different lengths share
batches, and serve it from the daemon to Triton's own clients over HTTP (JSON and binary) and
gRPC (raw and ``bytes_contents``), as NVIDIA's ``simple_identity`` example does."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import onnx
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc

from model_runtime import ModelRunner, ModelRunnerConfig
from model_runtime.compiler import CompileOptions, compile_model
from model_runtime.executable.container import Executable
from tests.integration.test_daemon_support import Daemon, start_daemon, stop_daemon
from tests.models import make_string_identity, make_string_mixed, save

pytestmark = pytest.mark.timeout(120)

IDENTITY_CONFIG = """
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ 1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 2000 }
"""


def _words(i: int, n: int) -> np.ndarray:
    return np.array([[f"{i}-{j}-".encode() + b"\xc3\xa9" * (i % 5)] for j in range(n)], object)


def test_compiled_executable_carries_bytes_anchors(tmp_path: Path) -> None:
    path = compile_model(make_string_mixed(), tmp_path / "s.mrx", CompileOptions(batch_size=4))
    m = Executable.load(path).metadata
    kinds = {a.name: a.dtype.kind for a in (*m.user_inputs, *m.user_outputs)}
    assert kinds == {"text": "O", "x": "f", "echo": "O", "is_yes": "b", "double": "f"}
    assert "batch_sizes" not in m.options  # strings get one batch size
    # The graph's "yes" is a string constant: data of the executable, not of the payload.
    (yes,) = m.weights
    assert (yes.name, yes.dtype.kind, yes.has_data) == ("yes", "O", True)
    assert Executable.load(path).anchor_data("yes").tolist() == [b"yes"]


def test_runner_batches_strings_of_many_callers(tmp_path: Path) -> None:
    path = compile_model(make_string_mixed(), tmp_path / "s.mrx", CompileOptions(batch_size=4))

    async def main() -> None:
        config = ModelRunnerConfig(batching_dim=0, timeout=0.05)
        async with ModelRunner(path, config) as runner:

            async def one(i: int) -> None:
                n = 1 + i % 3
                text = np.array([[b"x" * i, b"yes"]] * n, dtype=object)
                x = np.full((n, 4), i, np.float32)
                out = await runner.execute({"text": text, "x": x})
                assert out["echo"].dtype == object and out["echo"].shape == (n, 2)
                assert out["echo"].tolist() == text.tolist()  # its own rows, in order
                assert out["is_yes"].tolist() == [[False, True]] * n
                np.testing.assert_array_equal(out["double"], 2 * x)

            await asyncio.gather(*(one(i) for i in range(1, 25)))
            # str (UTF-8) and nested lists are taken too; bytes come back
            out = await runner.execute({"text": [["é", "yes"]], "x": np.zeros((1, 4), np.float32)})
            assert out["echo"].tolist() == [["é".encode(), b"yes"]]

    asyncio.run(main())


def test_a_partial_batch_of_numbers_written_as_strings_runs(tmp_path: Path) -> None:
    # The graph parses its strings (Cast to int32): padding rows of b"" would make the whole
    # batch fail; the pool pads with copies of a real row, whose outputs nobody sees.
    text = onnx.helper.make_tensor_value_info("text", onnx.TensorProto.STRING, ["N", 1])
    out = onnx.helper.make_tensor_value_info("number", onnx.TensorProto.INT32, ["N", 1])
    cast = onnx.helper.make_node("Cast", ["text"], ["number"], to=onnx.TensorProto.INT32)
    graph = onnx.helper.make_graph([cast], "parse", [text], [out])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)])
    path = compile_model(model, tmp_path / "parse.mrx", CompileOptions(batch_size=4))

    async def main() -> None:
        config = ModelRunnerConfig(batching_dim=0, timeout=0.001)
        async with ModelRunner(path, config) as runner:
            for n in (1, 2, 3, 5):
                words = np.array([[str(7 * i).encode()] for i in range(n)], dtype=object)
                got = await runner.execute({"text": words})
                assert got["number"].ravel().tolist() == [7 * i for i in range(n)]

    asyncio.run(main())


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("bytes")
    repo = tmp / "models"
    (repo / "simple_identity" / "1").mkdir(parents=True)
    (repo / "simple_identity" / "config.pbtxt").write_text(IDENTITY_CONFIG)
    save(make_string_identity(), repo / "simple_identity" / "1" / "model.onnx")
    d = start_daemon(tmp, "--model-repository", str(repo))
    yield d
    stop_daemon(d)


def test_metadata_and_config_say_bytes(daemon: Daemon) -> None:
    meta = requests.get(daemon.url("/v2/models/simple_identity"), timeout=10).json()
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "BYTES", "shape": [-1, 1]}]
    assert meta["outputs"] == [{"name": "OUTPUT0", "datatype": "BYTES", "shape": [-1, 1]}]
    config = requests.get(daemon.url("/v2/models/simple_identity/config"), timeout=10).json()
    assert config["input"][0]["data_type"] == "TYPE_STRING"
    assert config["max_batch_size"] == 8


def test_http_json_and_binary(daemon: Daemon) -> None:
    body = {
        "inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [2, 1], "data": ["héllo", "x"]}]
    }
    r = requests.post(daemon.url("/v2/models/simple_identity/infer"), json=body, timeout=10)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == ["héllo", "x"]
    assert r.json()["outputs"][0]["datatype"] == "BYTES"

    client = httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}")
    try:
        for binary in (True, False):
            data = _words(3, 3)
            inp = httpclient.InferInput("INPUT0", list(data.shape), "BYTES")
            inp.set_data_from_numpy(data, binary_data=binary)
            out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)
            result = client.infer("simple_identity", [inp], outputs=[out])
            got = result.as_numpy("OUTPUT0")
            if not binary:  # tritonclient gives JSON strings back as str
                got = np.vectorize(str.encode, otypes=[object])(got)
            assert got.tolist() == data.tolist()
    finally:
        client.close()

    bad = {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1, 1], "data": [7]}]}
    r = requests.post(daemon.url("/v2/models/simple_identity/infer"), json=bad, timeout=10)
    assert r.status_code == 400 and "must be strings" in r.json()["error"]


def test_grpc_raw_and_bytes_contents_concurrently(daemon: Daemon) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}")
    try:
        sent = [_words(i, 1 + i % 3) for i in range(12)]
        pending = []
        results: list[np.ndarray] = [np.empty(0)] * len(sent)

        def done(i: int) -> object:
            def callback(result: grpcclient.InferResult, error: object) -> None:
                assert error is None, error
                results[i] = result.as_numpy("OUTPUT0")

            return callback

        for i, data in enumerate(sent):
            inp = grpcclient.InferInput("INPUT0", list(data.shape), "BYTES")
            inp.set_data_from_numpy(data)  # raw contents: 4-byte lengths and bytes
            pending.append(client.async_infer("simple_identity", [inp], callback=done(i)))
        for _ in range(200):
            if all(r.size for r in results):
                break
            time.sleep(0.05)
        for data, got in zip(sent, results, strict=True):
            assert got.tolist() == data.tolist()  # each caller its own rows
    finally:
        client.close()

    channel = grpc.insecure_channel(f"127.0.0.1:{daemon.grpc_port}")
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    request = service_pb2.ModelInferRequest(model_name="simple_identity")
    tensor = request.inputs.add(name="INPUT0", datatype="BYTES", shape=[2, 1])
    tensor.contents.bytes_contents.extend([b"a\x00b", b""])
    response = stub.ModelInfer(request, timeout=10)
    raw = response.raw_output_contents[0]
    assert raw == b"\x03\x00\x00\x00a\x00b" + b"\x00\x00\x00\x00"
    tensor.contents.bytes_contents.append(b"extra")
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    channel.close()

"""Triton's client flows, written here (not NVIDIA's example files), against the real daemon:
the calls Triton's Python examples make (``simple_http_infer_client``, its async and aio
siblings, ``simple_http_string_infer_client``, ``grpc_client``, the gRPC async client, the
``grpc_explicit_{int,int8,byte}_content_client`` family, ``simple_*_model_control``) with
the models they expect, built as ONNX: ``simple`` (INT32 [16]: sum and difference),
``simple_int8`` (the same in INT8), ``simple_string`` (the same on numbers written as
strings) and ``simple_identity`` (BYTES in, BYTES out). A sequence sent to one of these
stateless models is refused with an error that names it, and the daemon serves on; streaming
serves any model (sequences: ``test_sequence_flows.py``). (Shared memory:
``test_shared_memory_flows.py``.)"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from onnx import TensorProto
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException, deserialize_bytes_tensor

from tests.integration.test_daemon_support import Daemon, start_daemon, stop_daemon
from tests.models import make_simple, make_simple_string, make_string_identity, save

pytestmark = pytest.mark.timeout(120)

MODELS = ("simple", "simple_int8", "simple_string", "simple_identity")


def _config(datatype: str, dims: int) -> str:
    tensors = ("INPUT0", "INPUT1") if dims == 16 else ("INPUT0",)
    outs = ("OUTPUT0", "OUTPUT1") if dims == 16 else ("OUTPUT0",)

    def listed(names: tuple[str, ...]) -> str:
        return ", ".join(
            f'{{ name: "{n}" data_type: TYPE_{datatype} dims: [ {dims} ] }}' for n in names
        )

    return f"max_batch_size: 8\ninput [ {listed(tensors)} ]\noutput [ {listed(outs)} ]\n"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("flows")
    repo = tmp / "models"
    builds = {
        "simple": (make_simple(), _config("INT32", 16)),
        "simple_int8": (make_simple(TensorProto.INT8), _config("INT8", 16)),
        "simple_string": (make_simple_string(), _config("STRING", 16)),
        "simple_identity": (make_string_identity(), _config("STRING", 1)),
    }
    for name, (model, config) in builds.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)
        save(model, repo / name / "1" / "model.onnx")
    loads = [arg for name in MODELS for arg in ("--load-model", name)]
    d = start_daemon(
        tmp, "--model-repository", str(repo), "--model-control-mode", "explicit", *loads
    )
    yield d
    stop_daemon(d)
    assert d.proc.returncode == 0  # every refusal below left it serving, then it drained


def _pair(rows: int = 1) -> tuple[np.ndarray, np.ndarray]:
    a = np.arange(16 * rows, dtype=np.int32).reshape(rows, 16)
    return a, np.ones((rows, 16), np.int32)


def _http_inputs(a: np.ndarray, b: np.ndarray, datatype: str = "INT32") -> list[Any]:
    inputs = [httpclient.InferInput(n, list(a.shape), datatype) for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(a, binary_data=False)  # one JSON, one binary, as the
    inputs[1].set_data_from_numpy(b, binary_data=True)  # examples send them
    return inputs


def _http_outputs() -> list[Any]:
    return [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=False),
    ]


def _check(result: Any, a: np.ndarray, b: np.ndarray) -> None:
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def _numbers_as_bytes(x: np.ndarray) -> np.ndarray:
    return np.vectorize(lambda v: str(v).encode(), otypes=[object])(x)


def _refused(call: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value


# -- HTTP -----------------------------------------------------------------------------------


def test_http_sync_infer_and_unknown_model(daemon: Daemon) -> None:
    with httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}") as client:
        assert client.is_server_live() and client.is_server_ready()
        a, b = _pair()
        _check(client.infer("simple", _http_inputs(a, b), outputs=_http_outputs()), a, b)
        unknown = _refused(lambda: client.infer("wrong", _http_inputs(a, b)))
        assert unknown.message() == "Request for unknown model: 'wrong' is not found"


def test_http_async_infer(daemon: Daemon) -> None:
    with httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}", concurrency=4) as client:
        pairs = [_pair(rows) for rows in (1, 2, 3, 4)]
        pending = [client.async_infer("simple", _http_inputs(a, b)) for a, b in pairs]
        for (a, b), request in zip(pairs, pending, strict=True):
            _check(request.get_result(), a, b)


def test_http_aio_client(daemon: Daemon) -> None:
    async def main() -> None:
        client = httpaio.InferenceServerClient(f"127.0.0.1:{daemon.port}")
        try:
            assert await client.is_server_live()
            assert await client.is_model_ready("simple")
            meta = await client.get_model_metadata("simple")
            assert [i["datatype"] for i in meta["inputs"]] == ["INT32", "INT32"]
            pairs = [_pair(rows) for rows in (1, 2, 5)]
            results = await asyncio.gather(
                *(client.infer("simple", _http_inputs(a, b)) for a, b in pairs)
            )
            for (a, b), result in zip(pairs, results, strict=True):
                _check(result, a, b)
            with pytest.raises(InferenceServerException, match="unknown model: 'wrong'"):
                await client.infer("wrong", _http_inputs(*pairs[0]))
        finally:
            await client.close()

    asyncio.run(main())


def test_http_string_infer(daemon: Daemon) -> None:
    with httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}") as client:
        a, b = _pair(2)
        for binary in (False, True):
            inputs = [httpclient.InferInput(n, [2, 16], "BYTES") for n in ("INPUT0", "INPUT1")]
            inputs[0].set_data_from_numpy(_numbers_as_bytes(a), binary_data=binary)
            inputs[1].set_data_from_numpy(_numbers_as_bytes(b), binary_data=binary)
            outputs = [httpclient.InferRequestedOutput(n, binary_data=binary)
                       for n in ("OUTPUT0", "OUTPUT1")]  # fmt: skip
            result = client.infer("simple_string", inputs, outputs=outputs)
            for name, want in (("OUTPUT0", a + b), ("OUTPUT1", a - b)):
                got = result.as_numpy(name)
                assert got.dtype == object and got.shape == (2, 16)
                np.testing.assert_array_equal(got.astype(np.int32), want)
        ident = httpclient.InferInput("INPUT0", [2, 1], "BYTES")
        words = np.array([[b"caf\xc3\xa9"], [b"tab\tand\x00nul"]], object)
        ident.set_data_from_numpy(words, binary_data=True)
        result = client.infer("simple_identity", [ident])
        assert result.as_numpy("OUTPUT0").tolist() == words.tolist()


# -- gRPC -----------------------------------------------------------------------------------


def _grpc_inputs(a: np.ndarray, b: np.ndarray, datatype: str = "INT32") -> list[Any]:
    inputs = [grpcclient.InferInput(n, list(a.shape), datatype) for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def test_grpc_client_metadata_config_and_sync_infer(daemon: Daemon) -> None:
    with grpcclient.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}") as client:
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready("simple")
        meta = client.get_model_metadata("simple", as_json=True)
        assert [(i["name"], i["datatype"]) for i in meta["inputs"]] == [
            ("INPUT0", "INT32"), ("INPUT1", "INT32"),
        ]  # fmt: skip
        config = client.get_model_config("simple", as_json=True)["config"]
        assert int(config["max_batch_size"]) == 8
        assert client.get_server_metadata(as_json=True)["name"]
        a, b = _pair(3)
        _check(client.infer("simple", _grpc_inputs(a, b)), a, b)
        strings = _grpc_inputs(_numbers_as_bytes(a), _numbers_as_bytes(b), "BYTES")
        result = client.infer("simple_string", strings)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0").astype(np.int32), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1").astype(np.int32), a - b)


def test_grpc_async_infer_with_callbacks(daemon: Daemon) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    with grpcclient.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}") as client:
        pairs = [_pair(rows) for rows in (1, 2, 3)]
        for a, b in pairs:
            client.async_infer(
                "simple", _grpc_inputs(a, b), lambda result, error: answers.put((result, error))
            )
        got = [answers.get(timeout=10) for _ in pairs]
    for result, error in got:
        assert error is None
        rows = result.as_numpy("OUTPUT0").shape[0]
        a, b = _pair(rows)
        _check(result, a, b)


def test_grpc_aio_client(daemon: Daemon) -> None:
    async def main() -> None:
        async with grpcaio.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}") as client:
            a, b = _pair(2)
            _check(await client.infer("simple", _grpc_inputs(a, b)), a, b)

    asyncio.run(main())


def _typed_request(model: str, datatype: str, fill: Any) -> Any:
    """A ``ModelInferRequest`` with explicit typed ``contents`` (no raw contents), as the
    ``grpc_explicit_*_content_client`` examples build it."""
    request = service_pb2.ModelInferRequest(model_name=model)
    for name in ("INPUT0", "INPUT1"):
        tensor = request.inputs.add(name=name, datatype=datatype, shape=[1, 16])
        fill(tensor.contents, name)
    for name in ("OUTPUT0", "OUTPUT1"):
        request.outputs.add(name=name)
    return request


def test_grpc_explicit_int_int8_and_byte_contents(daemon: Daemon) -> None:
    a, b = list(range(16)), [1] * 16
    with grpc.insecure_channel(f"127.0.0.1:{daemon.grpc_port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for model, datatype, dtype in (("simple", "INT32", np.int32),
                                       ("simple_int8", "INT8", np.int8)):  # fmt: skip
            request = _typed_request(
                model,
                datatype,
                lambda c, n: c.int_contents.extend(a if n == "INPUT0" else b),
            )
            response = stub.ModelInfer(request, timeout=10)
            outs = {o.name: o for o in response.outputs}
            assert outs["OUTPUT0"].datatype == datatype
            total, diff = (np.frombuffer(raw, dtype) for raw in response.raw_output_contents)
            np.testing.assert_array_equal(total, np.add(a, b))
            np.testing.assert_array_equal(diff, np.subtract(a, b))
            # As NVIDIA's grpc_explicit_int(8)_content_client.py ends: raw contents for half
            # of INPUT0 beside its typed contents is refused in Triton's words.
            request.raw_input_contents.extend([np.array(a[:8], dtype).tobytes()])
            request.inputs[0].contents.int_contents[:] = a[8:]
            with pytest.raises(grpc.RpcError) as info:
                stub.ModelInfer(request, timeout=10)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert (
                "contents field must not be specified when using raw_input_contents for "
                f"'INPUT0' for model '{model}'"
            ) in str(info.value.details())
            # ... and the int8 one with a version that is no number, in Triton's words.
            request.model_version = "wrong_specification"
            with pytest.raises(grpc.RpcError) as info:
                stub.ModelInfer(request, timeout=10)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert info.value.details() == (
                "failed to get model version from specified version string "
                "'wrong_specification' (details: stol), version should be an integral value > 0"
            )

        request = _typed_request(
            "simple_string",
            "BYTES",
            lambda c, n: c.bytes_contents.extend(
                str(v).encode() for v in (a if n == "INPUT0" else b)
            ),
        )
        response = stub.ModelInfer(request, timeout=10)
        total, diff = (deserialize_bytes_tensor(raw) for raw in response.raw_output_contents)
        assert [int(v) for v in total] == list(np.add(a, b))
        assert [int(v) for v in diff] == list(np.subtract(a, b))


# -- model control ----------------------------------------------------------------------------


def test_model_control_over_http_and_grpc(daemon: Daemon) -> None:
    with (
        httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}") as http,
        grpcclient.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}") as rpc,
    ):
        index = {m["name"]: m["state"] for m in http.get_model_repository_index()}
        assert index == dict.fromkeys(MODELS, "READY")
        grpc_index = rpc.get_model_repository_index(as_json=True)["models"]
        assert {m["name"] for m in grpc_index} == set(MODELS)
        for client in (http, rpc):
            client.unload_model("simple")
            assert not client.is_model_ready("simple")
            client.load_model("simple")
            assert client.is_model_ready("simple")
            bad = _refused(lambda c=client: c.load_model("wrong_model_name"))
            assert "failed to load 'wrong_model_name'" in bad.message()
        a, b = _pair()
        _check(http.infer("simple", _http_inputs(a, b)), a, b)


# -- sequences to a stateless model: refused; streaming: served -------------------------------


def test_sequences_are_refused_over_http_and_the_daemon_serves_on(daemon: Daemon) -> None:
    with httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}") as client:
        a, b = _pair()
        seq = _refused(
            lambda: client.infer("simple", _http_inputs(a, b), sequence_id=7, sequence_start=True)
        )
        assert seq.status() == "400" and "sequence parameters" in seq.message()
        _check(client.infer("simple", _http_inputs(a, b)), a, b)


def test_sequences_are_refused_and_streams_served_over_grpc(daemon: Daemon) -> None:
    with grpcclient.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}") as client:
        a, b = _pair()
        seq = _refused(lambda: client.infer("simple", _grpc_inputs(a, b), sequence_id=3))
        assert seq.status() == "StatusCode.INVALID_ARGUMENT"
        assert "sequence parameters" in seq.message()
        _check(client.infer("simple", _grpc_inputs(a, b)), a, b)

    with grpc.insecure_channel(f"127.0.0.1:{daemon.grpc_port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        # One request without inputs (an error answered on the stream, which goes on), one
        # sequence (refused: "simple" is stateless), then a good one.
        bad = service_pb2.ModelInferRequest(model_name="simple", id="bad")
        seq = service_pb2.ModelInferRequest(model_name="simple", id="seq")
        seq.parameters["sequence_id"].int64_param = 9
        good = service_pb2.ModelInferRequest(model_name="simple", id="good")
        for request in (seq, good):
            for name, arr in zip(("INPUT0", "INPUT1"), _pair(), strict=True):
                tensor = request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
                tensor.contents.int_contents.extend(arr.ravel().tolist())
        answers = list(stub.ModelStreamInfer(iter([bad, seq, good]), timeout=30))
        assert len(answers) == 3
        errors = sorted(a.error_message for a in answers if a.error_message)
        assert any("sequence parameters" in e for e in errors), errors
        assert any("but got 0 inputs" in e for e in errors), errors
        # an error answer says which request it answers (answers come as they finish)
        failed = {a.infer_response.id: a.error_message for a in answers if a.error_message}
        assert set(failed) == {"bad", "seq"} and "but got 0 inputs" in failed["bad"]
        (ok,) = [a.infer_response for a in answers if not a.error_message]
        assert ok.id == "good" and [o.name for o in ok.outputs] == ["OUTPUT0", "OUTPUT1"]

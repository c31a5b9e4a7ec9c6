"""The real daemon over gRPC, with Triton's own client (``tritonclient.grpc``): health,
metadata, config, inference with raw and typed contents, bad requests (answered to that caller
only), Triton's error texts, the repository in explicit mode, statistics, and a drain on
SIGTERM that exits 0. One daemon serves the module: ``digits`` (the demo model) is loaded at
start; ``spare`` (the same model) and ``broken`` (not a model) wait in the repository. A Triton
model with two versions, on a daemon of its own: metadata, metrics and statistics per version,
cumulative across a reload."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from model_runtime.demo import DEMO_ONNX_PATH
from model_runtime.server.grpc.health import HealthCheckRequest, HealthCheckResponse
from tests.integration.test_daemon_repository import add_const
from tests.integration.test_daemon_support import (
    Daemon,
    metric,
    samples,
    start_daemon,
    stop_daemon,
)

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]
ATOL = 1e-4
MODEL = "digits"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("grpc")
    repo = tmp / "models"
    repo.mkdir()
    shutil.copy(DEMO_ONNX_PATH, repo / f"{MODEL}.onnx")
    shutil.copy(DEMO_ONNX_PATH, repo / "spare.onnx")
    (repo / "broken.onnx").write_bytes(b"not an onnx model")
    d = start_daemon(
        tmp, "--model-repository", str(repo), "--model-control-mode", "explicit",
        "--load-model", MODEL,
    )  # fmt: skip
    yield d
    stop_daemon(d)
    assert d.proc.returncode == 0  # SIGTERM drained both listeners and exited cleanly


@pytest.fixture
def client(daemon: Daemon) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}")
    yield c
    c.close()


def _pixels_input(pixels: np.ndarray, datatype: str = "FP32") -> grpcclient.InferInput:
    inp = grpcclient.InferInput("pixels", list(pixels.shape), datatype)
    inp.set_data_from_numpy(pixels)
    return inp


def _error(call: object) -> InferenceServerException:
    assert callable(call)
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value


def test_health_and_metadata(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready(MODEL)
    assert client.is_model_ready(MODEL, "1")
    assert not client.is_model_ready("spare")  # in the repository, not loaded
    assert not client.is_model_ready("nope")  # unknown: not ready, as Triton answers
    server = client.get_server_metadata(as_json=True)
    assert server["name"] == "model-runtime"
    assert {"binary_tensor_data", "model_repository", "statistics"} <= set(server["extensions"])
    meta = client.get_model_metadata(MODEL, as_json=True)
    assert meta["name"] == MODEL and meta["versions"] == ["1"]
    assert meta["inputs"] == [{"name": "pixels", "datatype": "FP32", "shape": ["-1", "64"]}]
    assert {o["name"]: o["shape"] for o in meta["outputs"]} == {
        "logits": ["-1", "10"],
        "probabilities": ["-1", "10"],
    }


def test_the_grpc_health_service_says_serving(daemon: Daemon) -> None:
    """What Kubernetes' gRPC probe and grpc_health_probe call, as Triton serves it."""
    with grpc.insecure_channel(f"127.0.0.1:{daemon.grpc_port}") as channel:
        check = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=HealthCheckRequest.SerializeToString,
            response_deserializer=HealthCheckResponse.FromString,
        )
        assert check(HealthCheckRequest(service=""), timeout=10).status == 1  # SERVING


def test_model_config_is_tritons_message(client: grpcclient.InferenceServerClient) -> None:
    config = client.get_model_config(MODEL).config
    assert config.name == MODEL
    assert [i.name for i in config.input] == ["pixels"]
    assert list(config.input[0].dims) == [64]
    assert {o.name for o in config.output} == {"logits", "probabilities"}
    assert config.max_batch_size > 0


def test_infer_with_raw_contents_matches_the_reference(
    client: grpcclient.InferenceServerClient,
) -> None:
    pixels, logits = samples()
    outputs = [grpcclient.InferRequestedOutput("logits")]
    result = client.infer(MODEL, [_pixels_input(pixels)], outputs=outputs, request_id="r-1")
    np.testing.assert_allclose(result.as_numpy("logits"), logits, atol=ATOL)
    assert result.as_numpy("probabilities") is None  # not asked for
    response = result.get_response()
    assert (response.model_name, response.model_version, response.id) == (MODEL, "1", "r-1")


def test_infer_with_typed_contents_and_classification(daemon: Daemon) -> None:
    """tritonclient always sends raw contents; typed ``fp32_contents`` come from the stub."""
    pixels, logits = samples()
    rows = pixels[:4]
    request = service_pb2.ModelInferRequest(model_name=MODEL)
    tensor = request.inputs.add(name="pixels", datatype="FP32", shape=rows.shape)
    tensor.contents.fp32_contents.extend(rows.ravel().tolist())
    request.outputs.add(name="logits")
    request.outputs.add(name="probabilities").parameters["classification"].int64_param = 1
    with grpc.insecure_channel(f"127.0.0.1:{daemon.grpc_port}") as channel:
        response = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(
            request, timeout=30
        )
    got = np.frombuffer(response.raw_output_contents[0], np.float32).reshape(4, 10)
    np.testing.assert_allclose(got, logits[:4], atol=ATOL)
    assert (response.outputs[1].datatype, list(response.outputs[1].shape)) == ("BYTES", [4, 1])
    raw = response.raw_output_contents[1]
    first = raw[4 : 4 + int.from_bytes(raw[:4], "little")].decode()
    assert int(first.split(":")[1]) == int(np.argmax(logits[0]))


def test_bad_requests_are_invalid_argument_and_the_server_serves_on(
    client: grpcclient.InferenceServerClient, daemon: Daemon
) -> None:
    pixels, logits = samples()
    bad_shape = _error(lambda: client.infer(MODEL, [_pixels_input(pixels[:, :63])]))
    assert bad_shape.status() == "StatusCode.INVALID_ARGUMENT", bad_shape
    bad_type = _error(
        lambda: client.infer(MODEL, [_pixels_input(pixels.astype(np.float64), "FP64")])
    )
    assert bad_type.status() == "StatusCode.INVALID_ARGUMENT"
    assert "does not match the model's FP32" in bad_type.message()
    # A sequence (a stateful request) is refused, not ignored.
    seq = _error(lambda: client.infer(MODEL, [_pixels_input(pixels)], sequence_id=7))
    assert seq.status() == "StatusCode.INVALID_ARGUMENT" and "sequence" in seq.message()
    result = client.infer(MODEL, [_pixels_input(pixels)])
    np.testing.assert_allclose(result.as_numpy("logits"), logits, atol=ATOL)
    assert daemon.get("/v2/health/ready")[0] == 200  # HTTP serves on too


def test_a_request_that_is_not_a_message_is_internal_and_the_server_serves_on(
    client: grpcclient.InferenceServerClient, daemon: Daemon
) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{daemon.grpc_port}") as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as info:
            infer(b"\xff\xff\xff", timeout=10)  # a truncated field: no protobuf message
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert info.value.details() == "Exception deserializing request!"  # grpcio's words
    pixels, logits = samples()
    result = client.infer(MODEL, [_pixels_input(pixels)])
    np.testing.assert_allclose(result.as_numpy("logits"), logits, atol=ATOL)


def test_unknown_models_get_tritons_codes_and_words(
    client: grpcclient.InferenceServerClient, daemon: Daemon
) -> None:
    pixels, _ = samples()
    unknown = _error(lambda: client.infer("nope", [_pixels_input(pixels)]))
    assert unknown.status() == "StatusCode.INVALID_ARGUMENT"
    assert unknown.message() == "Request for unknown model: 'nope' is not found"
    meta = _error(lambda: client.get_model_metadata("nope"))
    assert meta.message() == "Request for unknown model: 'nope' is not found"
    version = _error(lambda: client.infer(MODEL, [_pixels_input(pixels)], model_version="7"))
    assert version.status() == "StatusCode.NOT_FOUND"
    assert version.message() == f"Request for unknown model: '{MODEL}' version 7 is not found"
    # HTTP answers alike (Triton's codes: 400 for an unknown name, 404 for an unknown version).
    status, out = daemon.post("/v2/models/nope/infer", {"inputs": []})
    assert (status, out["error"]) == (400, "Request for unknown model: 'nope' is not found")
    status, out = daemon.get(f"/v2/models/{MODEL}/versions/7")
    assert status == 404 and out["error"].endswith("version 7 is not found")


def test_repository_load_unload_and_statistics_in_explicit_mode(
    client: grpcclient.InferenceServerClient,
) -> None:
    index = {m["name"]: m for m in client.get_model_repository_index(as_json=True)["models"]}
    assert set(index) == {MODEL, "spare", "broken"}
    assert index[MODEL]["state"] == "READY"
    client.load_model("spare")
    assert client.is_model_ready("spare")
    pixels, logits = samples()
    result = client.infer("spare", [_pixels_input(pixels[:8])])
    np.testing.assert_allclose(result.as_numpy("logits"), logits[:8], atol=ATOL)
    stats = client.get_inference_statistics("spare", as_json=True)["model_stats"]
    assert [s["name"] for s in stats] == ["spare"]
    assert int(stats[0]["inference_count"]) == 8
    assert int(stats[0]["inference_stats"]["success"]["count"]) == 1
    every = client.get_inference_statistics(as_json=True)["model_stats"]
    assert {s["name"] for s in every} >= {MODEL, "spare"}
    client.unload_model("spare")
    assert not client.is_model_ready("spare")
    gone = _error(lambda: client.infer("spare", [_pixels_input(pixels[:1])]))
    assert gone.status() == "StatusCode.UNAVAILABLE"
    broken = _error(lambda: client.load_model("broken"))
    assert broken.status() == "StatusCode.INVALID_ARGUMENT"
    assert "failed to load 'broken'" in broken.message()
    ghost = _error(lambda: client.load_model("ghost"))
    assert "failed to load 'ghost', failed to poll from model repository" in ghost.message()
    gpu = '{"instance_group": [{"kind": "KIND_GPU"}]}'  # an override we cannot serve
    override = _error(lambda: client.load_model("spare", config=gpu))
    assert override.status() == "StatusCode.INVALID_ARGUMENT"
    assert "failed to load 'spare'" in override.message()
    ready = client.get_model_repository_index(as_json=True)["models"]
    assert MODEL in {m["name"] for m in ready}
    assert client.is_model_ready(MODEL)  # the failures touched no other model


def test_control_mode_and_message_size_limits_hold_over_grpc(tmp_path: Path) -> None:
    """Default mode (none): the repository API may not load or unload, as over HTTP; a message
    over --max-body-size is refused by grpcio before a handler runs; the server serves on."""
    d = start_daemon(tmp_path, "--max-body-size", "100000")
    try:
        with grpcclient.InferenceServerClient(f"127.0.0.1:{d.grpc_port}") as c:
            refused = _error(lambda: c.load_model("digits_mlp"))
            assert refused.status() == "StatusCode.UNAVAILABLE"  # Triton's code and words
            assert (
                refused.message()
                == "explicit model load / unload is not allowed if polling is enabled"
            )
            assert _error(lambda: c.unload_model("digits_mlp")).status() == refused.status()
            pixels, logits = samples()
            big = np.repeat(pixels, 10, axis=0)  # 480 x 64 x 4 bytes > 100,000
            too_big = _error(lambda: c.infer("digits_mlp", [_pixels_input(big)]))
            assert too_big.status() == "StatusCode.RESOURCE_EXHAUSTED"
            result = c.infer("digits_mlp", [_pixels_input(pixels)])
            np.testing.assert_allclose(result.as_numpy("logits"), logits, atol=ATOL)
    finally:
        stop_daemon(d)
    assert d.proc.returncode == 0


TWO_VERSIONS = """
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
version_policy: { all { } }
"""


def test_each_version_is_listed_counted_and_its_statistics_survive_a_reload(
    tmp_path: Path,
) -> None:
    """Model ``a`` serves versions 1 (``y = x + 1``) and 2 (``y = x + 2``), each its own runner:
    over gRPC, the metadata lists both, requests are counted under the version that ran them,
    and statistics are the daemon's cumulative totals (a reload does not reset them)."""
    repo = tmp_path / "models"
    (repo / "a").mkdir(parents=True)
    (repo / "a" / "config.pbtxt").write_text(TWO_VERSIONS)
    for v in (1, 2):
        (repo / "a" / str(v)).mkdir()
        onnx.save_model(add_const(float(v)), str(repo / "a" / str(v) / "model.onnx"))
    d = start_daemon(
        tmp_path, "--model-repository", str(repo), "--model-control-mode", "explicit",
        "--load-model", "a",
    )  # fmt: skip
    try:
        with grpcclient.InferenceServerClient(f"127.0.0.1:{d.grpc_port}") as c:
            assert c.get_model_metadata("a", as_json=True)["versions"] == ["1", "2"]
            x = grpcclient.InferInput("x", [1, 4], "FP32")
            x.set_data_from_numpy(np.zeros((1, 4), np.float32))
            for version, n in (("1", 2), ("2", 3)):
                for _ in range(n):  # one at a time: each request is one execution
                    y = c.infer("a", [x], model_version=version).as_numpy("y")
                    assert y[0, 0] == float(version)

            def stats(version: str) -> dict[str, object]:
                (s,) = c.get_inference_statistics("a", version, as_json=True)["model_stats"]
                assert s["version"] == version
                return s  # type: ignore[no-any-return]

            before = stats("1")
            assert int(before["execution_count"]) == 2  # type: ignore[call-overload]
            assert before["batch_stats"], before  # the daemon's totals: batch_stats included
            c.infer("a", [x], model_version="1")
            c.load_model("a")  # a reload: new runners, nothing read in between
            c.infer("a", [x], model_version="1")
            after = stats("1")
            assert int(after["execution_count"]) == 4  # type: ignore[call-overload]
            assert int(after["inference_stats"]["success"]["count"]) == 4  # type: ignore[index]
            assert int(stats("2")["execution_count"]) == 3  # type: ignore[call-overload]
        _, text = d.get("/metrics")
        for version, n in (("1", 4), ("2", 3)):
            labels = f'{{model="a",version="{version}"}} '
            assert metric(text, f"nv_inference_request_success{labels}") == n, version
            assert metric(text, f"nv_inference_exec_count{labels}") == n, version
            assert metric(text, f"nv_inference_pending_request_count{labels}") == 0, version
    finally:
        stop_daemon(d)

"""NVIDIA's python backend examples (``triton-inference-server/python_backend`` ``examples/``)
against the daemon: our own models of each, in the repository layout its README gives
(``tests/repositories/python_examples``; BLS's ``pytorch`` model is an ONNX model of the same
name and I/O), called as each example's client calls them, and what their clients check."""

from __future__ import annotations

import os
import queue
import shutil
import signal
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from tests.integration.test_daemon_support import Daemon, start_daemon, stop_daemon, wait_for
from tests.integration.test_python_models import _instances
from tests.models import make_add_sub, save

pytestmark = pytest.mark.timeout(180)

EXAMPLES = Path(__file__).resolve().parents[1] / "repositories" / "python_examples"
RNG = np.random.default_rng(7)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    repo = tmp_path_factory.mktemp("examples") / "models"
    shutil.copytree(EXAMPLES, repo)
    (repo / "pytorch" / "1").mkdir(parents=True)
    save(make_add_sub(), repo / "pytorch" / "1" / "model.onnx")
    (repo / "pytorch" / "config.pbtxt").write_text(
        'name: "pytorch"\nplatform: "onnxruntime_onnx"\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },'
        ' { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },'
        ' { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
    )
    d = start_daemon(tmp_path_factory.mktemp("examples-daemon"), "--model-repository", str(repo))
    try:
        yield d
    finally:
        stop_daemon(d)


def _add_sub_inputs(a: np.ndarray, b: np.ndarray) -> list[Any]:
    inputs = [
        httpclient.InferInput("INPUT0", a.shape, np_to_triton_dtype(a.dtype)),
        httpclient.InferInput("INPUT1", b.shape, np_to_triton_dtype(b.dtype)),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def _pair() -> tuple[np.ndarray, np.ndarray]:
    return RNG.random(4).astype(np.float32), RNG.random(4).astype(np.float32)


OUTPUTS = [httpclient.InferRequestedOutput("OUTPUT0"), httpclient.InferRequestedOutput("OUTPUT1")]


def test_add_sub(daemon: Daemon) -> None:
    a, b = _pair()
    with httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}") as client:
        response = client.infer("add_sub", _add_sub_inputs(a, b), request_id="1", outputs=OUTPUTS)
        assert response.get_response()["id"] == "1"
        assert np.allclose(a + b, response.as_numpy("OUTPUT0"))
        assert np.allclose(a - b, response.as_numpy("OUTPUT1"))


def test_auto_complete(daemon: Daemon) -> None:
    """Models without a config.pbtxt, completed by their auto_complete_config."""
    expected_ios = [
        {"name": f"{kind}{i}", "data_type": "TYPE_FP32", "dims": [4]}
        for kind in ("INPUT", "OUTPUT")
        for i in (0, 1)
    ]
    with httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}") as client:
        for name, max_batch_size in (("nobatch_auto_complete", 0), ("batch_auto_complete", 4)):
            config = client.get_model_config(name)
            assert config["max_batch_size"] == max_batch_size
            got = [
                {k: io[k] for k in ("name", "data_type", "dims")}
                for io in (*config["input"], *config["output"])
            ]
            assert sorted(got, key=lambda io: io["name"]) == expected_ios
        a, b = _pair()
        out = client.infer("batch_auto_complete", _add_sub_inputs(a[None], b[None]))
        assert np.allclose(a + b, out.as_numpy("OUTPUT0")[0])


def test_bls_sync(daemon: Daemon) -> None:
    a, b = _pair()
    with httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}") as client:
        inputs = [
            *_add_sub_inputs(a, b),
            httpclient.InferInput("MODEL_NAME", [1], np_to_triton_dtype(np.object_)),
        ]
        for target in ("add_sub", "pytorch"):  # a python model, then an ONNX one
            inputs[2].set_data_from_numpy(np.array([target], dtype=np.object_))
            response = client.infer("bls_sync", inputs, request_id="1", outputs=OUTPUTS)
            assert np.allclose(a + b, response.as_numpy("OUTPUT0"))
            assert np.allclose(a - b, response.as_numpy("OUTPUT1"))
        inputs[2].set_data_from_numpy(np.array(["undefined_model"], dtype=np.object_))
        with pytest.raises(InferenceServerException, match="undefined_model"):
            client.infer("bls_sync", inputs, request_id="1", outputs=OUTPUTS)


def test_bls_async(daemon: Daemon) -> None:
    a, b = _pair()
    with httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}") as client:
        response = client.infer("bls_async", _add_sub_inputs(a, b), request_id="1", outputs=OUTPUTS)
        assert np.allclose(a + b, response.as_numpy("OUTPUT0"))
        assert np.allclose(a - b, response.as_numpy("OUTPUT1"))


def _stream(daemon: Daemon) -> tuple[grpcclient.InferenceServerClient, queue.Queue[Any]]:
    """A gRPC client with a stream open, its callback putting results (or errors) in a queue."""
    results: queue.Queue[Any] = queue.Queue()

    def callback(q: queue.Queue[Any], result: Any, error: Any) -> None:
        q.put(error if error else result)

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}")
    client.start_stream(callback=partial(callback, results))
    return client, results


def _received(results: queue.Queue[Any], count: int) -> dict[str, list[Any]]:
    """``count`` results by request id, in the order received (an error raises)."""
    by_id: dict[str, list[Any]] = {}
    for _ in range(count):
        item = results.get(timeout=30)
        if isinstance(item, InferenceServerException):
            raise item
        by_id.setdefault(item.get_response().id, []).append(item)
    return by_id


def test_decoupled_square(daemon: Daemon) -> None:
    """IN = n: n responses, each n; for 0 none at all (the final flag alone is not sent)."""
    in_values = [4, 2, 0, 1]
    client, results = _stream(daemon)
    with client:
        tensor = grpcclient.InferInput("IN", [1], np_to_triton_dtype(np.int32))
        for i, value in enumerate(in_values):
            tensor.set_data_from_numpy(np.array([value], dtype=np.int32))
            client.async_stream_infer(
                model_name="square_int32",
                inputs=[tensor],
                request_id=str(i),
                outputs=[grpcclient.InferRequestedOutput("OUT")],
            )
        by_id = _received(results, sum(in_values))
        client.stop_stream()
    assert results.empty()  # nothing more came, for 0 either
    assert sorted(by_id) == ["0", "1", "3"]
    for i, value in enumerate(in_values):
        for result in by_id.get(str(i), []):
            assert result.as_numpy("OUT").tolist() == [value]
        assert len(by_id.get(str(i), [])) == value


def test_decoupled_repeat(daemon: Daemon) -> None:
    """Each element of IN in its own response, in order, with Triton's triton_final_response
    false on each (the final flag came alone, so it is not sent)."""
    in_value = [4, 2, 0, 1]
    client, results = _stream(daemon)
    with client:
        inputs = [
            grpcclient.InferInput("IN", [len(in_value)], "INT32"),
            grpcclient.InferInput("DELAY", [len(in_value)], "UINT32"),
            grpcclient.InferInput("WAIT", [1], "UINT32"),
        ]
        inputs[0].set_data_from_numpy(np.array(in_value, dtype=np.int32))
        inputs[1].set_data_from_numpy(np.array([1, 2, 3, 4], dtype=np.uint32))
        inputs[2].set_data_from_numpy(np.array([5], dtype=np.uint32))
        outputs = [grpcclient.InferRequestedOutput("OUT"), grpcclient.InferRequestedOutput("IDX")]
        client.async_stream_infer("repeat_int32", inputs, request_id="0", outputs=outputs)
        got = _received(results, len(in_value))["0"]
        client.stop_stream()
    assert [r.as_numpy("OUT").tolist() for r in got] == [[v] for v in in_value]
    assert [r.as_numpy("IDX").tolist() for r in got] == [[i] for i in range(len(in_value))]
    finals = [r.get_response().parameters["triton_final_response"].bool_param for r in got]
    assert finals == [False] * len(in_value)


def test_decoupled_empty_final_response_when_asked(daemon: Daemon) -> None:
    """With triton_enable_empty_final_response the final flag comes as an empty response
    (its id, triton_final_response true); a request answered with nothing but the flag gets
    just that one."""
    client, results = _stream(daemon)
    with client:
        tensor = grpcclient.InferInput("IN", [1], "INT32")
        for i, value in enumerate([2, 0]):
            tensor.set_data_from_numpy(np.array([value], dtype=np.int32))
            client.async_stream_infer(
                "square_int32", [tensor], request_id=str(i), enable_empty_final_response=True
            )
        by_id = _received(results, 3 + 1)
        client.stop_stream()
    finals = [r.get_response().parameters["triton_final_response"].bool_param for r in by_id["0"]]
    assert finals == [False, False, True]
    assert [len(r.get_response().outputs) for r in by_id["0"]] == [1, 1, 0]
    (only,) = by_id["1"]
    assert only.get_response().parameters["triton_final_response"].bool_param
    assert only.get_response().model_name == "square_int32" and not only.get_response().outputs


def test_bls_decoupled(daemon: Daemon) -> None:
    """bls_decoupled_sync sums square_int32's IN responses (IN * IN); the async one makes two
    such calls at once (2 * IN * IN)."""
    with httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}") as client:
        for model, times in (("bls_decoupled_sync", 1), ("bls_decoupled_async", 2)):
            for value in [4, 2, 0, 1]:
                data = np.array([value], dtype=np.int32)
                tensor = httpclient.InferInput("IN", data.shape, np_to_triton_dtype(data.dtype))
                tensor.set_data_from_numpy(data)
                outputs = [httpclient.InferRequestedOutput("SUM")]
                response = client.infer(model, [tensor], request_id="1", outputs=outputs)
                assert np.allclose(times * data * data, response.as_numpy("SUM")), model


def _metrics(daemon: Daemon) -> str:
    r = requests.get(daemon.url("/metrics"), timeout=10)
    r.raise_for_status()
    return r.text


def _restarts(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith("model_runtime_python_instance_restarts_total{"):
            labels, value = line.rsplit(" ", 1)
            out[labels.split('model="', 1)[1].split('"', 1)[0]] = float(value)
    return out


def test_custom_metrics(daemon: Daemon) -> None:
    a, b = _pair()
    with httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}") as client:
        response = client.infer(
            "custom_metrics", _add_sub_inputs(a, b), request_id="1", outputs=OUTPUTS
        )
        assert np.allclose(a + b, response.as_numpy("OUTPUT0"))
        assert np.allclose(a - b, response.as_numpy("OUTPUT1"))
    metrics = _metrics(daemon)
    for pattern in (
        "# HELP requests_process_latency_ns Cumulative time spent processing requests",
        "# TYPE requests_process_latency_ns counter",
        'requests_process_latency_ns{model="custom_metrics",version="1"}',
    ):
        assert pattern in metrics
    latency = next(
        line for line in metrics.splitlines() if line.startswith("requests_process_latency_ns{")
    )
    assert float(latency.rsplit(" ", 1)[1]) > 0


def test_instance_restarts_are_counted_in_metrics(daemon: Daemon) -> None:
    before = _restarts(_metrics(daemon))
    assert before and set(before.values()) == {0.0}
    victim = _instances(daemon)[0]
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: sum(_restarts(_metrics(daemon)).values()) == 1.0, 20, "a restart counted")

"""Python models (``backend: "python"``) in the daemon, as a Triton user's repository holds them
and their clients call them: ``add_sub`` over HTTP and gRPC, BLS from one model to another of
either kind (python, ONNX), a config completed by the model's own ``auto_complete_config``,
statistics, and an instance process killed under load costing no request."""

from __future__ import annotations

import os
import re
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.test_daemon_support import Daemon, start_daemon, stop_daemon, wait_for
from tests.models import make_add_sub, save

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]
REPOSITORY = ROOT / "tests" / "repositories" / "python"


def readme_model() -> tuple[str, str]:
    """The README's python model: its config.pbtxt and its model.py, as written there."""
    text = (ROOT / "README.md").read_text()
    config = next(b for b in re.findall(r"```text\n(.*?)```", text, re.S) if "python" in b)
    (model,) = re.findall(r"```py\n(.*?)```", text, re.S)
    return config, model


A = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
B = np.array([0.5, 1.0, 1.5, -2.0], np.float32)


#: sleeps SECONDS (after touching the file its parameter "started" names, if any), then
#: answers how many requests it has run
SLOW_MODEL = """
import json
import pathlib
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.runs = 0

    def execute(self, requests):
        out = []
        for request in requests:
            self.runs += 1
            seconds = pb_utils.get_input_tensor_by_name(request, "SECONDS").as_numpy()
            started = json.loads(request.parameters()).get("started")
            if started:
                pathlib.Path(started).touch()
            time.sleep(float(seconds[0]))
            runs = np.array([self.runs], np.int32)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("RUNS", runs)]))
        return out
"""
SLOW_CONFIG = (
    'backend: "python"\nmax_batch_size: 0\n'
    'input [ { name: "SECONDS" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    'output [ { name: "RUNS" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
    "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    repo = tmp_path_factory.mktemp("python") / "models"
    shutil.copytree(REPOSITORY, repo)
    # BLS across model kinds: an ONNX model with add_sub's inputs and outputs.
    (repo / "add_sub_onnx" / "1").mkdir(parents=True)
    save(make_add_sub(), repo / "add_sub_onnx" / "1" / "model.onnx")
    (repo / "add_sub_onnx" / "config.pbtxt").write_text(
        'platform: "onnxruntime_onnx"\nmax_batch_size: 0\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },'
        ' { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },'
        ' { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
    )
    (repo / "slow" / "1").mkdir(parents=True)
    (repo / "slow" / "config.pbtxt").write_text(SLOW_CONFIG)
    (repo / "slow" / "1" / "model.py").write_text(SLOW_MODEL)
    config, model = readme_model()  # the README's example, as written
    (repo / "double" / "1").mkdir(parents=True)
    (repo / "double" / "config.pbtxt").write_text(config)
    (repo / "double" / "1" / "model.py").write_text(model)
    d = start_daemon(tmp_path_factory.mktemp("python-daemon"), "--model-repository", str(repo))
    try:
        yield d
    finally:
        stop_daemon(d)


@pytest.fixture(scope="module")
def twice(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon whose one model is add_sub with two instances (instance_group count 2): every
    instance process it runs is that model's."""
    repo = tmp_path_factory.mktemp("python-twice") / "models"
    shutil.copytree(REPOSITORY / "add_sub", repo / "add_sub_twice")
    config = (repo / "add_sub_twice" / "config.pbtxt").read_text()
    config = config.replace('name: "add_sub"', 'name: "add_sub_twice"')
    config = config.replace("{ kind: KIND_CPU }", "{ count: 2 kind: KIND_CPU }")
    (repo / "add_sub_twice" / "config.pbtxt").write_text(config)
    d = start_daemon(tmp_path_factory.mktemp("twice-daemon"), "--model-repository", str(repo))
    try:
        yield d
    finally:
        stop_daemon(d)


def _inputs(module: object, a: np.ndarray, b: np.ndarray) -> list[object]:
    out = []
    for name, value in (("INPUT0", a), ("INPUT1", b)):
        tensor = module.InferInput(name, list(value.shape), "FP32")  # type: ignore[attr-defined]
        tensor.set_data_from_numpy(value)
        out.append(tensor)
    return out


def test_add_sub_answers_over_http_and_grpc(daemon: Daemon) -> None:
    with httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}") as client:
        assert client.is_model_ready("add_sub")
        result = client.infer("add_sub", _inputs(httpclient, A, B))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)
        config = client.get_model_config("add_sub")
        assert config["backend"] == "python" and config["max_batch_size"] == 0
    with grpcclient.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}") as client:
        result = client.infer("add_sub", _inputs(grpcclient, A, B))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)


@pytest.mark.parametrize("target", ["add_sub", "add_sub_onnx"])
def test_bls_calls_another_model_of_either_kind(daemon: Daemon, target: str) -> None:
    with httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}") as client:
        before = client.get_inference_statistics(target)["model_stats"][0]["inference_count"]
        name = httpclient.InferInput("MODEL_NAME", [1], "BYTES")
        name.set_data_from_numpy(np.array([target.encode()], dtype=object))
        result = client.infer("bls", [*_inputs(httpclient, A, B), name])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)
        # The BLS call went through the target's own runner: its statistics count it.
        after = client.get_inference_statistics(target)["model_stats"][0]["inference_count"]
        assert after == before + 1


def test_a_bls_call_to_an_unknown_model_fails_that_request_only(daemon: Daemon) -> None:
    with httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}") as client:
        name = httpclient.InferInput("MODEL_NAME", [1], "BYTES")
        name.set_data_from_numpy(np.array([b"no_such_model"], dtype=object))
        with pytest.raises(InferenceServerException, match="no_such_model"):
            client.infer("bls", [*_inputs(httpclient, A, B), name])
        result = client.infer("add_sub", _inputs(httpclient, A, B))  # serves on
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)


def test_a_config_is_completed_by_the_models_auto_complete_config(daemon: Daemon) -> None:
    with httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}") as client:
        config = client.get_model_config("auto_complete")
        assert config["max_batch_size"] == 8
        assert [i["name"] for i in config["input"]] == ["IN"]
        assert "dynamic_batching" in config
        rows = np.arange(6, dtype=np.int32).reshape(3, 2)
        tensor = httpclient.InferInput("IN", [3, 2], "INT32")
        tensor.set_data_from_numpy(rows)
        np.testing.assert_array_equal(
            client.infer("auto_complete", [tensor]).as_numpy("OUT"), rows * 2
        )


def test_the_readmes_python_model_serves_as_written(daemon: Daemon) -> None:
    with httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}") as client:
        rows = np.array([[1.0, 2.0], [3.0, -4.0]], np.float32)
        tensor = httpclient.InferInput("IN", [2, 2], "FP32")
        tensor.set_data_from_numpy(rows)
        np.testing.assert_array_equal(client.infer("double", [tensor]).as_numpy("OUT"), rows * 2)


def test_a_decoupled_model_over_plain_infer_is_refused_with_the_reason(daemon: Daemon) -> None:
    with httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}") as client:
        tensor = httpclient.InferInput("IN", [3], "INT32")
        tensor.set_data_from_numpy(np.array([1, 2, 3], np.int32))
        with pytest.raises(InferenceServerException, match="decoupled"):
            client.infer("repeat", [tensor])


def test_a_decoupled_model_streams_over_grpc_its_errors_in_place(daemon: Daemon) -> None:
    """Each response of a decoupled model reaches a ModelStreamInfer client as it comes; the
    model's error for one is that response's error and the stream goes on; a model that answers
    once gives one response, with triton_final_response true."""
    import queue
    from functools import partial

    results: queue.Queue[object] = queue.Queue()

    def callback(q: queue.Queue[object], result: object, error: object) -> None:
        q.put(error if error else result)

    with grpcclient.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}") as client:
        client.start_stream(callback=partial(callback, results))
        tensor = grpcclient.InferInput("IN", [3], "INT32")
        tensor.set_data_from_numpy(np.array([1, -2, 3], np.int32))
        client.async_stream_infer("repeat", [tensor], request_id="r")
        got = [results.get(timeout=30) for _ in range(3)]
        client.async_stream_infer("add_sub_onnx", _inputs(grpcclient, A, B), request_id="o")
        once = results.get(timeout=30)
        client.stop_stream()
    assert results.empty()
    first, error, third = got
    assert first.as_numpy("OUT").tolist() == [1]  # type: ignore[attr-defined]
    assert isinstance(error, InferenceServerException)
    assert "negative element -2" in error.message()
    assert third.as_numpy("OUT").tolist() == [3]  # type: ignore[attr-defined]
    for result in (first, third):
        params = result.get_response().parameters  # type: ignore[attr-defined]
        assert params["triton_final_response"].bool_param is False
    assert once.get_response().id == "o"  # type: ignore[attr-defined]
    assert once.get_response().parameters["triton_final_response"].bool_param  # type: ignore[attr-defined]
    np.testing.assert_array_equal(once.as_numpy("OUTPUT0"), A + B)  # type: ignore[attr-defined]


def _sleep(seconds: float) -> list[object]:
    tensor = grpcclient.InferInput("SECONDS", [1], "FP32")
    tensor.set_data_from_numpy(np.array([seconds], np.float32))
    return [tensor]


def test_a_grpc_deadline_on_a_slow_python_model_is_deadline_exceeded(
    daemon: Daemon, tmp_path: Path
) -> None:
    """A gRPC ModelInfer with a client deadline (grpc-timeout, tritonclient's client_timeout)
    to a python model busy with another request ends at its deadline with Triton's
    DEADLINE_EXCEEDED "Deadline Exceeded"; the model never runs it (as Triton drops a cancelled
    request before the model gets it) and serves the others: the busy one, then the next."""
    url = f"127.0.0.1:{daemon.grpc_port}"
    busy: list[object] = []
    started = tmp_path / "started"

    def hold() -> None:
        with grpcclient.InferenceServerClient(url) as other:
            result = other.infer("slow", _sleep(1.5), parameters={"started": str(started)})
            busy.append(result.as_numpy("RUNS")[0])

    with grpcclient.InferenceServerClient(url) as client:
        first = int(client.infer("slow", _sleep(0.0)).as_numpy("RUNS")[0])
        holder = threading.Thread(target=hold)
        holder.start()
        wait_for(started.exists, 10, "the slow request to start")
        t0 = time.monotonic()
        with pytest.raises(InferenceServerException) as caught:
            client.infer("slow", _sleep(0.0), client_timeout=0.3)
        waited = time.monotonic() - t0
        holder.join(30)
        assert caught.value.status() == "StatusCode.DEADLINE_EXCEEDED"
        assert caught.value.message() == "Deadline Exceeded"
        assert waited < 1.2  # at its deadline, not when the busy request ends
        assert busy == [first + 1]
        after = int(client.infer("slow", _sleep(0.0)).as_numpy("RUNS")[0])
        assert after == first + 2  # the request past its deadline never ran
        assert client.is_model_ready("slow")


def _instances(daemon: Daemon) -> list[int]:
    """The pids of the daemon's instance processes (its children running the stub)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == daemon.proc.pid and b"stub.py" in cmdline:
            pids.append(int(entry.name))
    return pids


def test_an_instance_killed_under_load_costs_no_request(twice: Daemon) -> None:
    """SIGKILL of one of add_sub_twice's two instance processes while 8 clients call it: no
    request fails, the model answers ready throughout, and a new instance serves within 5 s."""
    url = f"127.0.0.1:{twice.port}"
    before = set(_instances(twice))
    stop = threading.Event()
    failures: list[str] = []
    answered = [0] * 8
    not_ready: list[float] = []

    def client(k: int) -> None:
        with httpclient.InferenceServerClient(url) as c:
            a = np.full(4, k, np.float32)
            while not stop.is_set():
                try:
                    out = c.infer("add_sub_twice", _inputs(httpclient, a, B))
                    if not np.array_equal(out.as_numpy("OUTPUT0"), a + B):
                        failures.append("wrong answer")
                    answered[k] += 1
                except InferenceServerException as exc:
                    failures.append(str(exc))

    def readiness() -> None:
        with httpclient.InferenceServerClient(url) as c:
            while not stop.is_set():
                if not c.is_model_ready("add_sub_twice"):
                    not_ready.append(time.monotonic())
                time.sleep(0.01)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    threads.append(threading.Thread(target=readiness))
    for t in threads:
        t.start()
    try:
        wait_for(lambda: sum(answered) > 200, 30, "the clients to be served")
        pids = _instances(twice)
        assert len(pids) >= 2, pids
        victim = pids[0]
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        wait_for(
            lambda: len(set(_instances(twice)) - {victim}) >= 2,
            5,
            "a new instance process",
        )
        replaced = time.monotonic() - killed_at
        count = sum(answered)
        wait_for(lambda: sum(answered) > count + 200, 30, "the clients to go on being served")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert failures == []
    assert not_ready == []
    assert replaced < 5
    assert len(before) >= 2


def _batch_counts(stats: dict[str, Any]) -> dict[int, int]:
    return {b["batch_size"]: b["compute_infer"]["count"] for b in stats.get("batch_stats", [])}


def test_statistics_count_each_execute_of_a_python_model(daemon: Daemon) -> None:
    """Triton's execution_count is the model's execute calls, batch_stats their batch sizes:
    a request per execute without batching, its rows with batching (one request here)."""
    with httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}") as client:

        def stats(model: str) -> dict[str, Any]:
            return client.get_inference_statistics(model)["model_stats"][0]  # type: ignore[no-any-return]

        before = {m: stats(m) for m in ("add_sub", "auto_complete")}
        for _ in range(3):
            client.infer("add_sub", _inputs(httpclient, A, B))
        rows = httpclient.InferInput("IN", [3, 2], "INT32")
        rows.set_data_from_numpy(np.zeros((3, 2), dtype=np.int32))
        client.infer("auto_complete", [rows])
        after = {m: stats(m) for m in ("add_sub", "auto_complete")}
    assert after["add_sub"]["inference_count"] == before["add_sub"]["inference_count"] + 3
    assert after["add_sub"]["execution_count"] == before["add_sub"]["execution_count"] + 3
    ones = _batch_counts(after["add_sub"]).get(1, 0) - _batch_counts(before["add_sub"]).get(1, 0)
    assert ones == 3
    done = after["auto_complete"]
    assert done["execution_count"] == before["auto_complete"]["execution_count"] + 1
    threes = _batch_counts(done).get(3, 0) - _batch_counts(before["auto_complete"]).get(3, 0)
    assert threes == 1

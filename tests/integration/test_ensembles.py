"""Ensembles served as Triton serves them, against the daemon with Triton's clients: NVIDIA's
python backend ``preprocessing`` example in small (python pre-processing -> an ONNX classifier
named ``resnet50_trt`` -> python post-processing) over HTTP and gRPC; the calls of Triton's
``L0_simple_ensemble`` (``ensemble_add_sub`` over two versions of ``simple``, all outputs or
one, with the statistics that show which version ran); the ensemble cases of
``L0_optional_input`` (inputs left out, steps mapping a subset of their model's inputs) and
``L0_infer_reshape`` (an ensemble tensor reshaped between client and steps); a failing step
answered with Triton's text naming step and model; an ensemble whose composing model is missing
refused at load with the reason; statistics as Triton counts them; an ensemble with a decoupled
step streams over gRPC ``ModelStreamInfer`` and ``generate_stream``, what follows that step run
once per response.

The daemon runs under the fault plan: every ONNX model's device fails recoverably every 20th
run (``--fault-plan recoverable:every=20``, with the daemon's default self-healing), and every
request of 8 concurrent ensemble clients is still answered right: a step's replica fault is
that model's to heal (reset, retry), not the ensemble request's (2,000 requests with
``--long``).
"""

from __future__ import annotations

import json
import queue
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.ensemble_models import (
    PIPELINE,
    expected_pipeline,
    write_add_sub_ensemble,
    write_decoupled,
    write_optional_and_reshape,
    write_pipeline,
)
from tests.integration.test_daemon_support import (
    Daemon,
    metric,
    start_daemon,
    stop_daemon,
    wait_for,
)

pytestmark = pytest.mark.timeout(300)
CLIENTS = 8

#: An ensemble whose step names a model the repository does not have.
MISSING = """platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [ {
  model_name: "no_such_model" model_version: -1
  input_map { key: "x" value: "IN" } output_map { key: "y" value: "OUT" } } ] }
"""
GOOD = {PIPELINE, "preprocess", "resnet50_trt", "postprocess", "simple", "ensemble_add_sub"}
GOOD |= {"identity_2_float32", "optional_identity", "ensemble_identity_2_float32"}
GOOD |= {"pipeline_identity_2_float32", "optional_connecting_tensor", "ensemble_reshape"}
GOOD |= {"repeat", "identity_int32", "ensemble_repeat"}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("ensembles")
    repo = tmp / "models"
    write_pipeline(repo)
    write_add_sub_ensemble(repo)
    write_optional_and_reshape(repo)
    write_decoupled(repo)
    (repo / "missing_step" / "1").mkdir(parents=True)
    (repo / "missing_step" / "config.pbtxt").write_text(MISSING)
    faults = ("--fault-plan", "recoverable:every=20")
    # missing_step fails to load on purpose: the others serve on, as Triton with this flag.
    d = start_daemon(
        tmp, "--model-repository", str(repo), *faults, "--exit-on-error=false", wait_ready=False
    )

    def loaded() -> bool:
        index = d.post("/v2/repository/index")[1]
        states = {m["name"]: m["state"] for m in index}
        return all(states.get(n) == "READY" for n in GOOD) and (
            states.get("missing_step") == "UNAVAILABLE"
        )

    try:
        wait_for(loaded, 120, "the models to load")
    except BaseException:
        stop_daemon(d)
        raise
    yield d
    stop_daemon(d)


def raw_images(batch: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (batch, 48)).astype(np.uint8)


def _pipeline(
    client: Any, url: str, raw: np.ndarray, outputs: list[str] | None
) -> Any:  # (tritonclient's http and grpc modules have the same calls)
    inp = client.InferInput("INPUT", list(raw.shape), "UINT8")
    inp.set_data_from_numpy(raw)
    wanted = None if outputs is None else [client.InferRequestedOutput(n) for n in outputs]
    return client.InferenceServerClient(url).infer(PIPELINE, [inp], outputs=wanted)


def http_pipeline(d: Daemon, raw: np.ndarray, outputs: list[str] | None = None) -> Any:
    return _pipeline(httpclient, f"127.0.0.1:{d.port}", raw, outputs)


def grpc_pipeline(d: Daemon, raw: np.ndarray, outputs: list[str] | None = None) -> Any:
    return _pipeline(grpcclient, f"127.0.0.1:{d.grpc_port}", raw, outputs)


#: the pipeline called by each front end
PIPELINES = pytest.mark.parametrize(
    "pipeline", [http_pipeline, grpc_pipeline], ids=["http", "grpc"]
)


def check_pipeline(result: Any, raw: np.ndarray) -> None:
    scores, top, labels = expected_pipeline(raw)
    np.testing.assert_allclose(result.as_numpy("SCORES"), scores, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(result.as_numpy("CLASS")[:, 0], top)
    assert list(result.as_numpy("LABEL")[:, 0]) == labels


def test_the_preprocessing_pipeline_answers_over_http(daemon: Daemon) -> None:
    for batch in (1, 4):
        raw = raw_images(batch, seed=batch)
        check_pipeline(http_pipeline(daemon, raw), raw)


def test_the_preprocessing_pipeline_answers_over_grpc(daemon: Daemon) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}")
    raw = raw_images(3, seed=7)
    inp = grpcclient.InferInput("INPUT", list(raw.shape), "UINT8")
    inp.set_data_from_numpy(raw)
    check_pipeline(client.infer(PIPELINE, [inp]), raw)
    metadata = client.get_model_metadata(PIPELINE, as_json=True)
    assert metadata["platform"] == "ensemble"
    config = client.get_model_config(PIPELINE, as_json=True)["config"]
    steps = config["ensemble_scheduling"]["step"]
    assert [s["model_name"] for s in steps] == ["preprocess", "resnet50_trt", "postprocess"]


def stats(d: Daemon, model: str, version: str = "") -> dict[str, Any]:
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/stats"
    status, doc = d.get(path)
    assert status == 200, doc
    found: dict[str, Any] = doc["model_stats"][0]
    return found


def infer_add_sub(d: Daemon, batch: int, outputs: list[str] | None = None) -> dict[str, Any]:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{d.port}")
    a = np.arange(16 * batch, dtype=np.int32).reshape(batch, 16)
    b = np.ones((batch, 16), np.int32)
    inputs = []
    for name, x in (("INPUT0", a), ("INPUT1", b)):
        inputs.append(httpclient.InferInput(name, [batch, 16], "INT32"))
        inputs[-1].set_data_from_numpy(x)
    wanted = None if outputs is None else [httpclient.InferRequestedOutput(n) for n in outputs]
    result = client.infer("ensemble_add_sub", inputs, outputs=wanted)
    got = {n["name"]: result.as_numpy(n["name"]) for n in result.get_response()["outputs"]}
    if "OUTPUT0" in got:
        np.testing.assert_array_equal(got["OUTPUT0"], a + b)
    if "OUTPUT1" in got:
        np.testing.assert_array_equal(got["OUTPUT1"], a - b)
    return got


def test_ensemble_add_sub_runs_both_versions_of_simple(daemon: Daemon) -> None:
    before = [stats(daemon, "simple", v)["inference_count"] for v in ("1", "2")]
    for batch in (1, 8):
        assert set(infer_add_sub(daemon, batch)) == {"OUTPUT0", "OUTPUT1"}
    after = [stats(daemon, "simple", v)["inference_count"] for v in ("1", "2")]
    # each version of 'simple' ran each request once: the same count, 1 + 8 inferences
    assert [x - y for x, y in zip(after, before, strict=True)] == [9, 9]


def test_ensemble_add_sub_one_output_runs_only_the_step_that_writes_it(daemon: Daemon) -> None:
    before = [stats(daemon, "simple", v)["inference_count"] for v in ("1", "2")]
    for batch in (1, 8):
        assert set(infer_add_sub(daemon, batch, ["OUTPUT0"])) == {"OUTPUT0"}
    after = [stats(daemon, "simple", v)["inference_count"] for v in ("1", "2")]
    # only version 2 writes OUTPUT0: version 1's step is pruned
    assert [x - y for x, y in zip(after, before, strict=True)] == [0, 9]


@PIPELINES
def test_the_ensemble_counts_requests_and_its_models_count_executions(
    daemon: Daemon, pipeline: Callable[[Daemon, np.ndarray], Any]
) -> None:
    before = {m: stats(daemon, m) for m in (PIPELINE, "preprocess", "resnet50_trt")}
    raw = raw_images(2, seed=3)
    for _ in range(3):
        check_pipeline(pipeline(daemon, raw), raw)
    after = {m: stats(daemon, m) for m in (PIPELINE, "preprocess", "resnet50_trt")}

    def delta(model: str, *path: str) -> int:
        a: Any = after[model]
        b: Any = before[model]
        for key in path:
            a, b = a[key], b[key]
        return int(a) - int(b)

    assert delta(PIPELINE, "inference_stats", "success", "count") == 3
    assert delta(PIPELINE, "inference_count") == 6
    assert delta(PIPELINE, "execution_count") == 0  # an ensemble executes nothing itself
    # each request once in every phase: perf_analyzer finds the version it measures by it
    for phase in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert delta(PIPELINE, "inference_stats", phase, "count") == 3
    for model in ("preprocess", "resnet50_trt"):
        assert delta(model, "inference_stats", "success", "count") == 3
        assert delta(model, "inference_count") == 6
    assert delta("resnet50_trt", "execution_count") >= 1


@PIPELINES
def test_pruned_steps_leave_what_nobody_asked_for(
    daemon: Daemon, pipeline: Callable[..., Any]
) -> None:
    before = stats(daemon, "postprocess")["inference_stats"]["success"]["count"]
    raw = raw_images(2, seed=5)
    result = pipeline(daemon, raw, ["SCORES"])
    np.testing.assert_allclose(result.as_numpy("SCORES"), expected_pipeline(raw)[0], atol=1e-4)
    assert result.as_numpy("LABEL") is None
    assert stats(daemon, "postprocess")["inference_stats"]["success"]["count"] == before


@PIPELINES
def test_a_failing_step_fails_that_request_naming_step_and_model(
    daemon: Daemon, pipeline: Callable[[Daemon, np.ndarray], Any]
) -> None:
    bad = np.zeros((1, 47), np.uint8)  # not 4x4 RGB: the pre-processing step raises
    with pytest.raises(InferenceServerException) as info:
        pipeline(daemon, bad)
    text = info.value.message()
    assert text.startswith(f"in ensemble '{PIPELINE}', step 0 (model 'preprocess'): "), text
    raw = raw_images(1)
    check_pipeline(pipeline(daemon, raw), raw)  # the next request is answered


def test_an_ensemble_of_a_model_not_served_is_refused_with_the_reason(daemon: Daemon) -> None:
    index = {m["name"]: m for m in daemon.post("/v2/repository/index")[1]}
    reason = index["missing_step"]["reason"]
    assert "in ensemble missing_step, composing model 'no_such_model' failed to load" in reason
    assert daemon.get("/v2/models/missing_step/ready")[0] != 200


@pytest.mark.parametrize("requests", [160, pytest.param(2000, marks=pytest.mark.long)])
def test_every_ensemble_request_is_answered_right_under_faults(
    daemon: Daemon, requests: int
) -> None:
    def client(c: int) -> int:
        right = 0
        for i in range(requests // CLIENTS):
            raw = raw_images(1 + i % 2, seed=c * 10_000 + i)
            check_pipeline(http_pipeline(daemon, raw), raw)
            right += 1
        return right

    with ThreadPoolExecutor(CLIENTS) as pool:
        assert sum(pool.map(client, range(CLIENTS))) == requests
    text = daemon.get("/metrics")[1]
    resets = metric(text, 'model_runtime_replica_resets{model="resnet50_trt",replica="0"}')
    assert (resets or 0) >= 1  # the faults happened, and were healed


def grpc_identity(
    d: Daemon, model: str, given: tuple[str, ...], wanted: tuple[str, ...]
) -> dict[str, np.ndarray]:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{d.grpc_port}")
    data = {"INPUT0": np.ones((1, 1), np.float32), "INPUT1": np.zeros((1, 1), np.float32)}
    inputs = []
    for name in given:
        inputs.append(grpcclient.InferInput(name, [1, 1], "FP32"))
        inputs[-1].set_data_from_numpy(data[name])
    outputs = [grpcclient.InferRequestedOutput(n) for n in wanted]
    result = client.infer(model, inputs, outputs=outputs or None)
    return {n: result.as_numpy(n) for n in ("OUTPUT0", "OUTPUT1") if result.as_numpy(n) is not None}


def test_ensemble_all_inputs(daemon: Daemon) -> None:
    before = stats(daemon, "ensemble_identity_2_float32")["inference_stats"]["success"]["count"]
    out = grpc_identity(daemon, "ensemble_identity_2_float32", ("INPUT0", "INPUT1"), ())
    assert out["OUTPUT0"].tolist() == [[1.0]] and out["OUTPUT1"].tolist() == [[0.0]]
    after = stats(daemon, "ensemble_identity_2_float32")["inference_stats"]["success"]["count"]
    assert after - before == 1


def test_ensemble_optional_same_input(daemon: Daemon) -> None:
    out = grpc_identity(daemon, "ensemble_identity_2_float32", ("INPUT1",), ("OUTPUT1",))
    assert list(out) == ["OUTPUT1"] and out["OUTPUT1"].tolist() == [[0.0]]


def test_ensemble_optional_pipeline(daemon: Daemon) -> None:
    # the second step gets only INPUT1 (the first step's OUTPUT0): its OUTPUT0 is zeros
    out = grpc_identity(daemon, "pipeline_identity_2_float32", ("INPUT0", "INPUT1"), ())
    assert out["OUTPUT0"].tolist() == [[0.0]] and out["OUTPUT1"].tolist() == [[1.0]]


def test_ensemble_optional_connecting_tensor(daemon: Daemon) -> None:
    # INPUT1 left out: the first step writes no internal_output1, the second runs without it
    out = grpc_identity(daemon, "optional_connecting_tensor", ("INPUT0",), ("OUTPUT0",))
    assert out["OUTPUT0"].tolist() == [[1.0]]


def test_an_ensemble_reshapes_its_tensors_for_its_steps(daemon: Daemon) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}")
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    inp = httpclient.InferInput("IN", [3, 4], "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer("ensemble_reshape", [inp])
    np.testing.assert_array_equal(result.as_numpy("OUT"), x)  # [3, 4] back, through [3, 2, 2]
    config = client.get_model_config("ensemble_reshape")
    assert config["input"][0]["reshape"]["shape"] == [2, 2]


def test_a_request_with_a_correlation_id_runs_through_stateless_steps(daemon: Daemon) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}")
    raw = raw_images(1, seed=13)
    inp = httpclient.InferInput("INPUT", [1, 48], "UINT8")
    inp.set_data_from_numpy(raw)
    result = client.infer(PIPELINE, [inp], sequence_id=5, sequence_start=True, sequence_end=True)
    check_pipeline(result, raw)


def test_request_parameters_reach_the_steps(daemon: Daemon) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}")
    raw = raw_images(2, seed=11)
    inp = grpcclient.InferInput("INPUT", list(raw.shape), "UINT8")
    inp.set_data_from_numpy(raw)
    result = client.infer(PIPELINE, [inp], parameters={"label_prefix": "c"}, priority=0)
    top = expected_pipeline(raw)[1]
    assert list(result.as_numpy("LABEL")[:, 0]) == [f"c{k}".encode() for k in top]


def test_a_decoupled_ensemble_streams_over_grpc(daemon: Daemon) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}")
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(lambda result, error: answers.put((result, error)))
    try:
        inp = grpcclient.InferInput("IN", [3], "INT32")
        inp.set_data_from_numpy(np.array([4, 5, 6], np.int32))
        client.async_stream_infer("ensemble_repeat", [inp], request_id="r")
        got = []
        for _ in range(3):
            result, error = answers.get(timeout=30)
            assert error is None, error
            got.append(int(result.as_numpy("OUT")[0]))
    finally:
        client.stop_stream()
    assert got == [4, 5, 6]  # each of repeat's responses through the ONNX step, in order


def test_a_decoupled_ensemble_streams_over_generate_stream(daemon: Daemon) -> None:
    status, body = _raw_post(daemon, "/v2/models/ensemble_repeat/generate_stream", {"IN": [7, 8]})
    assert status == 200, body
    events = [json.loads(c.removeprefix("data: ")) for c in body.split("\n\n") if c]
    assert [e["OUT"] for e in events] == [7, 8]  # one event per response of repeat


def test_a_plain_infer_of_a_decoupled_ensemble_says_where_its_responses_come(
    daemon: Daemon,
) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}")
    inp = httpclient.InferInput("IN", [1], "INT32")
    inp.set_data_from_numpy(np.array([1], np.int32))
    with pytest.raises(InferenceServerException) as info:
        client.infer("ensemble_repeat", [inp])
    assert "is decoupled" in info.value.message() and "ModelStreamInfer" in info.value.message()


def _raw_post(d: Daemon, path: str, doc: Any) -> tuple[int, str]:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=30)
    try:
        conn.request("POST", path, json.dumps(doc), {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()

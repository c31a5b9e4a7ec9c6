"""Ensembles under model control (``--model-control-mode explicit``): loading an ensemble loads
its composing models; a composing model unloaded makes the ensemble not ready, with the reason,
and loaded again makes it ready; a reload of a composing model under load drops no ensemble
request; ``unload_dependents`` unloads the composing models with the ensemble (HTTP and gRPC);
a circle of ensembles is refused at load (not a deadlock)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.ensemble_models import PIPELINE, expected_pipeline, write_pipeline
from tests.integration.test_daemon_support import Daemon, start_daemon, stop_daemon

pytestmark = pytest.mark.timeout(180)
COMPOSING = ("preprocess", "resnet50_trt", "postprocess")


def circle(name: str, other: str) -> str:
    """An ensemble whose one step runs ``other``."""
    return f"""platform: "ensemble"
max_batch_size: 8
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }} ]
ensemble_scheduling {{ step [ {{ model_name: "{other}" model_version: -1
  input_map {{ key: "IN" value: "IN" }} output_map {{ key: "OUT" value: "OUT" }} }} ] }}
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("ensemble_control")
    write_pipeline(tmp / "models")
    for name, other in (("circle_a", "circle_b"), ("circle_b", "circle_a")):
        (tmp / "models" / name / "1").mkdir(parents=True)
        (tmp / "models" / name / "config.pbtxt").write_text(circle(name, other))
    d = start_daemon(
        tmp, "--model-repository", str(tmp / "models"), "--model-control-mode", "explicit"
    )
    yield d
    stop_daemon(d)


def states(d: Daemon) -> dict[str, tuple[str, str]]:
    return {m["name"]: (m["state"], m["reason"]) for m in d.post("/v2/repository/index")[1]}


def infer(d: Daemon, seed: int = 0) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{d.port}")
    raw = np.random.default_rng(seed).integers(0, 256, (2, 48)).astype(np.uint8)
    inp = httpclient.InferInput("INPUT", [2, 48], "UINT8")
    inp.set_data_from_numpy(raw)
    result = client.infer(PIPELINE, [inp])
    np.testing.assert_array_equal(result.as_numpy("CLASS")[:, 0], expected_pipeline(raw)[1])


def test_model_control_of_an_ensemble(daemon: Daemon) -> None:
    http = httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}")
    assert all(states(daemon)[m][0] != "READY" for m in (PIPELINE, *COMPOSING))
    http.load_model(PIPELINE)  # its composing models load with it
    assert all(states(daemon)[m][0] == "READY" for m in (PIPELINE, *COMPOSING))
    assert http.is_model_ready(PIPELINE)
    infer(daemon)

    http.unload_model("resnet50_trt")
    assert not http.is_model_ready(PIPELINE)
    state, reason = states(daemon)[PIPELINE]
    assert state == "READY"  # loaded, but it cannot serve: the index says why
    assert f"composing model 'resnet50_trt' of ensemble '{PIPELINE}'" in reason
    assert "UNAVAILABLE" in reason
    with pytest.raises(InferenceServerException) as info:
        infer(daemon)
    assert "model 'resnet50_trt'" in info.value.message()
    http.load_model("resnet50_trt")
    assert http.is_model_ready(PIPELINE)
    infer(daemon)


def test_a_reload_of_a_composing_model_drops_no_ensemble_request(daemon: Daemon) -> None:
    http = httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}")
    http.load_model(PIPELINE)

    def client(seed: int) -> int:
        for i in range(8):
            infer(daemon, seed * 100 + i)
        return 8

    with ThreadPoolExecutor(4) as pool:
        done = pool.map(client, range(4))
        http.load_model("resnet50_trt")  # loaded beside the serving version, then swapped
        assert sum(done) == 32
    assert states(daemon)["resnet50_trt"][0] == "READY"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_unload_dependents_unloads_the_composing_models(daemon: Daemon, protocol: str) -> None:
    client: httpclient.InferenceServerClient | grpcclient.InferenceServerClient
    if protocol == "http":
        client = httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}")
    else:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}")
    client.load_model(PIPELINE)
    client.unload_model(PIPELINE)  # the ensemble alone
    assert states(daemon)[PIPELINE][0] == "UNAVAILABLE"
    assert all(states(daemon)[m][0] == "READY" for m in COMPOSING)
    client.load_model(PIPELINE)
    client.unload_model(PIPELINE, unload_dependents=True)
    assert all(states(daemon)[m][0] == "UNAVAILABLE" for m in (PIPELINE, *COMPOSING))


def test_a_circle_of_ensembles_is_refused(daemon: Daemon) -> None:
    http = httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}")
    with pytest.raises(InferenceServerException) as info:
        http.load_model("circle_a")
    assert "circular dependency between ensembles: circle_a -> circle_b -> circle_a" in str(
        info.value.message()
    )
    assert states(daemon)["circle_a"][0] == "UNAVAILABLE"

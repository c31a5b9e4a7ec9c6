"""A load with a configuration override (Triton's ``load_model(name, config=...)``), over
HTTP and gRPC with Triton's own clients, against the real daemon in explicit mode: a valid
override takes effect (the served config and the replicas change), an invalid one is a 400 /
INVALID_ARGUMENT that names the field, and the version that served before serves on."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.test_daemon_support import Daemon, start_daemon, stop_daemon
from tests.models import make_simple, save

pytestmark = pytest.mark.timeout(120)

SIMPLE_CONFIG = """
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
         { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
dynamic_batching { max_queue_delay_microseconds: 1000 }
"""

#: Overrides we cannot serve, each with a word its refusal must name.
INVALID = {
    "not JSON": ("{max_batch_size: 4", "not a ModelConfig in JSON"),
    "unknown field": ('{"max_batch": 4}', "max_batch"),
    "GPU instances": ('{"instance_group": [{"kind": "KIND_GPU"}]}', "instance_group[0].kind"),
    "a tensor of another type": (
        json.dumps({"max_batch_size": 8, "input": [{"name": "INPUT0", "data_type": "TYPE_FP32"}]}),
        "input[0].data_type",
    ),
    "a tensor the model lacks": (
        json.dumps({"output": [{"name": "NOPE", "data_type": "TYPE_INT32", "dims": [16]}]}),
        "the model has no output 'NOPE'",
    ),
    "another model's name": ('{"name": "other"}', "'other' is not the model's name"),
}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("override")
    repo = tmp / "models"
    (repo / "simple" / "1").mkdir(parents=True)
    (repo / "simple" / "config.pbtxt").write_text(SIMPLE_CONFIG)
    save(make_simple(), repo / "simple" / "1" / "model.onnx")
    d = start_daemon(
        tmp, "--model-repository", str(repo), "--model-control-mode", "explicit",
        "--load-model", "simple",
    )  # fmt: skip
    yield d
    stop_daemon(d)
    assert d.proc.returncode == 0


def _ready_replicas(daemon: Daemon) -> int:
    _, text = daemon.get("/metrics")
    return sum(
        1
        for line in text.splitlines()
        if line.startswith("model_runtime_replica_state{")
        and 'model="simple"' in line
        and 'state="ready"' in line
        and line.endswith(" 1.0")
    )


def _infer_http(client: httpclient.InferenceServerClient, rows: int = 2) -> None:
    a = np.arange(16 * rows, dtype=np.int32).reshape(rows, 16)
    b = np.ones((rows, 16), np.int32)
    inputs = [httpclient.InferInput(n, [rows, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("simple", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def _refusal(call: Callable[[], Any]) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value


def test_an_invalid_override_is_refused_and_the_old_model_serves_on(daemon: Daemon) -> None:
    url = f"127.0.0.1:{daemon.port}"
    with (
        httpclient.InferenceServerClient(url) as http,
        grpcclient.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}") as grpc_client,
    ):
        before = http.get_model_config("simple")
        for what, (config, word) in INVALID.items():
            err = _refusal(lambda c=config: http.load_model("simple", config=c))
            assert err.status() == "400", what
            assert "failed to load 'simple'" in err.message(), (what, err.message())
            assert word in err.message(), (what, err.message())
            bad = _refusal(lambda c=config: grpc_client.load_model("simple", config=c))
            assert bad.status() == "StatusCode.INVALID_ARGUMENT", what
            assert word in bad.message(), (what, bad.message())
            assert http.is_model_ready("simple"), what
            _infer_http(http)
        assert http.get_model_config("simple") == before
        (entry,) = http.get_model_repository_index()
        assert entry["state"] == "READY"
        assert "previous version is still serving" in entry["reason"]
        assert _ready_replicas(daemon) == 1


def test_a_valid_override_takes_effect_and_a_plain_load_reads_the_files_again(
    daemon: Daemon,
) -> None:
    override = {
        "max_batch_size": 4,
        "instance_group": [{"count": 2, "kind": "KIND_CPU"}],
        "dynamic_batching": {"max_queue_delay_microseconds": 500},
    }
    with httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}") as http:
        http.load_model("simple", config=json.dumps(override))
        config = http.get_model_config("simple")
        assert config["max_batch_size"] == 4
        assert [g["count"] for g in config["instance_group"]] == [2]
        assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 500
        assert _ready_replicas(daemon) == 2  # the instance count is the replica count
        _infer_http(http, rows=3)

        # A served config sent back as the override (a client's get-modify-load) is valid.
        with grpcclient.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}") as grpc_client:
            served = grpc_client.get_model_config("simple", as_json=True)["config"]
            served["instance_group"][0]["count"] = 3
            grpc_client.load_model("simple", config=json.dumps(served))
            after = grpc_client.get_model_config("simple", as_json=True)["config"]
            assert int(after["max_batch_size"]) == 4
            assert [int(g["count"]) for g in after["instance_group"]] == [3]
        assert _ready_replicas(daemon) == 3
        _infer_http(http)

        http.load_model("simple")  # no override: config.pbtxt again
        config = http.get_model_config("simple")
        assert config["max_batch_size"] == 8
        assert [g["count"] for g in config["instance_group"]] == [1]
        assert _ready_replicas(daemon) == 1
        _infer_http(http)


def test_an_override_is_refused_outside_explicit_mode(tmp_path: Path) -> None:
    save(make_simple(), tmp_path / "simple.onnx")
    d = start_daemon(tmp_path, "simple=" + str(tmp_path / "simple.onnx"))
    try:
        with httpclient.InferenceServerClient(f"127.0.0.1:{d.port}") as http:
            err = _refusal(lambda: http.load_model("simple", config='{"max_batch_size": 4}'))
            assert err.status() == "503"
            assert (
                err.message() == "explicit model load / unload is not allowed if polling is enabled"
            )
            _infer_http(http)
    finally:
        stop_daemon(d)

"""A Triton-layout model repository served by the real daemon (a subprocess on loopback), read
with Triton's own client: per-model batch sizes, dynamic batching, instance counts and version
policies, each visible in the config endpoint and the metadata; both versions of a model infer;
a bad config fails that model only; the flat layout takes its settings from ``NAME.toml``; a
model whose batch is fixed at 2 serves under the default ``--batch-size 8``.

Models add a constant (``y = x + c``), so an answer names the version that computed it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.integration.test_daemon_repository import add_const
from tests.integration.test_daemon_support import Daemon, start_daemon, stop_daemon

httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = [pytest.mark.timeout(120)]

A_CONFIG = """
name: "a"
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching { max_queue_delay_microseconds: 500 }
instance_group [ { count: 1 kind: KIND_CPU } ]
version_policy: { all { } }
"""
B_CONFIG = """
max_batch_size: 2
dynamic_batching {
  max_queue_delay_microseconds: 3000
  priority_levels: 2
  default_priority_level: 2
  default_queue_policy { max_queue_size: 8 default_timeout_microseconds: 5000000 }
}
instance_group [ { count: 2 kind: KIND_CPU } ]
version_policy: { latest { num_versions: 1 } }
"""


def version(model_dir: Path, v: int, c: float) -> None:
    (model_dir / str(v)).mkdir(parents=True)
    onnx.save_model(add_const(c), str(model_dir / str(v) / "model.onnx"))


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("triton")
    repo = tmp / "models"
    repo.mkdir()
    (repo / "a").mkdir()
    (repo / "a" / "config.pbtxt").write_text(A_CONFIG)
    version(repo / "a", 1, 1.0)
    version(repo / "a", 2, 2.0)
    (repo / "b").mkdir()
    (repo / "b" / "config.pbtxt").write_text(B_CONFIG)
    version(repo / "b", 1, 10.0)
    version(repo / "b", 3, 30.0)
    (repo / "unknown_field").mkdir()
    unknown = "max_batch_size: 2\nensemble_scheduling {}"  # an ensemble's field, no ensemble
    (repo / "unknown_field" / "config.pbtxt").write_text(unknown)
    version(repo / "unknown_field", 1, 0.0)
    (repo / "gpu").mkdir()
    (repo / "gpu" / "config.pbtxt").write_text(
        "max_batch_size: 2 instance_group [{kind: KIND_GPU}]"
    )
    version(repo / "gpu", 1, 0.0)
    onnx.save_model(add_const(100.0), str(repo / "flat.onnx"))
    (repo / "flat.toml").write_text(
        "max_batch_size = 2\n[dynamic_batching]\nmax_queue_delay_microseconds = 7000\n"
    )
    onnx.save_model(add_const(5.0, batch=2), str(repo / "fixed2.onnx"))
    mp = pytest.MonkeyPatch()
    mp.setenv("MODEL_RUNTIME_DEVICES", "cpu:6x1")
    try:
        d = start_daemon(
            tmp,
            "--model-repository",
            str(repo),
            "--no-strict-readiness",
            "--no-access-log",
            "--exit-on-error=false",  # its refused configs fail on purpose; the others serve
        )
    finally:
        mp.undo()
    try:
        yield d
    finally:
        stop_daemon(d)


@pytest.fixture
def client(daemon: Daemon) -> Iterator[object]:
    c = httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}")
    try:
        yield c
    finally:
        c.close()


def infer(client: object, model: str, version: str = "", rows: int = 1) -> np.ndarray:
    x = httpclient.InferInput("x", [rows, 4], "FP32")
    x.set_data_from_numpy(np.zeros((rows, 4), np.float32))
    result = client.infer(model, [x], model_version=version)  # type: ignore[attr-defined]
    return result.as_numpy("y")  # type: ignore[no-any-return]


def test_each_model_serves_with_its_own_config(client: object) -> None:
    a = client.get_model_config("a")  # type: ignore[attr-defined]
    assert a["name"] == "a"
    assert (a["platform"], a["backend"]) == ("onnxruntime_onnx", "onnxruntime")
    assert a["max_batch_size"] == 4
    assert a["input"][0]["name"] == "x"
    assert a["input"][0]["data_type"] == "TYPE_FP32"
    assert a["input"][0]["dims"] == [4]
    assert a["output"][0]["dims"] == [4]
    assert a["dynamic_batching"]["max_queue_delay_microseconds"] == 500
    assert a["instance_group"][0]["count"] == 1
    assert a["instance_group"][0]["kind"] == "KIND_CPU"
    assert a["version_policy"] == {"all": {}}
    b = client.get_model_config("b")  # type: ignore[attr-defined]
    assert b["max_batch_size"] == 2
    db = b["dynamic_batching"]
    assert db["max_queue_delay_microseconds"] == 3000
    assert (db["priority_levels"], db["default_priority_level"]) == (2, 2)
    assert db["default_queue_policy"]["max_queue_size"] == 8
    assert db["default_queue_policy"]["default_timeout_microseconds"] == 5_000_000
    assert b["instance_group"][0]["count"] == 2


def test_version_policies_pick_the_versions_served(client: object) -> None:
    assert client.get_model_metadata("a")["versions"] == ["1", "2"]  # type: ignore[attr-defined]
    assert client.get_model_metadata("b")["versions"] == ["3"]  # type: ignore[attr-defined]
    # a: version policy all: each version is its own runner; no version: the latest.
    assert infer(client, "a", "1")[0, 0] == 1.0
    assert infer(client, "a", "2", rows=3)[0, 0] == 2.0
    assert infer(client, "a")[0, 0] == 2.0
    assert infer(client, "b", rows=2)[1, 0] == 30.0
    # b: latest 1: version 1 is on disk but not served.
    with pytest.raises(InferenceServerException, match="version 1"):
        infer(client, "b", "1")
    with pytest.raises(InferenceServerException, match="version 1"):
        client.get_model_config("b", "1")  # type: ignore[attr-defined]
    assert client.get_model_config("a", "1")["name"] == "a"  # type: ignore[attr-defined]


def test_a_bad_config_fails_that_model_only(daemon: Daemon) -> None:
    status, index = daemon.post("/v2/repository/index")
    assert status == 200
    rows = {(r["name"], r["version"]): r for r in index}
    assert rows[("unknown_field", "1")]["state"] == "UNAVAILABLE"
    reason = rows[("unknown_field", "1")]["reason"]
    assert "config.pbtxt" in reason and "ensemble_scheduling" in reason
    assert rows[("gpu", "1")]["state"] == "UNAVAILABLE"
    assert "KIND_GPU" in rows[("gpu", "1")]["reason"]
    for model in ("a", "b", "flat", "fixed2"):
        assert daemon.get(f"/v2/models/{model}/ready")[0] == 200, model
    assert rows[("a", "1")]["state"] == rows[("a", "2")]["state"] == "READY"
    assert daemon.get("/v2/models/nope/config")[0] in (400, 404)


def test_the_flat_layout_takes_its_settings_from_its_toml(client: object) -> None:
    flat = client.get_model_config("flat")  # type: ignore[attr-defined]
    assert flat["max_batch_size"] == 2
    assert flat["dynamic_batching"]["max_queue_delay_microseconds"] == 7000
    assert infer(client, "flat", rows=3)[2, 0] == 100.0


def test_a_model_with_a_fixed_batch_serves_under_the_default_batch_size(client: object) -> None:
    fixed = client.get_model_config("fixed2")  # type: ignore[attr-defined]
    assert fixed["max_batch_size"] == 2
    assert fixed["version_policy"] == {"latest": {"num_versions": 1}}
    assert infer(client, "fixed2", rows=1)[0, 0] == 5.0

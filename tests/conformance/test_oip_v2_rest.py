"""Conformance of the daemon's REST API with the Open Inference Protocol v2 (KServe v2) and its
binary tensor data, statistics and model repository extensions: every documented response
object has the documented fields with the documented JSON types, checked on the real daemon.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from test_daemon_support import MODEL, Daemon, samples, start_daemon, stop_daemon

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

DATATYPES = {"BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
             "FP16", "FP32", "FP64", "BYTES"}  # fmt: skip


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_daemon(tmp_path_factory.mktemp("conformance"))
    yield d
    stop_daemon(d)


def _check(obj: Any, schema: dict[str, Any], optional: dict[str, Any] | None = None) -> None:
    """``obj`` is an object with every key of ``schema`` (of its type) and maybe ``optional``."""
    assert isinstance(obj, dict), obj
    for key, typ in schema.items():
        assert key in obj, f"missing {key!r} in {obj}"
        assert isinstance(obj[key], typ), f"{key!r} is {type(obj[key]).__name__} in {obj}"
    for key, typ in (optional or {}).items():
        if key in obj:
            assert isinstance(obj[key], typ), f"{key!r} is {type(obj[key]).__name__}"


def _tensor_metadata(t: Any) -> None:
    _check(t, {"name": str, "datatype": str, "shape": list})
    assert t["datatype"] in DATATYPES
    assert all(isinstance(d, int) and d >= -1 for d in t["shape"])


def test_health_objects(daemon: Daemon) -> None:
    status, live = daemon.get("/v2/health/live")
    assert status == 200
    _check(live, {"live": bool})
    status, ready = daemon.get("/v2/health/ready")
    assert status == 200
    _check(ready, {"ready": bool})
    status, model_ready = daemon.get(f"/v2/models/{MODEL}/ready")
    assert status == 200
    _check(model_ready, {"name": str, "ready": bool})


def test_server_and_model_metadata_objects(daemon: Daemon) -> None:
    status, server = daemon.get("/v2")
    assert status == 200
    _check(server, {"name": str, "version": str, "extensions": list})
    assert all(isinstance(e, str) for e in server["extensions"])
    status, model = daemon.get(f"/v2/models/{MODEL}")
    assert status == 200
    _check(model, {"name": str, "platform": str, "inputs": list, "outputs": list},
           {"versions": list})  # fmt: skip
    for t in model["inputs"] + model["outputs"]:
        _tensor_metadata(t)


def test_inference_response_object(daemon: Daemon) -> None:
    pixels, _ = samples()
    doc = {
        "id": "conf-1",
        "parameters": {"binary_data_output": False, "timeout": 5_000_000},
        "inputs": [{"name": "pixels", "shape": [2, 64], "datatype": "FP32",
                    "parameters": {}, "data": pixels[:2].ravel().tolist()}],
        "outputs": [{"name": "logits", "parameters": {"binary_data": False}}],
    }  # fmt: skip
    status, out = daemon.post(f"/v2/models/{MODEL}/infer", doc)
    assert status == 200
    _check(out, {"model_name": str, "outputs": list}, {"model_version": str, "id": str})
    assert out["id"] == "conf-1"
    for o in out["outputs"]:
        _check(o, {"name": str, "shape": list, "datatype": str, "data": list}, {"parameters": dict})
        assert len(o["data"]) == int(np.prod(o["shape"]))


def test_binary_extension_response_layout(daemon: Daemon) -> None:
    pixels, _ = samples()
    x = np.ascontiguousarray(pixels[:3], "<f4")
    head = json.dumps({"inputs": [{"name": "pixels", "shape": [3, 64], "datatype": "FP32",
                                   "parameters": {"binary_data_size": x.nbytes}}],
                       "parameters": {"binary_data_output": True}}).encode()  # fmt: skip
    req = urllib.request.Request(
        daemon.url(f"/v2/models/{MODEL}/infer"),
        data=head + x.tobytes(),
        headers={"Inference-Header-Content-Length": str(len(head)),
                 "Content-Type": "application/octet-stream"},
    )  # fmt: skip
    with urllib.request.urlopen(req, timeout=10) as resp:
        n = int(resp.headers["Inference-Header-Content-Length"])
        body = resp.read()
    header = json.loads(body[:n])
    sizes = [o["parameters"]["binary_data_size"] for o in header["outputs"]]
    assert all("data" not in o for o in header["outputs"])
    assert sum(sizes) == len(body) - n  # binary tensors follow the JSON, in output order


def test_error_object(daemon: Daemon) -> None:
    for method, path in [("GET", "/v2/models/none"), ("POST", f"/v2/models/{MODEL}/infer")]:
        status, err = (daemon.get if method == "GET" else daemon.post)(path)  # type: ignore[operator]
        assert status in (400, 404)
        _check(err, {"error": str})


def test_statistics_extension_object(daemon: Daemon) -> None:
    status, stats = daemon.get(f"/v2/models/{MODEL}/stats")
    assert status == 200
    _check(stats, {"model_stats": list})
    for m in stats["model_stats"]:
        _check(m, {"name": str, "version": str, "last_inference": int, "inference_count": int,
                   "execution_count": int, "inference_stats": dict})  # fmt: skip
        for key in ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output"):
            _check(m["inference_stats"][key], {"count": int, "ns": int})


def test_repository_extension_index_object(daemon: Daemon) -> None:
    status, index = daemon.post("/v2/repository/index")
    assert status == 200 and isinstance(index, list)
    for m in index:
        _check(m, {"name": str}, {"version": str, "state": str, "reason": str})


def test_parameters_the_server_does_not_support_are_refused_with_an_error_object(
    daemon: Daemon,
) -> None:
    pixels, _ = samples()
    base = {"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32",
                        "data": pixels[:1].ravel().tolist()}]}  # fmt: skip
    params = {"sequence_id": 3, "sequence_start": True}
    status, err = daemon.post(f"/v2/models/{MODEL}/infer", {**base, "parameters": params})
    assert status == 400
    _check(err, {"error": str})
    assert "sequence_id" in err["error"]
    # a parameter of the client's own is the model's (the parameters extension): taken
    status, out = daemon.post(f"/v2/models/{MODEL}/infer", {**base, "parameters": {"custom": 1}})
    assert status == 200, out


def test_classification_extension_output_object(daemon: Daemon) -> None:
    pixels, logits = samples()
    doc = {"inputs": [{"name": "pixels", "shape": [3, 64], "datatype": "FP32",
                       "data": pixels[:3].ravel().tolist()}],
           "outputs": [{"name": "logits", "parameters": {"classification": 2}}]}  # fmt: skip
    status, out = daemon.post(f"/v2/models/{MODEL}/infer", doc)
    assert status == 200, out
    (o,) = out["outputs"]
    _check(o, {"name": str, "shape": list, "datatype": str, "data": list})
    assert o["datatype"] == "BYTES" and o["shape"] == [3, 2]
    top = [[int(s.split(":")[1]) for s in o["data"][r * 2 : r * 2 + 2]] for r in range(3)]
    assert top == np.argsort(-logits[:3], axis=1, kind="stable")[:, :2].tolist()

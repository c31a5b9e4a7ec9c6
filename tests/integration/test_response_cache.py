"""Triton's response cache on the real daemon, as Triton's ``qa/L0_response_cache`` and
``L0_metrics`` start it (``--cache-config local,size=BYTES``, ``response_cache { enable: true
}``): an equal request is answered without running the model (the statistics' execution count
stays, ``cache_hit`` counts, over HTTP and gRPC alike), the cache evicts the least recently used
answer past its size, a reload never serves the old model's answers, and ``/metrics`` has
Triton's cache counters, the failure ``reason`` label, summaries and the first-response
histogram (``--metrics-config``), ``nv_cpu_*`` and the model's ``metric_tags`` as labels.

One daemon for the module: ``cached`` (the cache on, y = k * x), ``plain`` (the cache off) and
``counter`` (a python model with the cache on that answers how many times it has run). Each
test uses inputs of its own, so what the others left in the cache changes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper

from model_runtime.server.inference.cache import ENTRY_OVERHEAD, TENSOR_OVERHEAD
from tests.integration.test_daemon_support import Daemon, metric, start_daemon, stop_daemon

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

#: What one cached answer of ``cached`` (y: one row of 4 FP32) counts for: three fit.
ENTRY = ENTRY_OVERHEAD + TENSOR_OVERHEAD + len("y") + 4 * 4
CACHE_SIZE = 3 * ENTRY + ENTRY // 2

CONFIG = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [ 4 ] }} ]
{extra}
"""


COUNTER_CONFIG = """
name: "counter"
backend: "python"
max_batch_size: 0
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "calls" data_type: TYPE_INT64 dims: [ 1 ] } ]
response_cache { enable: true }
"""
COUNTER_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.calls = 0

    def execute(self, requests):
        responses = []
        for request in requests:
            self.calls += 1
            out = pb_utils.Tensor("calls", np.array([self.calls], np.int64))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
"""


def _scale_model(path: Path, k: float) -> None:
    """y = k * x, FLOAT [batch, 4]."""
    factor = helper.make_tensor("k", TensorProto.FLOAT, [1], [k])
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "k"], ["y"])],
        "scale",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [factor],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("cache")
    repo = tmp / "models"
    cache_on = 'response_cache { enable: true }\nmetric_tags { key: "team" value: "vision" }'
    for name, extra in (("cached", cache_on), ("plain", "")):
        (repo / name).mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name, extra=extra))
        _scale_model(repo / name / "1" / "model.onnx", 2.0)
    (repo / "counter" / "1").mkdir(parents=True)
    (repo / "counter" / "config.pbtxt").write_text(COUNTER_CONFIG)
    (repo / "counter" / "1" / "model.py").write_text(COUNTER_MODEL)
    d = start_daemon(
        tmp,
        f"--model-repository={repo}",
        "--model-control-mode=explicit",
        "--load-model=cached",
        "--load-model=plain",
        "--load-model=counter",
        f"--cache-config=local,size={CACHE_SIZE}",
        "--metrics-config", "summary_latencies=true",
        "--metrics-config", "histogram_latencies=true",
    )  # fmt: skip
    d.repo = repo  # type: ignore[attr-defined]
    try:
        yield d
    finally:
        stop_daemon(d)


def _infer(d: Daemon, x: list[float], model: str = "cached", **params: Any) -> list[float]:
    tensor = {"name": "x", "datatype": "FP32", "shape": [1, 4], "data": x}
    doc: dict[str, Any] = {"inputs": [tensor]}
    if params:
        doc["parameters"] = params
    status, out = d.post(f"/v2/models/{model}/infer", doc)
    assert status == 200, out
    y: list[float] = out["outputs"][0]["data"]
    return y


def _stats(d: Daemon, model: str = "cached") -> dict[str, int]:
    status, doc = d.get(f"/v2/models/{model}/stats")
    assert status == 200, doc
    (s,) = doc["model_stats"]
    inference = s["inference_stats"]
    return {
        "executions": s["execution_count"],
        "inferences": s["inference_count"],
        "success": inference["success"]["count"],
        "hits": inference["cache_hit"]["count"],
        "misses": inference["cache_miss"]["count"],
    }


def _delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after}


def test_an_equal_request_is_answered_from_the_cache_without_running_the_model(
    daemon: Daemon,
) -> None:
    x = [1.0, 2.0, 3.0, 4.0]
    before = _stats(daemon)
    first = _infer(daemon, x)
    second = _infer(daemon, x)
    assert first == second == [2.0, 4.0, 6.0, 8.0]
    after = _delta(_stats(daemon), before)
    # The second one did not run: one execution, one inference, a miss then a hit.
    assert after == {"executions": 1, "inferences": 1, "success": 2, "hits": 1, "misses": 1}

    # Over gRPC with Triton's client, the same request is the same cache entry.
    with grpcclient.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}") as c:
        inp = grpcclient.InferInput("x", [1, 4], "FP32")
        inp.set_data_from_numpy(np.array([x], np.float32))
        result = c.infer("cached", [inp])
        assert result.as_numpy("y").tolist() == [first]
        stats = c.get_inference_statistics("cached", as_json=True)["model_stats"][0]
    assert int(stats["inference_stats"]["cache_hit"]["count"]) == before["hits"] + 2
    assert int(stats["execution_count"]) == before["executions"] + 1
    # And over HTTP with binary outputs (the cached arrays are read-only; encoding copes).
    with httpclient.InferenceServerClient(f"127.0.0.1:{daemon.port}") as h:
        inp = httpclient.InferInput("x", [1, 4], "FP32")
        inp.set_data_from_numpy(np.array([x], np.float32), binary_data=True)
        out = httpclient.InferRequestedOutput("y", binary_data=True)
        assert h.infer("cached", [inp], outputs=[out]).as_numpy("y").tolist() == [first]
    assert _stats(daemon)["executions"] == before["executions"] + 1

    # Other inputs, or another custom parameter, are other requests: each runs once.
    mid = _stats(daemon)
    assert _infer(daemon, [1.0, 2.0, 3.0, 5.0])[3] == 10.0
    _infer(daemon, x, tag="other")
    _infer(daemon, x, tag="other")
    assert _delta(_stats(daemon), mid)["executions"] == 2

    # The cache is the model's choice: `plain` runs every time.
    plain = _stats(daemon, "plain")
    _infer(daemon, x, "plain")
    _infer(daemon, x, "plain")
    assert _delta(_stats(daemon, "plain"), plain)["executions"] == 2
    assert _stats(daemon, "plain")["hits"] == 0


def test_a_python_model_is_not_called_for_a_cached_answer(daemon: Daemon) -> None:
    def calls(x: list[float]) -> int:
        tensor = {"name": "x", "datatype": "FP32", "shape": [4], "data": x}
        status, out = daemon.post("/v2/models/counter/infer", {"inputs": [tensor]})
        assert status == 200, out
        return int(out["outputs"][0]["data"][0])

    first = calls([41.0] * 4)
    assert calls([41.0] * 4) == first  # answered from the cache: the model did not run
    assert calls([42.0] * 4) == first + 1  # another request: it runs


def test_past_its_size_the_cache_evicts_the_least_recently_used_answer(daemon: Daemon) -> None:
    a, b, c, e = ([float(v)] * 4 for v in (11, 12, 13, 14))
    expected = [  # three answers fit: a, b, c; a is used again, so e evicts b, then b evicts c
        (a, "miss"), (b, "miss"), (c, "miss"), (a, "hit"), (e, "miss"),
        (a, "hit"), (b, "miss"), (e, "hit"), (c, "miss"),
    ]  # fmt: skip
    seen = []
    for x, _ in expected:
        before = _stats(daemon)
        assert _infer(daemon, x) == [2 * v for v in x]
        seen.append((x, "hit" if _delta(_stats(daemon), before)["hits"] else "miss"))
    assert seen == expected


def test_a_reload_never_serves_the_old_models_answers(daemon: Daemon) -> None:
    x = [21.0, 22.0, 23.0, 24.0]
    repo: Path = daemon.repo  # type: ignore[attr-defined]
    model = repo / "cached" / "1" / "model.onnx"
    try:
        assert _infer(daemon, x) == [42.0, 44.0, 46.0, 48.0]
        assert _infer(daemon, x) == [42.0, 44.0, 46.0, 48.0]  # from the cache
        _scale_model(model, 3.0)
        status, out = daemon.post("/v2/repository/models/cached/load")  # a reload
        assert status == 200, out
        before = _stats(daemon)
        assert _infer(daemon, x) == [63.0, 66.0, 69.0, 72.0]  # the new model ran
        assert _infer(daemon, x) == [63.0, 66.0, 69.0, 72.0]
        assert _delta(_stats(daemon), before)["hits"] == 1
    finally:
        _scale_model(model, 2.0)
        assert daemon.post("/v2/repository/models/cached/load")[0] == 200


def test_metrics_have_tritons_cache_counters_reasons_summaries_histogram_and_cpu(
    daemon: Daemon,
) -> None:
    x = [31.0, 32.0, 33.0, 34.0]
    _infer(daemon, x)
    _infer(daemon, x)
    _infer(daemon, x, "plain")
    bad = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]}
    assert daemon.post("/v2/models/plain/infer", bad)[0] == 400
    stats, plain = _stats(daemon), _stats(daemon, "plain")
    status, text = daemon.get("/metrics")
    assert status == 200
    cached = '{_team="vision",model="cached",version="1"}'
    assert metric(text, f"nv_cache_num_hits_per_model{cached} ") == stats["hits"]
    assert metric(text, f"nv_cache_num_misses_per_model{cached} ") == stats["misses"]
    assert (metric(text, f"nv_cache_hit_duration_per_model{cached} ") or 0) > 0
    assert (metric(text, f"nv_cache_miss_duration_per_model{cached} ") or 0) > 0
    assert 'nv_cache_num_hits_per_model{model="plain"' not in text  # its cache is off
    assert metric(text, f"nv_inference_request_success{cached} ") == stats["success"]

    labels = 'model="plain",version="1"'
    assert metric(text, f'nv_inference_request_failure{{{labels},reason="OTHER"}} ') == 1
    assert metric(text, f'nv_inference_request_failure{{{labels},reason="BACKEND"}} ') == 0

    # Summaries: the request summary is left out for a model that uses the cache (Triton's
    # DLIS-4762), which has cache summaries instead.
    assert metric(text, f'nv_inference_request_summary_us{{{labels},quantile="0.5"}} ') is not None
    assert metric(text, f"nv_inference_request_summary_us_count{{{labels}}} ") == plain["success"]
    assert 'nv_inference_request_summary_us{_team="vision"' not in text
    assert metric(text, f"nv_cache_hit_summary_us_count{cached} ") == stats["hits"]
    for phase in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert f"# TYPE nv_inference_{phase}_summary_us summary" in text, phase
    histogram = "nv_inference_first_response_histogram_ms"
    assert metric(text, f'{histogram}_bucket{{{labels},le="+Inf"}} ') == plain["success"]
    assert metric(text, f"{histogram}_count{{{labels}}} ") == plain["success"]

    utilization = metric(text, "nv_cpu_utilization ")
    assert utilization is not None and 0.0 <= utilization <= 1.0
    total = metric(text, "nv_cpu_memory_total_bytes ") or 0
    used = metric(text, "nv_cpu_memory_used_bytes ") or 0
    assert total > used > 0
    # The metrics listener serves the same families.
    assert daemon.metrics_port

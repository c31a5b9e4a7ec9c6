"""Python models' metrics in the daemon's Prometheus text (observability/python_models.py):
custom families as the model named them, across models, and instance restarts."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from model_runtime.python_backend.metrics import CustomMetrics
from model_runtime.server.observability.python_models import python_models_text


@dataclass
class _Runner:
    metrics: CustomMetrics = field(default_factory=CustomMetrics)
    restarts: int = 0


def _samples(text: bytes) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


def test_counters_gauges_and_histograms_as_the_models_made_them() -> None:
    a, b = _Runner(restarts=2), _Runner()
    a.metrics.family("latency_ns", "time spent", "COUNTER")
    a.metrics.apply({"op": "increment", "family": "latency_ns", "labels": {"m": "a"}, "value": 5})
    b.metrics.family("latency_ns", "time spent", "COUNTER")  # the same family, another model
    b.metrics.apply({"op": "increment", "family": "latency_ns", "labels": {"m": "b"}, "value": 1})
    a.metrics.family("queue", "depth", "GAUGE")
    a.metrics.apply({"op": "set", "family": "queue", "labels": {}, "value": 3})
    a.metrics.family("sizes", "sizes seen", "HISTOGRAM")
    for v in (0.5, 2.0, 9.0):
        op = {"op": "observe", "family": "sizes", "labels": {"m": "a"}, "value": v}
        a.metrics.apply(op | {"buckets": [1.0, 5.0]})
    text = python_models_text([("a", "1", a), ("b", "2", b), ("onnx", "1", object())])
    assert b'# TYPE latency_ns counter\nlatency_ns{m="a"} 5.0\nlatency_ns{m="b"} 1.0' in text
    samples = _samples(text)
    assert samples["queue{}"] == 3.0
    assert samples["sizes_bucket{le=1.0,m=a}"] == 1.0
    assert samples["sizes_bucket{le=5.0,m=a}"] == 2.0
    assert samples["sizes_bucket{le=+Inf,m=a}"] == 3.0
    assert samples["sizes_count{m=a}"] == 3.0 and samples["sizes_sum{m=a}"] == 11.5
    assert samples["model_runtime_python_instance_restarts_total{model=a,version=1}"] == 2.0
    assert samples["model_runtime_python_instance_restarts_total{model=b,version=2}"] == 0.0
    assert "model_runtime_python_instance_restarts_total{model=onnx,version=1}" not in samples


def test_no_python_model_no_text() -> None:
    assert python_models_text([("onnx", "1", object())]) == b""

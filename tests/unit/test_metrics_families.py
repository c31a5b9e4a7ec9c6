"""Triton's metric families beyond its counters, without a daemon: the failure reasons,
summaries over a sliding window (a fake clock), the request summary left out for a model
that uses the cache, the first-response histogram's buckets, ``metric_tags`` as labels and
``nv_cpu_*`` read from a ``/proc`` of our own."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from model_runtime.server.observability.cpu import CpuMetrics
from model_runtime.server.observability.families import MetricsConfig, Window, triton_reason
from model_runtime.server.observability.metrics import DaemonMetrics
from model_runtime.server.triton.config import parse_pbtxt
from tests.integration.test_daemon_support import metric


@pytest.mark.parametrize(
    ("ours", "tritons"),
    [
        ("queue_full", "REJECTED"),
        ("deadline_exceeded", "REJECTED"),
        ("cancelled", "CANCELED"),
        ("runtime_error", "BACKEND"),
        ("bad_request", "OTHER"),
        ("not_ready", "OTHER"),
    ],
)
def test_failure_reasons_are_tritons(ours: str, tritons: str) -> None:
    assert triton_reason(ours) == tritons


def test_a_summary_forgets_what_is_older_than_its_window() -> None:
    w = Window()
    for v in range(1, 101):
        w.observe(float(v), now=0.0)
    assert dict(w.quantiles((0.5, 0.99), now=30.0)) == {0.5: 51.0, 0.99: 100.0}
    w.observe(7.0, now=61.0)  # the first hundred are now past the 60 s window
    assert dict(w.quantiles((0.5,), now=61.0)) == {0.5: 7.0}
    assert (w.count, w.total) == (101, 5057.0)  # count and sum since start


def _render(metrics: DaemonMetrics) -> str:
    return metrics.render().decode()


def test_summaries_histogram_reasons_and_tags_in_the_exposition() -> None:
    now = [100.0]
    config = MetricsConfig(summary_latencies=True, histogram_latencies=True)
    metrics = DaemonMetrics(config, cpu=False, clock=lambda: now[0])
    metrics.cache = True
    metrics.totals("cached", "1").cache_enabled = True
    metrics.totals("m", "1").tags = (("team", "vision"),)
    for seconds in (0.05, 0.3, 1.0, 3.0, 9.0):
        metrics.observe("m", None, seconds, 1)
        metrics.observe("cached", None, seconds, 1)
    metrics.observe("m", "queue_full", 0.0, 0)
    metrics.observe("m", "cancelled", 0.0, 0)
    metrics.cache_lookup("cached", "1", True, 2000)
    text = _render(metrics)
    m = '_team="vision",model="m",version="1"'
    assert metric(text, f'nv_inference_request_failure{{{m},reason="REJECTED"}} ') == 1
    assert metric(text, f'nv_inference_request_failure{{{m},reason="CANCELED"}} ') == 1
    assert metric(text, f'nv_inference_request_failure{{{m},reason="BACKEND"}} ') == 0
    assert metric(text, f'nv_inference_request_summary_us{{{m},quantile="0.5"}} ') == 1e6
    assert metric(text, f"nv_inference_request_summary_us_count{{{m}}} ") == 5
    assert 'nv_inference_request_summary_us{model="cached"' not in text
    cached = 'model="cached",version="1"'
    assert metric(text, f"nv_cache_hit_summary_us_count{{{cached}}} ") == 1
    assert metric(text, f"nv_cache_num_hits_per_model{{{cached}}} ") == 1
    assert metric(text, f"nv_cache_hit_duration_per_model{{{cached}}} ") == 2.0
    assert "nv_cache_num_hits_per_model{_team" not in text  # m does not use the cache
    h = "nv_inference_first_response_histogram_ms_bucket"
    edges = ("100", "500", "2000", "5000", "+Inf")  # Triton's bucket labels
    buckets = [metric(text, f'{h}{{{m},le="{le}"}} ') for le in edges]
    assert buckets == [1, 2, 3, 4, 5]
    now[0] += 61  # a minute later the window is empty, the count stays
    text = _render(metrics)
    assert f'nv_inference_request_summary_us{{{m},quantile="0.5"}} NaN' in text
    assert metric(text, f"nv_inference_request_summary_us_count{{{m}}} ") == 5


def test_defaults_have_counters_and_no_summaries_no_histogram_and_no_cache_counters() -> None:
    metrics = DaemonMetrics(cpu=False)
    metrics.totals("m", "1").cache_enabled = True  # no cache in the daemon: nothing to count
    metrics.observe("m", None, 0.1, 1)
    text = _render(metrics)
    assert "nv_inference_queue_duration_us{" in text
    for absent in ("_summary_us", "first_response_histogram", "nv_cache_", "nv_cpu_"):
        assert absent not in text, absent
    off = _render(DaemonMetrics(MetricsConfig(counter_latencies=False), cpu=False))
    assert "nv_inference_queue_duration_us" not in off
    assert "nv_inference_request_success" in off


def test_cpu_utilization_is_the_busy_share_since_the_previous_scrape(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    meminfo = "MemTotal:  1000 kB\nMemFree:  100 kB\nMemAvailable:  400 kB\n"
    (proc / "meminfo").write_text(meminfo)
    # user nice system idle iowait irq softirq steal
    (proc / "stat").write_text("cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 1 1 1 1\n")
    cpu = CpuMetrics(proc)
    first = "\n".join(cpu.lines())
    assert metric(first, "nv_cpu_utilization ") == 0.2  # since boot: 200 busy of 1000
    (proc / "stat").write_text("cpu  400 0 100 800 100 0 0 0 0 0\ncpu0 1 1 1 1\n")
    text = "\n".join(cpu.lines())
    assert metric(text, "nv_cpu_utilization ") == 0.75  # 300 busy of the 400 since
    assert metric(text, "nv_cpu_memory_total_bytes ") == 1000 * 1024
    assert metric(text, "nv_cpu_memory_used_bytes ") == 600 * 1024  # total less available


def test_a_models_model_metrics_sets_its_first_response_buckets(tmp_path: Path) -> None:
    text = (
        'name: "m"\nmodel_metrics { metric_control [ { metric_identifier { family: '
        '"nv_inference_first_response_histogram_ms" } histogram_options { buckets: [ 1, 2, 4, 8 '
        "] } } ] }\n"
    )
    (tmp_path / "config.pbtxt").write_text(text)
    settings = parse_pbtxt(tmp_path / "config.pbtxt", "m")
    metrics = DaemonMetrics(MetricsConfig(histogram_latencies=True), cpu=False)
    metrics.configure(SimpleNamespace(name="m", version="1", settings=settings))  # type: ignore[arg-type]
    for ms in (0.5, 3.0, 100.0):
        metrics.observe("m", None, ms / 1000, 1)
    out = _render(metrics)
    h = 'nv_inference_first_response_histogram_ms_bucket{model="m",version="1",le="%s"} '
    assert [metric(out, h % le) for le in ("1", "2", "4", "8", "+Inf")] == [1, 1, 2, 2, 3]
    assert 'le="100"' not in out  # not Triton's default buckets


def test_requests_count_as_the_metrics_own_methods_count_them() -> None:
    """Successes, samples and durations (on a bucket's bound, between, past the last) read
    the same in the exposition as prometheus_client's own inc/observe make them, counted one
    request at a time (observe) and a turn's requests at once (observe_ok)."""
    from unittest.mock import patch

    from prometheus_client import generate_latest

    from model_runtime.server.observability.metrics import _each

    durations = [0.0, 0.0005, 0.0007, 0.001, 0.3, 10.0, 12.5, 0.0005]

    def run(metrics: DaemonMetrics) -> list[str]:
        for seconds in durations:
            metrics.observe("m", None, seconds, 3)
        metrics.observe_ok("m", "1", durations, 5)
        metrics.observe("m", "timeout", 0.2, 0)
        text = generate_latest(metrics.registry).decode()
        return [
            line
            for line in text.splitlines()
            if line.startswith(("model_runtime_request", "model_runtime_inferences"))
            and "_created" not in line
        ]

    fast = run(DaemonMetrics(cpu=False))
    public = DaemonMetrics(cpu=False)
    with patch.object(
        public,
        "_success_counts",
        lambda model: (
            public.requests.labels(model, "success", "").inc,
            public.inferences.labels(model).inc,
            public.duration.labels(model).observe,
            _each(public.duration.labels(model).observe),
        ),
    ):
        assert run(public) == fast
    assert any('le="0.0005"' in line and line.endswith(" 6.0") for line in fast)

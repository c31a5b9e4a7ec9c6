"""Triton's totals of one (model, version) (:class:`TritonTotals`, kept by
:class:`~model_runtime.server.observability.metrics.DaemonMetrics` across reloads) and their
text exposition under Triton's names (:func:`triton_text`): counters without prometheus_client's
``_total``, ``nv_inference_request_failure`` by Triton's ``reason``, the cache counters of the
models that use the cache, a model's ``metric_tags`` as ``_KEY`` labels."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from model_runtime.server.observability.families import TRITON_REASONS, MetricsConfig

__all__ = ["BatchTotals", "TritonTotals", "labels_of", "triton_text"]


@dataclass(slots=True)
class BatchTotals:
    """Executions of one batch size and their compute durations (Triton's ``batch_stats``):
    each batch counts its run's mean per-request phase durations once."""

    count: int = 0
    compute_input_us: float = 0.0
    compute_infer_us: float = 0.0
    compute_output_us: float = 0.0


@dataclass(slots=True)
class TritonTotals:
    """Cumulative Triton counters of one (model, version), across reloads of it.

    Each numeric field is the metric ``nv_inference_<field>``; ``batches`` are the executions
    by batch size (the statistics extension's ``batch_stats``).
    """

    request_success: int = 0
    request_failure: int = 0
    count: int = 0
    exec_count: int = 0
    request_duration_us: float = 0.0
    queue_duration_us: float = 0.0
    compute_input_duration_us: float = 0.0
    compute_infer_duration_us: float = 0.0
    compute_output_duration_us: float = 0.0
    batches: dict[int, BatchTotals] = field(default_factory=dict)
    #: Requests each duration was recorded for, by field name (``queue_duration_us``, ...).
    recorded: dict[str, int] = field(default_factory=dict)
    #: Failed requests by Triton's reason (``REJECTED``, ``CANCELED``, ``BACKEND``, ``OTHER``).
    failures: dict[str, int] = field(default_factory=dict)
    #: Response cache lookups that hit / missed, and their time (a miss: lookup and insertion).
    cache_hits: int = 0
    cache_hit_us: float = 0.0
    cache_misses: int = 0
    cache_miss_us: float = 0.0
    #: The model version's response cache is on (read at each scrape).
    cache_enabled: bool = False
    #: Its ``metric_tags``, as labels (read at each scrape).
    tags: tuple[tuple[str, str], ...] = ()


_TRITON_HELP = {
    "request_success": "Number of successful inference requests, all batch sizes",
    "request_failure": "Number of failed inference requests, all batch sizes",
    "count": "Number of inferences performed (samples)",
    "exec_count": "Number of model executions performed (batches)",
    "request_duration_us": "Cumulative inference request duration in microseconds",
    "queue_duration_us": "Cumulative inference queuing duration in microseconds",
    "compute_input_duration_us": "Cumulative compute input duration in microseconds",
    "compute_infer_duration_us": "Cumulative compute inference duration in microseconds",
    "compute_output_duration_us": "Cumulative inference compute output duration in microseconds",
}


_CACHE_HELP = {
    "nv_cache_num_hits_per_model": ("cache_hits", "Number of cache hits per model"),
    "nv_cache_num_misses_per_model": ("cache_misses", "Number of cache misses per model"),
    "nv_cache_hit_duration_per_model": (
        "cache_hit_us",
        "Total cache hit duration per model, in microseconds",
    ),
    "nv_cache_miss_duration_per_model": (
        "cache_miss_us",
        "Total cache miss (insert+lookup) duration per model, in microseconds",
    ),
}
_LATENCY_COUNTERS = frozenset(name for name in _TRITON_HELP if name.endswith("_duration_us"))


def labels_of(model: str, version: str, t: TritonTotals) -> str:
    """A (model, version)'s label text: its tags, then ``model`` and ``version``."""
    tags = "".join(f'_{key}="{_escape(value)}",' for key, value in t.tags)
    return f'{tags}model="{_escape(model)}",version="{_escape(version)}"'


def triton_text(
    triton: Mapping[tuple[str, str], TritonTotals], config: MetricsConfig, cache: bool
) -> list[str]:
    """Triton's counters in the text format, named as Triton names them: prometheus_client
    would add ``_total`` to a counter's name, and Triton users' dashboards query without it.
    ``cache``: the daemon has a response cache (its models that use it have cache counters)."""
    lines: list[str] = []
    totals = sorted(triton.items())
    for name, doc in _TRITON_HELP.items():
        if name in _LATENCY_COUNTERS and not config.counter_latencies:
            continue
        full = f"nv_inference_{name}"
        lines += [f"# HELP {full} {doc}", f"# TYPE {full} counter"]
        for (model, version), t in totals:
            labels = labels_of(model, version, t)
            if name == "request_failure":
                for reason in TRITON_REASONS:
                    n = float(t.failures.get(reason, 0))
                    lines.append(f'{full}{{{labels},reason="{reason}"}} {n!r}')
                continue
            lines.append(f"{full}{{{labels}}} {float(getattr(t, name))!r}")
    cached = [(key, t) for key, t in totals if cache and t.cache_enabled]
    for full, (attr, doc) in _CACHE_HELP.items():
        if not cached:
            break
        lines += [f"# HELP {full} {doc}", f"# TYPE {full} counter"]
        for (model, version), t in cached:
            lines.append(f"{full}{{{labels_of(model, version, t)}}} {float(getattr(t, attr))!r}")
    return lines


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')

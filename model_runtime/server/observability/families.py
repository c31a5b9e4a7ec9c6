"""Triton's per-model metric families beyond its counters, as ``--metrics-config`` selects them
(Triton's ``metrics.md``): latency summaries (``summary_latencies=true``: quantiles over a
sliding window of 60 s, ``summary_quantiles=Q:E,...``), the first-response histogram
(``histogram_latencies=true``, buckets 100, 500, 2000, 5000 ms), the duration counters
(``counter_latencies=false`` leaves them out), and the failure reasons of
``nv_inference_request_failure`` (``REJECTED``, ``CANCELED``, ``BACKEND``, ``OTHER``).

A summary's quantiles are exact over the requests of the window (at most
:data:`WINDOW_LIMIT` of them); Triton's error bounds (``Q:E``) are read and not needed. The
queue and compute summaries are fed from the runner's statistics when metrics or statistics
are read: each request recorded since the last read counts at its replica's mean of that phase.
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from model_runtime.errors import ConfigurationError

__all__ = [
    "DEFAULT_BUCKETS_MS",
    "DEFAULT_QUANTILES",
    "SUMMARIES",
    "TRITON_REASONS",
    "Latencies",
    "MetricsConfig",
    "Window",
    "parse_metrics_config",
    "triton_reason",
]

TRITON_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
_REASONS = {
    "queue_full": "REJECTED",
    "deadline_exceeded": "REJECTED",
    "cancelled": "CANCELED",
    "runtime_error": "BACKEND",
    "internal": "BACKEND",
}
DEFAULT_QUANTILES = (0.5, 0.9, 0.95, 0.99, 0.999)
DEFAULT_BUCKETS_MS = (100.0, 500.0, 2000.0, 5000.0)
WINDOW_SECONDS = 60.0
WINDOW_LIMIT = 4096

#: Summary families by the phase they observe, with their help text.
SUMMARIES = {
    "request": ("nv_inference_request_summary_us", "Summary of inference request duration in "
                "microseconds (includes cached requests)"),
    "queue": ("nv_inference_queue_summary_us", "Summary of inference queuing duration in "
              "microseconds (includes cached requests)"),
    "compute_input": ("nv_inference_compute_input_summary_us", "Summary of compute input "
                      "duration in microseconds (does not include cached requests)"),
    "compute_infer": ("nv_inference_compute_infer_summary_us", "Summary of compute inference "
                      "duration in microseconds (does not include cached requests)"),
    "compute_output": ("nv_inference_compute_output_summary_us", "Summary of inference compute "
                       "output duration in microseconds (does not include cached requests)"),
    "cache_hit": ("nv_cache_hit_summary_us", "Summary of cache hit duration in microseconds"),
    "cache_miss": ("nv_cache_miss_summary_us", "Summary of cache miss duration in "
                   "microseconds"),
}  # fmt: skip


def triton_reason(reason: str) -> str:
    """Triton's failure reason for one of ours (:func:`~model_runtime.server.answers.status_of`):
    a queue or deadline refusal is REJECTED, a cancel CANCELED, the model's failure BACKEND,
    anything else (a bad request, a model not ready) OTHER."""
    return _REASONS.get(reason, "OTHER")


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    """``--metrics-config``: which latency families are served, and the summaries' quantiles."""

    counter_latencies: bool = True
    summary_latencies: bool = False
    histogram_latencies: bool = False
    quantiles: tuple[float, ...] = DEFAULT_QUANTILES


_TRUE = {"true": True, "1": True, "false": False, "0": False}
_NUMBER = re.compile(r"^\s*(\d+(\.\d*)?|\.\d+)")


def parse_metrics_config(values: Iterable[str]) -> MetricsConfig:
    """The config Triton's ``--metrics-config KEY=VALUE`` flags (repeatable) ask for.

    Raises:
        ConfigurationError: a malformed value, an unknown key, a boolean that is not one, or
            a quantile outside (0, 1).
    """
    settings: dict[str, object] = {}
    for value in values:
        key, eq, setting = value.partition("=")
        if not eq:
            raise ConfigurationError(f"--metrics-config {value!r}: expected KEY=VALUE")
        if key in ("counter_latencies", "summary_latencies", "histogram_latencies"):
            if setting.lower() not in _TRUE:
                raise ConfigurationError(f"--metrics-config {value!r}: expected true or false")
            settings[key] = _TRUE[setting.lower()]
        elif key == "summary_quantiles":
            settings["quantiles"] = _quantiles(value, setting)
        else:
            raise ConfigurationError(
                f"--metrics-config {value!r}: unknown key {key!r} (counter_latencies, "
                "summary_latencies, histogram_latencies, summary_quantiles)"
            )
    return MetricsConfig(**settings)  # type: ignore[arg-type]


def _quantiles(value: str, setting: str) -> tuple[float, ...]:
    out: list[float] = []
    for pair in setting.split(","):
        match = _NUMBER.match(pair.partition(":")[0])  # Triton reads a number's prefix too
        q = float(match.group(1)) if match else -1.0
        if not 0.0 < q < 1.0:
            raise ConfigurationError(
                f"--metrics-config {value!r}: each quantile is a number in (0, 1), as "
                "QUANTILE:ERROR"
            )
        out.append(q)
    return tuple(sorted(set(out)))


class Window:
    """One summary: its count and sum since start, and the values of the last
    :data:`WINDOW_SECONDS` (at most :data:`WINDOW_LIMIT`) for its quantiles."""

    __slots__ = ("_values", "count", "total")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0
        self._values: deque[tuple[float, float]] = deque(maxlen=WINDOW_LIMIT)

    def observe(self, value: float, now: float, times: int = 1) -> None:
        """Record ``value`` ``times`` times at ``now`` (seconds)."""
        self.count += times
        self.total += value * times
        for _ in range(min(times, WINDOW_LIMIT)):
            self._values.append((now, value))

    def quantiles(self, qs: Iterable[float], now: float) -> list[tuple[float, float]]:
        """Each quantile of the window's values (NaN when the window is empty)."""
        while self._values and self._values[0][0] < now - WINDOW_SECONDS:
            self._values.popleft()
        values = sorted(v for _, v in self._values)
        out = []
        for q in qs:
            if not values:
                out.append((q, math.nan))
            else:
                out.append((q, values[min(len(values) - 1, int(q * len(values)))]))
        return out


@dataclass(slots=True)
class Latencies:
    """One (model, version)'s summaries and first-response histogram."""

    windows: dict[str, Window] = field(default_factory=lambda: {k: Window() for k in SUMMARIES})
    #: The histogram's upper bounds (ms): Triton's, or the model's ``model_metrics``.
    edges: tuple[float, ...] = DEFAULT_BUCKETS_MS
    buckets: list[int] = field(default_factory=lambda: [0] * len(DEFAULT_BUCKETS_MS))
    histogram_count: int = 0
    histogram_sum: float = 0.0

    def set_edges(self, edges: tuple[float, ...] | None) -> None:
        """Use ``edges`` (None: Triton's defaults); other edges than before start the
        histogram afresh (Triton applies new buckets when a model is loaded again)."""
        edges = edges or DEFAULT_BUCKETS_MS
        if edges != self.edges:
            self.edges, self.buckets = edges, [0] * len(edges)
            self.histogram_count, self.histogram_sum = 0, 0.0

    def first_response(self, ms: float) -> None:
        """Count one request's time to its first response (milliseconds)."""
        self.histogram_count += 1
        self.histogram_sum += ms
        for i, le in enumerate(self.edges):
            if ms <= le:
                self.buckets[i] += 1


def _num(value: float) -> str:
    return "NaN" if math.isnan(value) else repr(float(value))


def render_latencies(
    config: MetricsConfig,
    latencies: dict[tuple[str, str], Latencies],
    labels: Callable[[str, str], str],
    cached: Callable[[str, str], bool],
    now: float,
) -> list[str]:
    """The text exposition of the summaries and histogram ``config`` asks for; ``labels``
    gives a (model, version)'s label text, ``cached`` whether its response cache is on
    (Triton leaves out its request summary then, and serves its cache summaries)."""
    lines: list[str] = []
    items = sorted(latencies.items())
    if config.summary_latencies:
        for phase, (name, doc) in SUMMARIES.items():
            rows: list[str] = []
            for (model, version), lat in items:
                on = cached(model, version)
                if (phase == "request" and on) or (phase.startswith("cache") and not on):
                    continue
                w, base = lat.windows[phase], labels(model, version)
                for q, v in w.quantiles(config.quantiles, now):
                    rows.append(f'{name}{{{base},quantile="{q}"}} {_num(v)}')
                rows.append(f"{name}_sum{{{base}}} {_num(w.total)}")
                rows.append(f"{name}_count{{{base}}} {float(w.count)!r}")
            if rows:
                lines += [f"# HELP {name} {doc}", f"# TYPE {name} summary", *rows]
    if config.histogram_latencies:
        name = "nv_inference_first_response_histogram_ms"
        lines += [
            f"# HELP {name} Duration from request to first response in milliseconds",
            f"# TYPE {name} histogram",
        ]
        for (model, version), lat in items:
            base = labels(model, version)
            for le, n in zip(lat.edges, lat.buckets, strict=True):
                lines.append(f'{name}_bucket{{{base},le="{le:g}"}} {float(n)!r}')
            lines.append(f'{name}_bucket{{{base},le="+Inf"}} {float(lat.histogram_count)!r}')
            lines.append(f"{name}_sum{{{base}}} {_num(lat.histogram_sum)}")
            lines.append(f"{name}_count{{{base}}} {float(lat.histogram_count)!r}")
    return lines

"""Prometheus metrics of one daemon (its own ``CollectorRegistry``, never the global one).

Request outcomes, inference counts, durations and pending requests are counted by the HTTP
layer as requests finish. Replica facts (state, device, batches run, resets, restarts, queue
and compute durations) are read from each runner, and model facts (repository state, versions
loaded, loads failed) from the repository, when ``/metrics`` is scraped: the handler awaits
:meth:`DaemonMetrics.refresh`, then renders; collection itself never awaits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from actors.session.state import ReplicaStatus
from model_runtime.errors import ModelRuntimeError
from model_runtime.server.repository import ModelRepository, ModelState, replica_states

__all__ = [
    "CONTENT_TYPE",
    "DaemonMetrics",
    "ModelSnapshot",
    "ReplicaSnapshot",
    "phase_of",
    "read_statistics",
    "replica_counters",
]

#: The Prometheus text exposition content type.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_STATS_TIMEOUT = 1.0


@dataclass(slots=True)
class ReplicaSnapshot:
    """What one replica looked like at the last scrape."""

    model: str
    replica: int
    status: ReplicaStatus
    device: int | None = None
    counters: dict[str, int] = field(default_factory=dict)
    mean_us: dict[str, float] = field(default_factory=dict)
    count: dict[str, float] = field(default_factory=dict)


def replica_counters(runner: Any, replica: int) -> tuple[int | None, dict[str, int]]:
    """Device id and counters (runs, resets, restarts, retries) of one replica, when exposed."""
    states = replica_states(runner)
    if replica >= len(states):
        return None, {}
    state = states[replica]
    counters = {}
    for name in ("runs", "resets", "restarts", "retries"):
        value = getattr(state, name, None)
        if isinstance(value, int):
            counters[name] = value
    device = getattr(state, "device_id", None)
    return (device if isinstance(device, int) else None), counters


@dataclass(frozen=True, slots=True)
class ModelSnapshot:
    """What one model of the repository looked like at the last scrape."""

    model: str
    state: ModelState
    loads: int
    load_failures: int


class _ModelCollector(Collector):
    def __init__(self, metrics: DaemonMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        state = GaugeMetricFamily(
            "model_runtime_model_state",
            "1 for the model's repository state (UNAVAILABLE, LOADING, READY, UNLOADING)",
            labels=["model", "state"],
        )
        loads = CounterMetricFamily(
            "model_runtime_model_loads",
            "Model versions loaded (outcome=success) and loads that failed (outcome=failure)",
            labels=["model", "outcome"],
        )
        for m in self._metrics.models:
            for st in ModelState:
                state.add_metric([m.model, st.value], 1.0 if st is m.state else 0.0)
            loads.add_metric([m.model, "success"], float(m.loads))
            loads.add_metric([m.model, "failure"], float(m.load_failures))
        yield state
        yield loads


class _ReplicaCollector(Collector):
    def __init__(self, metrics: DaemonMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        snaps = self._metrics.snapshot
        labels = ["model", "replica"]
        state = GaugeMetricFamily(
            "model_runtime_replica_state",
            "1 for the replica's current state (starting, ready, resetting, failed, stopped)",
            labels=[*labels, "device", "state"],
        )
        counters = {
            "runs": "Main-program runs (batches) the replica has executed",
            "resets": "Device resets of the replica",
            "restarts": "Actor restarts of the replica",
            "retries": "Requests retried after a reset",
        }
        families = {
            name: GaugeMetricFamily(f"model_runtime_replica_{name}", doc, labels=labels)
            for name, doc in counters.items()
        }
        mean = GaugeMetricFamily(
            "model_runtime_replica_mean_duration_microseconds",
            "Mean duration of each request phase (request, preparation, queue, computation)",
            labels=[*labels, "phase"],
        )
        count = GaugeMetricFamily(
            "model_runtime_replica_recorded_requests",
            "Requests recorded in the replica's statistics, per phase",
            labels=[*labels, "phase"],
        )
        for s in snaps:
            base = [s.model, str(s.replica)]
            device = "" if s.device is None else str(s.device)
            for st in ReplicaStatus:
                state.add_metric([*base, device, st.value], 1.0 if st is s.status else 0.0)
            for name, value in s.counters.items():
                families[name].add_metric(base, float(value))
            for key, us in s.mean_us.items():
                mean.add_metric([*base, phase_of(key)], us)
            for key, n in s.count.items():
                count.add_metric([*base, phase_of(key)], n)
        yield state
        yield from families.values()
        yield mean
        yield count


def phase_of(key: str) -> str:
    """The request phase a runner statistics key is about (``read_queue_..._mean_us`` ->
    ``read_queue``)."""
    for marker in ("_monitoring_statistics", "_duration"):
        if marker in key:
            return key.split(marker, 1)[0]
    return key


class DaemonMetrics:
    """Every metric of one daemon."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "model_runtime_requests",
            "Inference requests answered, by outcome (success/failure) and failure reason",
            ["model", "outcome", "reason"],
            registry=r,
        )
        self.inferences = Counter(
            "model_runtime_inferences", "Samples inferred successfully", ["model"], registry=r
        )
        self.duration = Histogram(
            "model_runtime_request_duration_seconds",
            "Inference request duration at the HTTP front end",
            ["model"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.pending = Gauge(
            "model_runtime_pending_requests", "Inference requests in flight", ["model"], registry=r
        )
        self.model_ready = Gauge(
            "model_runtime_model_ready", "1 while the model serves requests", ["model"], registry=r
        )
        self.draining = Gauge("model_runtime_draining", "1 while the daemon drains", registry=r)
        self.readiness_changes = Counter(
            "model_runtime_model_readiness_changes",
            "Times a model became ready (ready=true) or not ready (ready=false)",
            ["model", "ready"],
            registry=r,
        )
        self.snapshot: list[ReplicaSnapshot] = []
        self.models: list[ModelSnapshot] = []
        self._children: dict[str, tuple[Any, Any, Any]] = {}
        r.register(_ReplicaCollector(self))
        r.register(_ModelCollector(self))

    def readiness_changed(self, model: str, ready: bool) -> None:
        """Count one readiness change of ``model``."""
        self.readiness_changes.labels(model, "true" if ready else "false").inc()

    def observe(self, model: str, reason: str | None, seconds: float, samples: int) -> None:
        """Count one finished inference request (``reason`` None means success)."""
        children = self._children.get(model)
        if children is None:
            children = self._children[model] = (
                self.requests.labels(model, "success", ""),
                self.inferences.labels(model),
                self.duration.labels(model),
            )
        ok, inferences, duration = children
        if reason is None:
            ok.inc()
            inferences.inc(samples)
        else:
            self.requests.labels(model, "failure", reason).inc()
        duration.observe(seconds)

    async def refresh(self, repository: ModelRepository) -> None:
        """Read replica facts and statistics from every loaded runner."""
        snaps: list[ReplicaSnapshot] = []
        entries = repository.entries()
        self.models = [ModelSnapshot(e.name, e.state, e.loads, e.load_failures) for e in entries]
        for entry in entries:
            self.model_ready.labels(entry.name).set(1.0 if entry.is_ready else 0.0)
            runner = entry.runner
            if runner is None:
                continue
            for r, status in enumerate(runner.replica_status()):
                device, counters = replica_counters(runner, r)
                snap = ReplicaSnapshot(entry.name, r, status, device, counters)
                snap.mean_us = await read_statistics(runner.get_monitoring_statistics_mean, r)
                snap.count = await read_statistics(runner.get_monitoring_statistics_total_count, r)
                snaps.append(snap)
        self.snapshot = snaps

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)


async def read_statistics(fn: Any, replica: int) -> dict[str, float]:
    """``await fn(replica)`` (a runner statistics method) as floats; empty when unavailable."""
    try:
        async with asyncio.timeout(_STATS_TIMEOUT):
            result: Mapping[str, float] = await fn(replica)
    except (ModelRuntimeError, TimeoutError):  # a replica stopping, or a stuck actor
        return {}
    return {str(k): float(v) for k, v in result.items()}

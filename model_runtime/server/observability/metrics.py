"""Prometheus metrics of one daemon (its own ``CollectorRegistry``, never the global one).

Triton's metrics, under Triton's names and labels (``model``, ``version``), as Triton exposes
them (counters without a ``_total`` suffix, durations as cumulative microsecond counters):
``nv_inference_request_success``, ``nv_inference_request_failure``, ``nv_inference_count``
(samples), ``nv_inference_exec_count`` (batches run), ``nv_inference_request_duration_us``,
``nv_inference_queue_duration_us``, ``nv_inference_compute_input_duration_us``,
``nv_inference_compute_infer_duration_us``, ``nv_inference_compute_output_duration_us`` and the
gauge ``nv_inference_pending_request_count``. Their totals live here, per (model, version), not
in a runner: a reload replaces the runner and the totals go on (:class:`TritonTotals`, and
their text under Triton's names, in :mod:`.totals`).
``nv_inference_request_failure`` has Triton's ``reason`` label; a model's ``metric_tags`` are
labels of each of its series, named ``_KEY`` (Triton's prefix: they never shadow its own). With
a response cache, a model that uses it has ``nv_cache_num_hits_per_model``,
``nv_cache_num_misses_per_model``, ``nv_cache_hit_duration_per_model`` and
``nv_cache_miss_duration_per_model`` (microseconds). ``--metrics-config`` selects summaries,
the first-response histogram and the duration counters (:mod:`.families`); the CPU's
``nv_cpu_*`` are read at each scrape (:mod:`.cpu`).

Ours (``model_runtime_*``): requests by outcome and reason, a duration histogram, replica state,
device, batches, resets, restarts, retries and poisoned requests, repository state and loads,
readiness changes, draining; python models' instance restarts and their own custom metric
families (:mod:`.python_models`); and the process collector's ``process_*`` metrics.

Request outcomes, inference counts, durations and pending requests are counted by the front
ends (HTTP, gRPC) as requests finish. Replica facts (state, device, batches run, resets,
restarts, queue and compute durations) are read from each runner, and model facts (repository
state, versions loaded, loads failed) from the repository, when ``/metrics`` is scraped: the
handler awaits :meth:`DaemonMetrics.refresh`, then renders; collection itself never awaits.
Runner facts become totals by difference with the previous read of the same runner (a new
runner starts from zero); the queue and compute microseconds of the requests counted since
then are their count times the replica's current mean (the runner keeps means over a bounded
window of requests, not sums). A runner about to close (swapped out by a reload, or unloaded)
is read one last time (:meth:`DaemonMetrics.retire_runner`, the repository's ``on_retire``),
so what it ran since the last scrape is counted too.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from model_runtime.server.observability.collectors import (
    ModelCollector,
    ModelSnapshot,
    ReplicaCollector,
    ReplicaSnapshot,
    SequenceCollector,
    phase_of,
)
from model_runtime.server.observability.cpu import CpuMetrics
from model_runtime.server.observability.families import (
    Latencies,
    MetricsConfig,
    render_latencies,
    triton_reason,
)
from model_runtime.server.observability.python_models import python_models_text
from model_runtime.server.observability.runner_reads import (
    Mark,
    batch_size,
    delta,
    memory_of,
    read_statistics,
    replica_counters,
    runs_by_size,
)
from model_runtime.server.observability.totals import (
    BatchTotals,
    TritonTotals,
    labels_of,
    triton_text,
)
from model_runtime.server.repository.entries import ModelEntry
from model_runtime.server.repository.repository import ModelRepository
from model_runtime.server.serving import innermost, replica_states
from model_runtime.server.triton.fields import histogram_buckets

__all__ = [
    "CONTENT_TYPE",
    "TRITON_PHASES",
    "BatchTotals",
    "DaemonMetrics",
    "TritonTotals",
    "phase_of",
]

#: The Prometheus text exposition content type.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

#: The runner's request phase (monitoring statistics key stem) behind each Triton duration;
#: ``output`` is a run's end to its outputs split back to their callers.
TRITON_PHASES = {
    "queue_duration_us": "read_queue",
    "compute_input_duration_us": "read_preparation",
    "compute_infer_duration_us": "computation",
    "compute_output_duration_us": "output",
}


class DaemonMetrics:
    """Every metric of one daemon."""

    def __init__(
        self,
        config: MetricsConfig | None = None,
        *,
        cpu: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``config``: ``--metrics-config`` (None: Triton's defaults); ``cpu``: serve
        ``nv_cpu_*`` (Triton's ``--allow-cpu-metrics``); ``clock``: the summaries' time."""
        self.config = config or MetricsConfig()
        self._clock = clock
        self._cpu = CpuMetrics() if cpu else None
        #: The daemon has a response cache (set by the data plane that owns one).
        self.cache = False
        #: Summaries and histogram per (model, version), when ``config`` asks for them.
        self.latencies: dict[tuple[str, str], Latencies] = {}
        self._timed = self.config.summary_latencies or self.config.histogram_latencies
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
        self.nv_pending = Gauge(
            "nv_inference_pending_request_count",
            "Instantaneous number of pending requests awaiting execution per model",
            ["model", "version"],
            registry=r,
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
        #: ``ModelRunner.memory`` of every loaded (model, version) at the last scrape, less
        #: the per-replica part (in the replicas' snapshots).
        self.model_memory: dict[tuple[str, str], dict[str, int]] = {}
        #: ((model, version), its live sequences) of every stateful model at the last scrape.
        self.sequences: list[tuple[tuple[str, str], Any]] = []
        #: Triton's totals per (model, version): they outlive reloads (see the module doc).
        self.triton: dict[tuple[str, str], TritonTotals] = {}
        #: (model, version, runner) of every loaded version at the last scrape: python
        #: models' custom metrics and restarts are read from them (:mod:`.python_models`).
        self.python_runners: list[tuple[str, str, Any]] = []
        #: The last read of each runner of a (model, version), by ``id`` of the runner (a mark
        #: holds its runner, so the id is not reused while it lives): during a reload the old
        #: runner and the new one are both read.
        self._marks: dict[tuple[str, str], dict[int, Mark]] = {}
        self._children: dict[str, tuple[Any, Any, Any, Any]] = {}  # see _success_counts
        #: Requests in flight by (model, version) (:meth:`request_started`).
        self._pending: dict[tuple[str, str], int] = {}
        r.register(ReplicaCollector(self))
        r.register(ModelCollector(self))
        r.register(SequenceCollector(self))
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)

    def readiness_changed(self, model: str, ready: bool) -> None:
        """Count one readiness change of ``model``."""
        self.readiness_changes.labels(model, "true" if ready else "false").inc()

    def totals(self, model: str, version: str = "1") -> TritonTotals:
        """The Triton totals of ``model`` ``version`` (created at zero)."""
        key = (model, version)
        t = self.triton.get(key)
        if t is None:
            t = self.triton[key] = TritonTotals()
        return t

    def request_started(self, model: str, version: str = "1") -> None:
        """Count one request in flight (``model_runtime_pending_requests``, Triton's pending)."""
        key = (model, version)
        pending = self._pending
        n = pending.get(key)
        if n is None:
            n = self._pending_gauges(key)
        pending[key] = n + 1

    def request_finished(self, model: str, version: str = "1", count: int = 1) -> None:
        """Count one request (or ``count``) no longer in flight (see :meth:`request_started`)."""
        self._pending[(model, version)] -= count

    def _pending_gauges(self, key: tuple[str, str]) -> int:
        """The gauges of ``key``'s requests in flight, read from the counts when scraped (an
        int per request, not two gauges' locks). Returns its count (0)."""
        model, version = key
        pending = self._pending
        pending[key] = 0
        self.nv_pending.labels(model, version).set_function(lambda: pending.get(key, 0))
        self.pending.labels(model).set_function(
            lambda: sum(n for (m, _), n in list(pending.items()) if m == model)
        )
        return 0

    def observe(
        self, model: str, reason: str | None, seconds: float, samples: int, version: str = "1"
    ) -> None:
        """Count one finished inference request (``reason`` None means success)."""
        key = (model, version)
        t = self.triton.get(key)
        if t is None:
            t = self.totals(model, version)
        if reason is None:
            t.request_success += 1
            t.count += samples
            t.request_duration_us += seconds * 1e6
            if self._timed:
                lat = self._latencies(model, version)
                lat.windows["request"].observe(seconds * 1e6, self._clock())
                lat.first_response(seconds * 1e3)
        else:
            t.request_failure += 1
            failure = triton_reason(reason)
            t.failures[failure] = t.failures.get(failure, 0) + 1
        children = self._children.get(model)
        if children is None:
            children = self._children[model] = self._success_counts(model)
        ok, inferences, duration, _ = children
        if reason is None:
            ok(1)
            inferences(samples)
        else:
            self.requests.labels(model, "failure", reason).inc()
        duration(seconds)

    def observe_ok(self, model: str, version: str, seconds: list[float], samples: int) -> None:
        """Count finished inference requests of ``model`` that succeeded, as :meth:`observe`
        counts each: ``seconds`` each took, ``samples`` in all."""
        key = (model, version)
        t = self.triton.get(key)
        if t is None:
            t = self.totals(model, version)
        t.request_success += len(seconds)
        t.count += samples
        for s in seconds:
            t.request_duration_us += s * 1e6
        if self._timed:
            lat = self._latencies(model, version)
            window = lat.windows["request"]
            for s in seconds:
                window.observe(s * 1e6, self._clock())
                lat.first_response(s * 1e3)
        children = self._children.get(model)
        if children is None:
            children = self._children[model] = self._success_counts(model)
        ok, inferences, _, durations = children
        ok(len(seconds))
        inferences(samples)
        durations(seconds)

    def _success_counts(self, model: str) -> tuple[Any, Any, Any, Any]:
        """What counts a request of ``model`` (its success, samples, duration, and the
        durations of several), as each metric's own ``inc``/``observe`` count (the same
        values), without their checks per call (which cannot fail here: no exemplar, amounts
        >= 0) when prometheus_client keeps its values where 0.20 does; several durations
        count each bucket they fall in once, by their number."""
        ok = self.requests.labels(model, "success", "")
        inferences = self.inferences.labels(model)
        duration = self.duration.labels(model)
        try:
            bounds = list(duration._upper_bounds)
            buckets = [b.inc for b in duration._buckets]
            total = duration._sum.inc
            ok_inc, inferences_inc = ok._value.inc, inferences._value.inc
        except AttributeError:  # another layout: the public methods
            return ok.inc, inferences.inc, duration.observe, _each(duration.observe)
        if len(bounds) != len(buckets) or not bounds or bounds[-1] != float("inf"):
            return ok.inc, inferences.inc, duration.observe, _each(duration.observe)
        find = bisect.bisect_left

        def observe(seconds: float) -> None:
            total(seconds)
            buckets[find(bounds, seconds)](1)  # the first bound >= seconds, as observe()

        def observe_all(seconds: list[float]) -> None:
            if len(seconds) == 1:
                observe(seconds[0])
                return
            counts: dict[int, int] = {}
            for s in seconds:
                total(s)  # (one by one: the sum adds them in the same order)
                i = find(bounds, s)
                counts[i] = counts.get(i, 0) + 1
            for i, n in counts.items():
                buckets[i](n)

        return ok_inc, inferences_inc, observe, observe_all

    def _latencies(self, model: str, version: str) -> Latencies:
        lat = self.latencies.get((model, version))
        if lat is None:
            lat = self.latencies[(model, version)] = Latencies()
        return lat

    def cache_lookup(self, model: str, version: str, hit: bool, ns: int) -> None:
        """Count one response cache lookup of ``model`` ``version`` that took ``ns`` (a miss:
        its lookup and its insertion)."""
        t = self.totals(model, version)
        us = ns / 1000
        if hit:
            t.cache_hits += 1
            t.cache_hit_us += us
        else:
            t.cache_misses += 1
            t.cache_miss_us += us
        if self.config.summary_latencies:
            phase = "cache_hit" if hit else "cache_miss"
            self._latencies(model, version).windows[phase].observe(us, self._clock())

    def configure(self, entry: ModelEntry) -> None:
        """Take what ``entry``'s config says of its metrics: whether it uses the response
        cache, its ``metric_tags``, its histogram's buckets (``model_metrics``)."""
        if entry.settings is None:
            return
        config = entry.settings.config
        totals = self.totals(entry.name, entry.version)
        totals.cache_enabled = config.response_cache.enable
        totals.tags = tuple(sorted(config.metric_tags.items()))
        if self.config.histogram_latencies:
            self._latencies(entry.name, entry.version).set_edges(histogram_buckets(config))

    async def refresh(self, repository: ModelRepository) -> None:
        """Read replica facts and statistics from every loaded runner."""
        snaps: list[ReplicaSnapshot] = []
        self.model_memory = {}
        entries = repository.entries()
        self.models = [ModelSnapshot(e.name, e.state, e.loads, e.load_failures) for e in entries]
        tables = {(e.name, e.version): e.sequences for e in entries if e.sequences is not None}
        self.sequences = sorted(tables.items(), key=lambda item: item[0])
        self.python_runners = [
            (e.name, e.version, innermost(e.runner)) for e in entries if e.runner is not None
        ]
        for entry in entries:
            self.configure(entry)
            self.model_ready.labels(entry.name).set(1.0 if entry.is_ready else 0.0)
            snaps += await self.read_runner(entry.name, entry.version, entry.runner)
        self.snapshot = snaps

    async def read_runner(self, model: str, version: str, runner: Any) -> list[ReplicaSnapshot]:
        """Read one model version's runner: its replicas now, and what it ran since the last
        read added to the version's :class:`TritonTotals` (never raises; None: nothing)."""
        if runner is None:
            return []
        key = (model, version)
        current = innermost(runner)  # a ServingRunner swaps it on reload
        marks = self._marks.setdefault(key, {})
        mark = marks.get(id(current))
        if mark is None or mark.runner is not current:
            mark = marks[id(current)] = Mark(current)  # a new runner counts from zero
        totals = self.totals(model, version)
        batch = batch_size(current)
        memory = memory_of(current)
        replica_memory = memory.pop("replicas", [])
        if memory:
            self.model_memory[key] = memory
        snaps = []
        for r, status in enumerate(runner.replica_status()):
            device, counters = replica_counters(runner, r)
            snap = ReplicaSnapshot(model, r, status, device, counters)
            if r < len(replica_memory):
                snap.memory = replica_memory[r]
            snap.mean_us = await read_statistics(runner.get_monitoring_statistics_mean, r)
            snap.count = await read_statistics(runner.get_monitoring_statistics_total_count, r)
            snaps.append(snap)
            runs = counters.get("runs", 0)
            executions = int(delta(runs, mark.runs.get(r, 0)))
            totals.exec_count += executions
            mark.runs[r] = runs
            mean = {phase_of(k): v for k, v in snap.mean_us.items()}
            count = {phase_of(k): v for k, v in snap.count.items()}
            if executions:
                states = replica_states(runner)
                state = states[r] if r < len(states) else None
                for size, runs_of in runs_by_size(mark, r, state, batch, executions).items():
                    b = totals.batches.get(size)
                    if b is None:
                        b = totals.batches[size] = BatchTotals()
                    b.count += runs_of
                    b.compute_input_us += runs_of * mean.get("read_preparation", 0.0)
                    b.compute_infer_us += runs_of * mean.get("computation", 0.0)
                    b.compute_output_us += runs_of * mean.get("output", 0.0)
            for name, phase in TRITON_PHASES.items():
                if phase not in count:
                    continue
                n = count[phase]
                added = delta(n, mark.counts.get((r, phase), 0.0))
                mark.counts[(r, phase)] = n
                setattr(totals, name, getattr(totals, name) + added * mean.get(phase, 0.0))
                totals.recorded[name] = totals.recorded.get(name, 0) + int(added)
                if added > 0 and self.config.summary_latencies:
                    window = self._latencies(model, version).windows[name[: -len("_duration_us")]]
                    window.observe(mean.get(phase, 0.0), self._clock(), int(added))
        return snaps

    async def retire_runner(self, model: str, version: str, runner: Any) -> None:
        """Read a runner of ``model`` ``version`` that is about to close one last time (what
        it ran since the last read reaches the totals), then forget it (never raises)."""
        await self.read_runner(model, version, runner)
        marks = self._marks.get((model, version))
        if marks is not None:
            marks.pop(id(innermost(runner)), None)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        lines = triton_text(self.triton, self.config, self.cache)
        if self._timed:

            def labels(model: str, version: str) -> str:
                return labels_of(model, version, self.totals(model, version))

            def cached(model: str, version: str) -> bool:
                return self.cache and self.totals(model, version).cache_enabled

            lines += render_latencies(self.config, self.latencies, labels, cached, self._clock())
        if self._cpu is not None:
            lines += self._cpu.lines()
        return (
            generate_latest(self.registry)
            + ("\n".join(lines) + "\n").encode()
            + python_models_text(self.python_runners)
        )


def _each(observe: Callable[[float], None]) -> Callable[[list[float]], None]:
    """``observe`` called for each of a list of values."""

    def observe_all(values: list[float]) -> None:
        for v in values:
            observe(v)

    return observe_all

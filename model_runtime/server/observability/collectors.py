"""The daemon's Prometheus collectors that read state when ``/metrics`` is scraped (see
:mod:`model_runtime.server.observability.metrics`): the repository's models (state, loads),
stateful models'
sequences, and each replica (state, device, batches, resets, memory, phase means) from the
snapshots the daemon's metrics took at the scrape (:class:`Scraped`). Collection never awaits."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from actors.session.state import ReplicaStatus
from model_runtime.server.repository.entries import ModelState

__all__ = [
    "ModelCollector",
    "ModelSnapshot",
    "ReplicaCollector",
    "ReplicaSnapshot",
    "Scraped",
    "SequenceCollector",
    "phase_of",
]


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
    #: Bytes the replica adds beside what its model shares (``ModelRunner.memory``).
    memory: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ModelSnapshot:
    """What one model of the repository looked like at the last scrape."""

    model: str
    state: ModelState
    loads: int
    load_failures: int


class Scraped(Protocol):
    """What the collectors read: the snapshots of the last scrape
    (:class:`~model_runtime.server.observability.metrics.DaemonMetrics` takes them)."""

    snapshot: list[ReplicaSnapshot]
    models: list[ModelSnapshot]
    model_memory: dict[tuple[str, str], dict[str, int]]
    sequences: list[tuple[tuple[str, str], Any]]


def phase_of(key: str) -> str:
    """The request phase a runner statistics key is about (``read_queue_..._mean_us`` ->
    ``read_queue``)."""
    for marker in ("_monitoring_statistics", "_duration"):
        if marker in key:
            return key.split(marker, 1)[0]
    return key


class ModelCollector(Collector):
    def __init__(self, metrics: Scraped) -> None:
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
        memory = GaugeMetricFamily(
            "model_runtime_model_memory_bytes",
            "Memory a loaded model version holds: kind=weights, the executable's tensors; "
            "kind=sessions, the onnxruntime sessions its replicas share (an estimate: the "
            "process's growth while each was built)",
            labels=["model", "version", "kind"],
        )
        for (model, version), kinds in sorted(self._metrics.model_memory.items()):
            for kind, value in kinds.items():
                memory.add_metric([model, version, kind], float(value))
        yield state
        yield loads
        yield memory


class SequenceCollector(Collector):
    """Stateful models' sequences (:mod:`model_runtime.sequences`), per model version."""

    def __init__(self, metrics: Scraped) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        live = GaugeMetricFamily(
            "model_runtime_sequences_live",
            "Sequences live now, each holding one of the model's sequence slots",
            labels=["model", "version"],
        )
        slots = GaugeMetricFamily(
            "model_runtime_sequence_slots",
            "The model's sequence slots",
            labels=["model", "version"],
        )
        waiting = GaugeMetricFamily(
            "model_runtime_sequences_waiting",
            "New sequences waiting for a free slot (Triton's backlog)",
            labels=["model", "version"],
        )
        counters = {
            "started": "Sequences started (a request with sequence_start)",
            "ended": "Sequences ended (a request with sequence_end that succeeded)",
            "released_idle": "Sequences released after max_sequence_idle_microseconds idle",
            "restarted": "Live sequences ended early by a new START of the same id",
            "steps": "Steps run (requests of a sequence)",
            "failed_steps": "Steps that failed (the sequence's state stayed as it was)",
            "restored": "Steps of sequences that outlived a fault (on any of the model's "
            "replicas) since their previous step, going on from the state kept on the host",
        }
        families = {
            name: CounterMetricFamily(
                f"model_runtime_sequence_{name}", doc, labels=["model", "version"]
            )
            for name, doc in counters.items()
        }
        for (model, version), table in self._metrics.sequences:
            labels = [model, version]
            live.add_metric(labels, float(table.live))
            slots.add_metric(labels, float(table.config.slots))
            waiting.add_metric(labels, float(table.waiting))
            for name, family in families.items():
                family.add_metric(labels, float(getattr(table.counts, name)))
        yield live
        yield slots
        yield waiting
        yield from families.values()


class ReplicaCollector(Collector):
    def __init__(self, metrics: Scraped) -> None:
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
            "poisoned": "Requests answered with an input error after their batch was bisected",
            "standby": "1 for a replica past the host's cores: its device would compute on "
            "cores the event loop and the other replicas use, so while the model's batches are "
            "light it serves only when no other replica is in service",
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
        memory = GaugeMetricFamily(
            "model_runtime_replica_memory_bytes",
            "Memory a replica adds beside what its model shares: kind=session, an onnxruntime "
            "session of its own (0 when it runs the model's shared one); kind=state, its "
            "variables and fed weights",
            labels=[*labels, "kind"],
        )
        for s in snaps:
            base = [s.model, str(s.replica)]
            for kind, value in s.memory.items():
                memory.add_metric([*base, kind], float(value))
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
        yield memory

"""What a :class:`~model_runtime.runner.ModelRunner` tells about its model and replicas: the
descriptions of its inputs and outputs, its memory, its replicas' status and readiness, and the
seed's monitoring statistics (``RunnerInfo``, a base of ``ModelRunner``)."""

from __future__ import annotations

from typing import Any

from actors.clock import Clock
from actors.session.state import ReplicaState, ReplicaStatus
from model_runtime.errors import InputValidationError, RunnerStoppedError
from model_runtime.executable import Executable
from model_runtime.io import DataDesc, describe_anchor
from model_runtime.replicas import ReplicaSet
from model_runtime.stats import StatisticsView

__all__ = ["RunnerInfo"]


class RunnerInfo:
    """The read-only side of a runner (the state it reads is the runner's own)."""

    _exe: Executable | None
    _replicas: ReplicaSet | None
    _clock: Clock
    _accepting: bool

    @property
    def _executable(self) -> Executable:
        if self._exe is None:
            raise RunnerStoppedError("the runner has not been started")
        return self._exe

    @property
    def executable(self) -> Executable:
        """The executable this runner runs."""
        return self._executable

    def get_execute_inputs(self) -> list[DataDesc]:
        """Inputs ``execute`` takes (one batch's shapes)."""
        return [describe_anchor(a) for a in self._executable.metadata.user_inputs]

    def get_execute_outputs(self) -> list[DataDesc]:
        """Outputs ``execute`` returns (one batch's shapes)."""
        return [describe_anchor(a) for a in self._executable.metadata.execute_outputs]

    def get_model_inputs(self) -> list[DataDesc]:
        """Every input of the model: execute inputs plus weights and variables loaded once."""
        meta = self._executable.metadata
        return [describe_anchor(a) for a in meta.anchors if a.type.value == "INPUT"]

    def get_model_outputs(self) -> list[DataDesc]:
        """Every output of the model."""
        meta = self._executable.metadata
        return [describe_anchor(a) for a in meta.anchors if a.type.value == "OUTPUT"]

    def memory(self) -> dict[str, Any]:
        """What the model holds in memory, in bytes (issue 34): ``weights``, the executable's
        tensors; ``sessions``, what building the onnxruntime sessions its replicas share added
        to the process (an estimate, counted once however many replicas share them); and
        ``replicas``, per replica what it adds beside those (``session``: a session of its
        own, 0 when it runs a shared one; ``state``: its variables and fed weights)."""
        weights = self._exe.total_tensor_bytes() if self._exe is not None else 0
        if self._replicas is None:
            return {"weights": weights, "sessions": 0, "replicas": []}
        sessions, replicas = self._replicas.memory()
        return {"weights": weights, "sessions": sessions, "replicas": replicas}

    def replica_status(self) -> list[ReplicaStatus]:
        """The status of every replica."""
        return [s.status for s in self.replica_states()]

    def replica_states(self) -> list[ReplicaState]:
        """Every replica's live state (status, device, runs, resets); read, do not modify."""
        return [] if self._replicas is None else list(self._replicas.states)

    @property
    def is_ready(self) -> bool:
        """True while at least one replica takes requests (in service, no run past its
        execution deadline)."""
        now = self._clock.monotonic()
        return self._accepting and any(s.is_ready_at(now) for s in self.replica_states())

    async def _stats(self, replica_id: int) -> StatisticsView:
        states = self.replica_states()
        if not 0 <= replica_id < len(states):
            raise InputValidationError(f"replica_id {replica_id} is out of range")
        assert self._replicas is not None
        return StatisticsView(self._replicas.queues[replica_id].stats())

    async def get_time_trace(self, replica_id: int = 0, cur: int = -1) -> dict[str, float]:
        """Durations (µs) of a request on ``replica_id`` (seed key names): the last one, or the
        ``cur``-th of the buffered ones (Python indexing: -1 last, 0 oldest).

        Raises:
            InputValidationError: ``replica_id`` or ``cur`` is out of range.
        """
        return (await self._stats(replica_id)).time_trace(cur)

    async def get_monitoring_statistics_percentile(
        self, quantile: float = 0.9, replica_id: int = 0
    ) -> dict[str, float]:
        """Latency percentiles (µs) of the recorded requests (seed key names)."""
        return (await self._stats(replica_id)).percentile(quantile)

    async def get_monitoring_statistics_mean(self, replica_id: int = 0) -> dict[str, float]:
        """Mean latencies (µs) of the recorded requests (seed key names)."""
        return (await self._stats(replica_id)).mean()

    async def get_monitoring_statistics_total_count(self, replica_id: int = 0) -> dict[str, float]:
        """Number of requests recorded per phase (seed key names)."""
        return (await self._stats(replica_id)).total_count()

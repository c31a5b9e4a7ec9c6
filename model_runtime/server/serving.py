"""The runner a served model answers with: what the daemon needs of a runner
(:class:`RunnerLike`), how one is made, and :class:`ServingRunner`, the stable object the HTTP
layer holds while reloads swap the runner behind it."""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from actors.session.state import ReplicaStatus
from model_runtime.io import DataDesc
from model_runtime.runner_config import ModelRunnerConfig
from model_runtime.sequences import SequenceStep

__all__ = [
    "RunnerFactory",
    "RunnerLike",
    "ServingRunner",
    "default_factory",
    "innermost",
    "replica_states",
]


def replica_states(runner: object) -> list[Any]:
    """The runner's per-replica state objects (status, device_id, runs, resets, ``changed``
    event); [] for a runner without replicas (a test's stand-in)."""
    fn = getattr(runner, "replica_states", None)
    return list(fn()) if callable(fn) else []


def innermost(runner: object) -> object:
    """The runner that does the work behind ``runner``: wrappers (a :class:`ServingRunner`, a
    reshaping boundary) hold theirs in ``current``."""
    while (inner := getattr(runner, "current", None)) is not None:
        runner = inner
    return runner


class RunnerLike(Protocol):
    """What the daemon needs from a :class:`model_runtime.runner.ModelRunner`."""

    async def start(self) -> None: ...
    async def close(self) -> None: ...
    async def execute(
        self,
        inputs: Mapping[str, np.ndarray],
        outputs: Mapping[str, np.ndarray] | None = None,
        replica_id: int | None = None,
        timeout: float | None = None,
        priority: int = 0,
    ) -> dict[str, np.ndarray]: ...
    def get_execute_inputs(self) -> list[DataDesc]: ...
    def get_execute_outputs(self) -> list[DataDesc]: ...
    def replica_status(self) -> list[ReplicaStatus]: ...
    @property
    def is_ready(self) -> bool: ...
    async def get_monitoring_statistics_total_count(
        self, replica_id: int = 0
    ) -> dict[str, float]: ...
    async def get_monitoring_statistics_mean(self, replica_id: int = 0) -> dict[str, float]: ...


#: Builds a (not yet started) runner for an executable file.
RunnerFactory = Callable[[Path, ModelRunnerConfig], RunnerLike]


def default_factory(path: Path, config: ModelRunnerConfig) -> RunnerLike:
    from model_runtime.runner import ModelRunner  # the runner sits above the server's imports

    return ModelRunner(path, config)


class ServingRunner:
    """The runner a loaded model serves with now, as one stable object for the HTTP layer.

    A reload assigns :attr:`current`. :meth:`execute` reads it and hands the request to that
    runner's queue without an ``await`` in between (a runner enqueues synchronously on its
    first step), so the swap can never fall between choosing a version and reaching it: a
    request is either taken by the old version (which drains it before closing) or by the new.

    Raises:
        nothing of its own: every call is the current runner's.
    """

    __slots__ = ("current",)

    def __init__(self, runner: RunnerLike) -> None:
        self.current = runner

    async def start(self) -> None:
        """Start the current runner (a loaded model's runner is already started)."""
        await self.current.start()

    async def close(self) -> None:
        """Close the current runner."""
        await self.current.close()

    def execute(
        self,
        inputs: Mapping[str, np.ndarray],
        outputs: Mapping[str, np.ndarray] | None = None,
        replica_id: int | None = None,
        timeout: float | None = None,
        priority: int = 0,
        sequence: SequenceStep | None = None,
    ) -> Coroutine[Any, Any, dict[str, np.ndarray]]:
        """The current runner's ``execute`` (no frame of its own on the hot path); a step of
        a ``sequence`` for a stateful model's runner (:mod:`model_runtime.sequences`)."""
        if sequence is None:
            return self.current.execute(inputs, outputs, replica_id, timeout, priority)
        return self.current.execute(  # type: ignore[call-arg]
            inputs, outputs, replica_id, timeout, priority, sequence=sequence
        )

    def get_execute_inputs(self) -> list[DataDesc]:
        """The current runner's inputs."""
        return self.current.get_execute_inputs()

    def get_execute_outputs(self) -> list[DataDesc]:
        """The current runner's outputs."""
        return self.current.get_execute_outputs()

    def replica_status(self) -> list[ReplicaStatus]:
        """The current runner's replica statuses."""
        return self.current.replica_status()

    def replica_states(self) -> list[Any]:
        """The current runner's replica state objects (see :func:`replica_states`)."""
        return replica_states(self.current)

    @property
    def is_ready(self) -> bool:
        """True while the current runner has a ready replica."""
        return self.current.is_ready

    async def get_monitoring_statistics_total_count(self, replica_id: int = 0) -> dict[str, float]:
        """The current runner's request counts per phase."""
        return await self.current.get_monitoring_statistics_total_count(replica_id)

    async def get_monitoring_statistics_mean(self, replica_id: int = 0) -> dict[str, float]:
        """The current runner's mean durations per phase."""
        return await self.current.get_monitoring_statistics_mean(replica_id)

"""One replica's runs on its device: each main run bounded by its execution deadline, its time
measured, its answer handed to the queue.

:class:`DeviceRuns` is the ground floor of the session actor: it holds the session's state
(the replica's :class:`~actors.session.state.ReplicaState`, the policy, the runs on the device)
and runs one batch's inputs on the Device (:meth:`DeviceRuns._run_main`), inline when the
device runs it on the loop, else watched by one hang timer for every run in flight (a run past
its deadline fails with :class:`ExecutionTimeoutError`). With no ``execution_timeout`` the
deadline is derived from recent runs (:class:`RunTimes`). A run that succeeds is counted by the
progress rule and folded into the replica's measured seconds per sample.
:mod:`.recovery` and :mod:`.actor` build on it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import numpy as np
from anyio.streams.memory import MemoryObjectReceiveStream

from actors.actor import Actor, ActorRef
from actors.clock import Clock, move_on_after
from actors.device.actor import Device
from actors.device.messages import RunMain
from actors.queues.actor import Queue
from actors.queues.batch import Batch
from actors.queues.messages import Complete, Fail, Settle
from actors.queues.pool import Layout
from actors.queues.timer import FlushTimer
from actors.session.state import ReplicaState, ReplicaStatus
from model_runtime.errors import (
    ExecutionTimeoutError,
)

__all__ = ["DeviceRuns", "Outputs", "RunTimes", "SessionPolicy"]

Outputs = list[dict[str, np.ndarray]]


@dataclass(frozen=True, slots=True)
class SessionPolicy:
    """How a session reacts to device failures."""

    auto_reset: bool = False
    max_retries: int = 2
    #: Seconds a main run may take before it is a hang; None: derived from observed runs.
    execution_timeout: float | None = None
    reset_timeout: float = 30.0
    #: Faults in a row, each after a recovery that saw no successful batch, before the
    #: replica leaves service.
    max_failed_recoveries: int = 3
    #: Out of service: first probe after this many seconds, doubling up to ``probe_cap``.
    probe_initial: float = 1.0
    probe_cap: float = 10.0
    #: The derived execution deadline is never under this many seconds.
    deadline_floor: float = 1.0
    #: Batches handed to the device at once (1: strictly one after another).
    pipeline_depth: int = 2


@dataclass(slots=True)
class RunTimes:
    """Recent main-run durations, to derive the hang deadline when none is configured."""

    samples: deque[float] = field(default_factory=lambda: deque(maxlen=64))
    #: the largest of ``samples`` (kept as they come and go: no scan per run)
    slowest: float = 0.0

    def add(self, seconds: float) -> None:
        samples = self.samples
        evicted = samples[0] if len(samples) == samples.maxlen else None
        samples.append(seconds)
        if seconds >= self.slowest:
            self.slowest = seconds
        elif evicted == self.slowest:
            self.slowest = max(samples)

    def deadline(self, floor: float, first: float) -> float:
        # A hang is "no progress", not "slower than usual": 20x the slowest recent run,
        # never under the floor. Before any run (the warm-up itself) the reset timeout.
        if not self.samples:
            return first
        deadline = 20.0 * self.slowest
        return deadline if deadline > floor else floor  # (not max(): a call a batch)


class DeviceRuns(Actor[object]):
    """Runs a replica's batches on its device (see the module docstring)."""

    def __init__(
        self,
        *,
        replica: int,
        device: ActorRef[Any],
        queue: ActorRef[Any],
        ready: MemoryObjectReceiveStream[Batch],
        layout: Layout,
        state: ReplicaState,
        policy: SessionPolicy,
        clock: Clock | None = None,
        on_status: Callable[[int, ReplicaStatus], None] | None = None,
        on_progress: Callable[[], None] | None = None,
        reattach: Callable[[], Awaitable[None]] | None = None,
        stateful: bool = False,
    ) -> None:
        super().__init__(f"session-{replica}", clock=clock)
        self.log = self.log.bind(replica=replica)
        self.replica = replica
        self._device = device
        self._queue = queue
        self._ready = ready
        self._layout = layout
        self._state = state
        self._policy = policy
        self._times = RunTimes()
        self._on_status = on_status
        self._on_progress = on_progress
        self._reattach = reattach
        self._stateful = stateful
        #: Resets happen one at a time; the generation counts them (see _recover).
        self._reset_lock = anyio.Lock()
        self._generation = 0
        self._on_device = 0  # main runs asked of the device and not answered
        self._progressed = False  # a batch succeeded in this incarnation
        self._device_free_at = 0.0  # when the device last finished a batch (clock time)
        self._out = anyio.Event()  # set when the replica leaves service
        #: runs on the device -> (deadline, seconds), watched by _hang_timer once it runs
        self._runs: dict[asyncio.Future[Outputs], tuple[float, float]] = {}
        self._hang_timer = FlushTimer(self.clock, self._next_hang, self._on_hang)
        self._watching = False

    # -- one run on the device --------------------------------------------------------------------

    async def _run_main(
        self,
        inputs: Sequence[Mapping[str, np.ndarray]],
        probe: bool = False,
        into: tuple[dict[str, np.ndarray], ...] | None = None,
    ) -> Outputs:
        """One main run on the device, bounded by the execution deadline (clock time).

        Raises:
            ExecutionTimeoutError: the run passed its deadline (it may still be running).
            ActorStoppedError: the Device actor stopped.
            DeviceStateError, RuntimeFailure, InputValidationError: from the device.
        """
        deadline = self._deadline()
        state = self._state
        now = self.clock.monotonic()
        if self._on_device == 0:
            state.hung_after = now + deadline
        self._on_device += 1
        try:
            device = self._device.actor
            if not isinstance(device, Device):  # a stand-in device: through its mailbox
                async with move_on_after(self.clock, deadline) as scope:
                    outputs: Outputs = await self._device.ask(RunMain(tuple(inputs), probe, into))
                if scope.cancelled_caught:
                    raise self._past_deadline(deadline)
                return outputs
            future = device.run_main_nowait(tuple(inputs), probe, into)
            if future.done():  # it ran inline, on this loop: no hang to watch
                return future.result()
            if not self._watching:  # the warm-up, before the deadline timer runs
                async with move_on_after(self.clock, deadline) as scope:
                    return await future
                raise self._past_deadline(deadline)
            self._runs[future] = (now + deadline, deadline)
            if len(self._runs) == 1:
                self._hang_timer.kick()
            try:
                return await future
            finally:
                self._runs.pop(future, None)
        finally:
            self._on_device -= 1
            # The next run in the device's queue starts now.
            state.hung_after = self.clock.monotonic() + deadline if self._on_device else _INF

    def _deadline(self) -> float:
        if self._policy.execution_timeout is not None:
            return self._policy.execution_timeout
        return self._times.deadline(self._policy.deadline_floor, self._policy.reset_timeout)

    def _past_deadline(self, deadline: float) -> ExecutionTimeoutError:
        return ExecutionTimeoutError(
            f"replica {self.replica}: the main program ran past its deadline ({deadline:.3g} s)"
        )

    def _next_hang(self) -> float:
        """When the first run on the device passes its deadline (``inf``: nothing runs)."""
        first = _INF
        for at, _ in self._runs.values():  # (a run or two: a loop, not min() of a generator)
            if at < first:
                first = at
        return first

    def _on_hang(self) -> None:
        """Runs past their deadline fail with :class:`ExecutionTimeoutError` (the device goes
        on with them until the reset that the failure leads to aborts them)."""
        now = self.clock.monotonic()
        for future, (at, seconds) in list(self._runs.items()):
            if at <= now:
                del self._runs[future]
                if not future.done():
                    future.set_exception(self._past_deadline(seconds))

    # -- a run's outcome --------------------------------------------------------------------------

    def _succeeded(self, t_start: float, rows: int | None = None) -> None:
        state = self._state
        t_end = self.clock.monotonic()
        self._times.add(t_end - t_start)
        self._measure(t_end - t_start, rows)
        if state.fault_at is not None:
            state.recovery_times.append(t_end - state.fault_at)
            state.fault_at = None
        if state.recovering or not self._progressed:
            # The first good batch of this incarnation, or since a fault: restarts and
            # resets so far were recoveries, not failures.
            self._progressed = True
            state.recovering = False
            state.failed_recoveries = 0
            state.probe_delay = 0.0
            if self._on_progress is not None:
                self._on_progress()
        state.runs += 1

    def _measure(self, seconds: float, rows: int | None = None) -> None:
        """Fold one run's duration into the replica's measured seconds per sample (``rows``:
        the batch's real rows; a whole batch when not given)."""
        per_sample = seconds / (rows or self._layout.capacity)
        state = self._state
        if state.seconds_per_sample <= 0.0:
            state.seconds_per_sample = per_sample
        else:  # a moving average over about the last 32 batches
            state.seconds_per_sample += (per_sample - state.seconds_per_sample) / 32.0

    def _executed_size(self, batch: Batch) -> int:
        """The batch size ``batch`` ran at: its rows along the row axis (a bucket, or B)."""
        spec = self._layout.inputs[0]
        if spec.axis is None or not batch.inputs:
            return self._layout.B
        return int(batch.inputs[0][spec.name].shape[spec.axis])

    def _finish(self, batch: Batch, answer: Complete | Settle | Fail) -> None:
        queue = self._queue.actor
        if isinstance(queue, Queue):
            queue.answer_nowait(answer)
        else:
            self._queue.tell(answer)
        self._state.inflight.pop(batch.id, None)

    def _set_status(self, status: ReplicaStatus) -> None:
        self._state.set_status(status)
        if self._on_status is not None:
            self._on_status(self.replica, status)


_INF = float("inf")

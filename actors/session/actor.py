"""The Session actor: one replica's program lifecycle (load / main / save) and its batch loop.

The session binds one executable to one Device actor. Its background loop takes the next ready
batch from its Queue, asks the Device to run the main program (one thread hop per batch, inside
the device), and gives the outputs back to the Queue, which answers the callers. While the device
computes, the Queue packs the next batch (look-ahead).

Failures are classified the seed's way (``auto_reset``): an application runtime error, or a
recoverable error whose action is IPU_RESET, resets the device when ``auto_reset`` is on, and the
batch is retried (beyond the seed) up to ``max_retries``; every other failure answers the batch's
callers with the error. A run that passes ``execution_timeout`` is a hang: the device is reset
(terminating or abandoning the stuck run) and the batch retried.

State that must survive a restart of this actor (the batch in flight, the last saved variables,
the replica's health) lives in :class:`ReplicaState`, owned by the runner, not by the actor.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import numpy as np
from anyio.streams.memory import MemoryObjectReceiveStream

from actors.actor import Actor, ActorRef
from actors.clock import Clock
from actors.device.messages import Reset, RunMain, RunSave
from actors.queues.batch import Batch
from actors.queues.messages import Complete, Fail
from actors.session.state import ReplicaState, ReplicaStatus
from model_runtime.errors import (
    ActorStoppedError,
    ApplicationRuntimeError,
    DeviceStateError,
    ExecutionTimeoutError,
    RecoverableRuntimeError,
    RecoveryAction,
    RuntimeFailure,
    UnrecoverableRuntimeError,
)

__all__ = ["SaveVariables", "SessionActor", "SessionPolicy"]


@dataclass(frozen=True, slots=True)
class SessionPolicy:
    """How a session reacts to device failures."""

    auto_reset: bool = False
    max_retries: int = 2
    execution_timeout: float | None = None
    reset_timeout: float = 30.0
    reset_intensity: int = 5
    reset_period: float = 60.0
    #: Batches handed to the device at once (1: strictly one after another).
    pipeline_depth: int = 2


@dataclass(frozen=True, slots=True)
class SaveVariables:
    """Ask: run the save programs; answers {variable name: array} (also kept for resets)."""


@dataclass(slots=True)
class _RunTimes:
    """Recent main-run durations, to derive a hang deadline when none is configured."""

    samples: deque[float] = field(default_factory=lambda: deque(maxlen=64))

    def deadline(self) -> float:
        # Generous: a hang is "no progress", not "slower than usual". 50x the slowest recent
        # run, and never under 10 s, so a loaded 2-core machine does not see phantom hangs.
        if not self.samples:
            return 60.0
        return max(10.0, 50.0 * max(self.samples))


def is_resettable(exc: BaseException) -> bool:
    """The seed's auto_reset rule: application errors and IPU_RESET recoverable errors."""
    if isinstance(exc, RecoverableRuntimeError):
        return exc.recovery_action is RecoveryAction.IPU_RESET
    return isinstance(exc, ApplicationRuntimeError | ExecutionTimeoutError)


class SessionActor(Actor[object]):
    """Runs one replica's batches on its device; see the module docstring."""

    def __init__(
        self,
        *,
        replica: int,
        device: ActorRef[Any],
        queue: ActorRef[Any],
        ready: MemoryObjectReceiveStream[Batch],
        state: ReplicaState,
        policy: SessionPolicy,
        clock: Clock | None = None,
        on_status: Callable[[int, ReplicaStatus], None] | None = None,
    ) -> None:
        super().__init__(f"session-{replica}", clock=clock)
        self.log = self.log.bind(replica=replica)
        self.replica = replica
        self._device = device
        self._queue = queue
        self._ready = ready
        self._state = state
        self._policy = policy
        self._times = _RunTimes()
        self._on_status = on_status
        #: Resets happen one at a time; the generation counts them (see _recover).
        self._reset_lock = anyio.Lock()
        self._generation = 0

    # -- messages ----------------------------------------------------------------------------

    async def handle(self, message: object) -> Any:
        match message:
            case SaveVariables():
                variables: dict[str, np.ndarray] = await self._device.ask(RunSave())
                self._state.saved_variables = dict(variables)
                return variables
        return await super().handle(message)

    # -- the batch loop ----------------------------------------------------------------------

    async def background(self) -> None:
        # Batches left in flight by a previous incarnation of this actor run first: their
        # callers have not been answered yet.
        state = self._state
        state.heartbeat = self.clock.monotonic()
        slots = anyio.Semaphore(self._policy.pipeline_depth)
        async with anyio.create_task_group() as tg:
            for batch in list(state.inflight.values()):
                await slots.acquire()
                tg.start_soon(self._run, batch, slots)
            async for batch in self._ready:
                # Recorded at once: if this session is restarted from here on, the next one
                # runs the batch. Up to pipeline_depth batches sit in the device's worker
                # queue, so the device starts the next one the moment the last ends, without
                # waiting for this loop's turn on a busy event loop.
                state.inflight[batch.id] = batch
                await slots.acquire()
                state.heartbeat = self.clock.monotonic()
                tg.start_soon(self._run, batch, slots)

    async def _run(self, batch: Batch, slots: anyio.Semaphore) -> None:
        try:
            await self._run_batch(batch)
        finally:
            slots.release()
            self._state.heartbeat = self.clock.monotonic()

    async def _run_batch(self, batch: Batch) -> None:
        state = self._state
        while True:
            if state.status is ReplicaStatus.FAILED:
                failure = state.failure or UnrecoverableRuntimeError(
                    f"replica {self.replica} is out of service", replica=self.replica
                )
                self._finish(batch, Fail(batch, failure))
                return
            generation = self._generation
            t_start = self.clock.monotonic()
            try:
                outputs = await self._device.ask(RunMain(batch.inputs), timeout=self._deadline())
            except ActorStoppedError:
                # The device actor died. It is the one that failed, not this session: the
                # supervisor restarts it and, rest_for_one, this session after it. Wait for
                # that; the batch stays in state.inflight for the next incarnation.
                self._note_fault()
                self._set_status(ReplicaStatus.RESETTING)
                await anyio.sleep_forever()
            except DeviceStateError:
                if generation == self._generation and not self._reset_lock.locked():
                    raise
                # Aborted by, or refused during, a reset that another batch's failure started:
                # wait for the reset to finish, then run again (not this batch's failure).
                async with self._reset_lock:
                    pass
                continue
            except (RuntimeFailure, ExecutionTimeoutError) as exc:
                self._note_fault()
                if await self._recover(batch, exc, generation):
                    continue
                self._finish(batch, Fail(batch, exc))
                return
            t_end = self.clock.monotonic()
            self._times.samples.append(t_end - t_start)
            if state.fault_at is not None:
                state.recovery_times.append(t_end - state.fault_at)
                state.fault_at = None
            state.runs += 1
            self._finish(batch, Complete(batch, outputs, t_start, t_end))
            return

    def _finish(self, batch: Batch, answer: Complete | Fail) -> None:
        self._queue.tell(answer)
        self._state.inflight.pop(batch.id, None)

    def _note_fault(self) -> None:
        if self._state.fault_at is None:
            self._state.fault_at = self.clock.monotonic()
        self._state.faults += 1

    def _deadline(self) -> float | None:
        if self._policy.execution_timeout is not None:
            return self._policy.execution_timeout
        return self._times.deadline()

    async def _recover(self, batch: Batch, exc: BaseException, generation: int) -> bool:
        """Reset the device if the policy says so. True: run the batch again.

        ``generation`` is the reset generation the failed run started in: when another batch's
        failure has reset the device since, this one is simply retried (one reset per fault).
        """
        hang = isinstance(exc, ExecutionTimeoutError)
        self.log.warning(
            "run_failed", error=type(exc).__name__, message=str(exc), attempts=batch.attempts
        )
        if isinstance(exc, UnrecoverableRuntimeError):
            self._set_failed(exc)
            return False
        if not hang and not (self._policy.auto_reset and is_resettable(exc)):
            return False
        async with self._reset_lock:
            if self._state.status is ReplicaStatus.FAILED:
                return False
            if generation == self._generation:
                if not self._note_reset():
                    self._set_failed(exc)
                    return False
                try:
                    await self.reset_device()
                except (RuntimeFailure, ExecutionTimeoutError):
                    return False
                self._generation += 1
        batch.attempts += 1
        if batch.attempts <= self._policy.max_retries:
            self._state.retries += 1
            return True
        return False

    def _note_reset(self) -> bool:
        """Count a reset; False once resets pass the intensity within the period."""
        now = self.clock.monotonic()
        window = self._state.reset_times
        window.append(now)
        while window and window[0] < now - self._policy.reset_period:
            window.popleft()
        self._state.resets += 1
        return len(window) <= self._policy.reset_intensity

    async def reset_device(self) -> None:
        """Reset the device, restoring the last saved variables; READY again when it is done.

        Raises:
            RuntimeFailure: the reset itself failed (the replica is then FAILED).
        """
        self._set_status(ReplicaStatus.RESETTING)
        self.log.info("device_reset", resets=self._state.resets)
        try:
            await self._device.ask(
                Reset(self._state.saved_variables), timeout=self._policy.reset_timeout
            )
        except (RuntimeFailure, ExecutionTimeoutError) as exc:
            self._set_failed(exc)
            raise
        self._set_status(ReplicaStatus.READY)

    def _set_failed(self, exc: BaseException) -> None:
        self._state.failure = exc
        self._set_status(ReplicaStatus.FAILED)
        self.log.error("replica_failed", error=type(exc).__name__, message=str(exc))

    def _set_status(self, status: ReplicaStatus) -> None:
        self._state.set_status(status)
        if self._on_status is not None:
            self._on_status(self.replica, status)

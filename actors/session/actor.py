"""The Session actor: one replica's program lifecycle (load / main / save) and its batch loop.

The session binds one executable to one Device actor. Before it reports started it runs a
warm-up batch (zeros) on the device: "started" means the device runs the program, and the run
time seeds the hang deadline. Its background loop then takes the next ready batch from its
Queue, has the Device run the main program (one thread hop per batch, inside the device), and
gives the outputs back to the Queue, which answers the callers.

The hot path skips both mailboxes (all three actors share the loop): ``pipeline_depth``
coroutines, not a task per batch, take sealed batches (without a loop iteration when one is
ready), submit them with :meth:`Device.run_main_nowait` and hand the outcome to
:meth:`Queue.answer_nowait`; one timer watches the execution deadlines of the runs on the
device instead of a cancel scope per run. Per batch that is one cross-thread wake-up (the
device's delivery) and one task step. A batch sealed for an idle replica whose run the device
does inline on the loop (one row, shorter than a few thread hops) is run in place, in the task that
sealed it (:meth:`SessionActor._run_now`): no task step at all; a failure still goes through
the batch loop.

Failures are classified (DESIGN.md §7):

* **Data errors** -- the backend rejects the data (onnxruntime INVALID_ARGUMENT, an index or
  shape error in a kernel), or an application error repeats on the same batch after a reset.
  The batch is bisected on the same device without a reset (:mod:`.bisect`): the requests
  responsible get :class:`InputValidationError`, the others their rows. Never a fault.
* **Device faults** -- the seed's ``auto_reset`` rule: an application error, or a recoverable
  error whose action is IPU_RESET, resets the device when ``auto_reset`` is on and the batch is
  retried up to ``max_retries``; other recoverable errors (and, without ``auto_reset``, these
  too) answer the batch's callers with the error. A run past its execution deadline is a hang:
  the device is reset and the batch retried. One reset per fault, however many batches were in
  flight (the reset generation).
* **Progress, not counts** -- a reset followed by a successful batch is a recovery. A replica
  leaves service (FAILED) after ``max_failed_recoveries`` faults in a row with no successful
  batch between them, or at once on an unrecoverable fault. Its requests move to the other
  replicas (``on_status``), and the session re-probes the device with exponential backoff
  (reset, restore the saved variables, run a probe batch; a broken device is re-attached via
  ``reattach``) until it serves again.

State that must survive a restart of this actor (the batches in flight, the last saved
variables, the replica's health) lives in :class:`ReplicaState`, owned by the replica's tree.
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
from actors.device.messages import Reset, RunMain, RunSave
from actors.queues.actor import Queue
from actors.queues.batch import Batch
from actors.queues.messages import Complete, Fail, Settle
from actors.queues.pool import Layout
from actors.queues.request import Request
from actors.queues.timer import FlushTimer
from actors.session import bisect
from actors.session.state import ReplicaState, ReplicaStatus
from model_runtime.errors import (
    ActorStoppedError,
    ApplicationRuntimeError,
    DeviceStateError,
    ExecutionTimeoutError,
    InputValidationError,
    RecoverableRuntimeError,
    RecoveryAction,
    RuntimeFailure,
    UnrecoverableRuntimeError,
)
from model_runtime.executable.model import DYNAMIC_CHECK_SIZES

__all__ = ["SaveVariables", "SessionActor", "SessionPolicy", "is_resettable"]

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


@dataclass(frozen=True, slots=True)
class SaveVariables:
    """Ask: run the save programs; answers {variable name: array} (also kept for resets)."""


@dataclass(slots=True)
class _RunTimes:
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
        return max(floor, 20.0 * self.slowest)


def is_resettable(exc: BaseException) -> bool:
    """The seed's auto_reset rule: application errors and IPU_RESET recoverable errors."""
    if isinstance(exc, RecoverableRuntimeError):
        return exc.recovery_action is RecoveryAction.IPU_RESET
    return isinstance(exc, ApplicationRuntimeError)


class _Poisoned(Exception):
    """A run failed because of its data: bisect the batch (never leaves this module)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


class SessionActor(Actor[object]):
    """Runs one replica's batches on its device; see the module docstring."""

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
        self._times = _RunTimes()
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

    # -- lifecycle ---------------------------------------------------------------------------

    async def on_start(self) -> None:
        state = self._state
        state.heartbeat = self.clock.monotonic()
        if state.status is ReplicaStatus.FAILED:
            return  # out of service: the background probes before it serves again
        await self._warm_up()
        self._set_status(ReplicaStatus.READY)

    async def handle(self, message: object) -> Any:
        match message:
            case SaveVariables():
                variables: dict[str, np.ndarray] = await self._device.ask(RunSave())
                self._state.saved_variables = dict(variables)
                return variables
        return await super().handle(message)

    # -- the batch loop ----------------------------------------------------------------------

    async def background(self) -> None:
        state = self._state
        queue = self._queue.actor
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._hang_timer.run)
            self._watching = True
            if isinstance(queue, Queue):
                queue.run_now = self._run_now
            try:
                while True:
                    if state.status is ReplicaStatus.FAILED:
                        await self._probe_until_ready()
                    self._out = anyio.Event()
                    await self._serve()
                    # Out of service: the queue handed every unanswered request to other
                    # replicas, those of the batches in flight included.
                    state.inflight.clear()
            finally:
                self._watching = False
                if isinstance(queue, Queue) and queue.run_now == self._run_now:
                    queue.run_now = None
                tg.cancel_scope.cancel()

    async def _serve(self) -> None:
        """Run batches until the replica leaves service."""
        state = self._state
        state.heartbeat = self.clock.monotonic()
        # Batches left in flight by a previous incarnation of this actor run first: their
        # callers have not been answered yet.
        leftover = deque(state.inflight.values())
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._stop_serving_when_out, tg.cancel_scope)
            # Up to pipeline_depth batches sit in the device's worker queue, so the device
            # starts the next one the moment the last ends.
            for _ in range(self._policy.pipeline_depth):
                tg.start_soon(self._pipeline, leftover)

    async def _pipeline(self, leftover: deque[Batch]) -> None:
        """One slot of the pipeline: take the next batch, run it, answer it; again."""
        state, ready = self._state, self._ready
        queue = self._queue.actor
        while True:
            if leftover:
                batch = leftover.popleft()
            else:
                try:  # a batch already sealed is taken without a trip through the loop
                    batch = ready.receive_nowait()
                except anyio.WouldBlock:
                    if isinstance(queue, Queue):
                        await queue.batch_ready()
                        continue
                    try:
                        batch = await ready.receive()
                    except anyio.EndOfStream:
                        return
                except (anyio.EndOfStream, anyio.ClosedResourceError):
                    return
                # Recorded at once: if this session is restarted from here on, the next
                # one runs the batch.
                state.inflight[batch.id] = batch
            state.heartbeat = self.clock.monotonic()
            await self._run_batch(batch)
            state.heartbeat = self.clock.monotonic()

    async def _stop_serving_when_out(self, scope: anyio.CancelScope) -> None:
        await self._out.wait()
        scope.cancel()

    def _run_now(self, batch: Batch) -> bool:
        """Run ``batch`` here and now, in the task that sealed it (the queue offers a batch
        sealed for an idle device): when nothing of this replica is in flight and the device
        runs it inline on the loop anyway, the batch loop's turn would only add a loop
        iteration. Success is booked and answered as the batch loop does; a failed run goes
        to the batch loop with its outcome (``Batch.ran``), which handles it as usual.

        Returns False when it did not answer the batch (the queue sends it to the batch loop).
        """
        state = self._state
        device = self._device.actor
        if not (
            self._watching
            and self._on_device == 0
            and not state.inflight
            and state.status is ReplicaStatus.READY
            and batch.outputs_into is None
            and isinstance(device, Device)
        ):
            return False
        t_start = self.clock.monotonic()
        try:
            future = device.run_inline_nowait(batch.inputs)
        except Exception:
            return False  # refused: the batch loop is refused the same way and handles it
        if future is None:
            return False
        if future.exception() is not None:
            batch.ran = future
            return False
        state.heartbeat = self.clock.monotonic()
        self._succeed(batch, future.result(), t_start)
        return True

    def _succeed(self, batch: Batch, outputs: Outputs, t_start: float) -> None:
        """Book a successful run of ``batch`` that started at ``t_start`` and answer it."""
        # The device runs one batch at a time: a batch asked while another ran started
        # when that one ended, so its wait in the device's queue is queue time, not
        # computation (the seed's read_queue / computation split).
        t_start = max(t_start, self._device_free_at)
        t_end = self._device_free_at = self.clock.monotonic()
        self._succeeded(t_start, batch.valid_rows)
        sizes = self._state.runs_by_size
        size = self._executed_size(batch)
        sizes[size] = sizes.get(size, 0) + 1
        self._finish(batch, Complete(batch, outputs, t_start, t_end))

    async def _run_batch(self, batch: Batch) -> None:
        state = self._state
        poison: BaseException | None = None  # set once the batch's data is found at fault
        ran, batch.ran = batch.ran, None  # a run made in place, that failed (see _run_now)
        while True:
            if state.status is ReplicaStatus.FAILED:
                # Out of service: the queue handed this batch's callers to other replicas;
                # this answer is ignored unless nobody could take them.
                self._finish(batch, Fail(batch, self._out_of_service_error()))
                return
            generation = self._generation
            t_start = self.clock.monotonic()
            try:
                if poison is not None:
                    await self._bisect(batch, poison)
                    return
                if ran is not None:  # its outcome, as if this run had just returned it
                    made, ran = ran, None  # (cleared first: a retry runs the batch again)
                    outputs = made.result()
                else:
                    outputs = await self._run_main(batch.inputs, into=batch.outputs_into)
            except ActorStoppedError:
                # The device actor died. The supervisor restarts it and, rest_for_one, this
                # session after it; the batch stays in state.inflight for the next one.
                if self._fault():
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
            except InputValidationError as exc:
                poison = exc
                continue
            except (RuntimeFailure, ExecutionTimeoutError) as exc:
                if isinstance(exc, ApplicationRuntimeError) and poison is None:
                    if self._policy.auto_reset and batch.app_errors > 0:
                        # The same batch failed the same way after a reset: its data, not
                        # the device. Bisect instead of resetting again.
                        poison = exc
                        continue
                    batch.app_errors += 1
                if await self._recover(batch, exc, generation):
                    continue
                # A fault that resets and retries did not cure here may not strike another
                # replica: the batch's callers move on, and get the error only where no
                # replica in service is left to try. Errors the seed raises stay raised.
                hang = isinstance(exc, ExecutionTimeoutError)
                elsewhere = self._policy.auto_reset and (hang or is_resettable(exc))
                self._finish(batch, Fail(batch, exc, elsewhere))
                return
            self._succeed(batch, outputs, t_start)
            return

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

    def _past_deadline(self, deadline: float) -> ExecutionTimeoutError:
        return ExecutionTimeoutError(
            f"replica {self.replica}: the main program ran past its deadline ({deadline:.3g} s)"
        )

    def _next_hang(self) -> float:
        """When the first run on the device passes its deadline (``inf``: nothing runs)."""
        runs = self._runs
        if not runs:
            return _INF
        return min(at for at, _ in runs.values())

    def _on_hang(self) -> None:
        """Runs past their deadline fail with :class:`ExecutionTimeoutError` (the device goes
        on with them until the reset that the failure leads to aborts them)."""
        now = self.clock.monotonic()
        for future, (at, seconds) in list(self._runs.items()):
            if at <= now:
                del self._runs[future]
                if not future.done():
                    future.set_exception(self._past_deadline(seconds))

    def _executed_size(self, batch: Batch) -> int:
        """The batch size ``batch`` ran at: its rows along the row axis (a bucket, or B)."""
        spec = self._layout.inputs[0]
        if spec.axis is None or not batch.inputs:
            return self._layout.B
        return int(batch.inputs[0][spec.name].shape[spec.axis])

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

    def _finish(self, batch: Batch, answer: Complete | Settle | Fail) -> None:
        queue = self._queue.actor
        if isinstance(queue, Queue):
            queue.answer_nowait(answer)
        else:
            self._queue.tell(answer)
        self._state.inflight.pop(batch.id, None)

    def _deadline(self) -> float:
        if self._policy.execution_timeout is not None:
            return self._policy.execution_timeout
        return self._times.deadline(self._policy.deadline_floor, self._policy.reset_timeout)

    # -- data errors ---------------------------------------------------------------------------

    async def _bisect(self, batch: Batch, error: BaseException) -> None:
        """Find the requests whose data makes the run fail; answer everyone (module doc).

        Raises:
            RuntimeFailure, ExecutionTimeoutError, ActorStoppedError: a device fault during
                the bisection; the caller handles it as a failure of the whole batch.
        """
        t_start = self.clock.monotonic()
        live = [r for r in batch.requests if not r.future.done()]
        self.log.warning(
            "run_rejected_data", error=type(error).__name__, message=str(error), requests=len(live)
        )
        base = bisect.copy_inputs(batch)
        parts: list[tuple[Batch, Sequence[Mapping[str, np.ndarray]]]] = []
        rejected: list[tuple[Request, BaseException]] = []
        todo = [*bisect.halves(live)] if len(live) > 1 else [live]
        while todo:
            group = todo.pop()
            if not group:
                continue
            if len(live) == 1 and isinstance(error, InputValidationError):
                outputs: Outputs | None = None  # the whole batch already failed on its own
            else:
                outputs = await self._try_group(base, batch, group, error)
            if outputs is not None:
                parts.append((bisect.part(batch, group), outputs))
            elif len(group) > 1:
                todo.extend(bisect.halves(group))
            else:
                rejected.append((group[0], self._rejection(error)))
        self._state.poisoned += len(rejected)
        if len(rejected) < len(live):
            self._succeeded(t_start)
        self._finish(batch, Settle(batch, parts, rejected, t_start, self.clock.monotonic()))

    async def _try_group(
        self, base: bisect.Inputs, batch: Batch, group: list[Request], first: BaseException
    ) -> Outputs | None:
        """Run ``group``'s rows alone: their outputs, or None when they fail the same way."""
        inputs = bisect.masked_inputs(base, batch, group, self._layout)
        # A rejection by the backend (INVALID_ARGUMENT) is about the data for certain; an
        # application error may be a device fault that happened to strike twice, so a lone
        # request is convicted only when it fails as many times in a row as a batch is retried.
        tries = 1 + self._policy.max_retries if len(group) == 1 else 1
        for _ in range(tries):
            try:
                return await self._run_main(inputs)
            except InputValidationError:
                return None
            except ApplicationRuntimeError:
                if not isinstance(first, ApplicationRuntimeError):
                    raise
        return None

    def _rejection(self, error: BaseException) -> InputValidationError:
        cause = error.__cause__ or error
        rejection = InputValidationError(
            f"the model rejected this request's data on replica {self.replica}: {cause}"
        )
        rejection.__cause__ = error
        return rejection

    # -- device faults -----------------------------------------------------------------------

    def _fault(self) -> bool:
        """Count a fault by the progress rule. False: the replica has left service."""
        state = self._state
        if state.fault_at is None:
            state.fault_at = self.clock.monotonic()
        state.faults += 1
        if state.recovering:
            state.failed_recoveries += 1
        state.recovering = True
        if state.failed_recoveries >= self._policy.max_failed_recoveries:
            self._leave_service(
                UnrecoverableRuntimeError(
                    f"replica {self.replica} made no progress through "
                    f"{state.failed_recoveries} recoveries in a row",
                    replica=self.replica,
                )
            )
            return False
        return True

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
            self._fault()
            self._leave_service(exc)
            return False
        if not hang and not (self._policy.auto_reset and is_resettable(exc)):
            return False
        async with self._reset_lock:
            if self._state.status is ReplicaStatus.FAILED:
                return False
            if generation == self._generation:
                if not self._fault():
                    return False
                try:
                    await self.reset_device()
                except ActorStoppedError:
                    # The device actor died during the reset: its supervisor replaces it and,
                    # rest_for_one, this session; the batch stays in flight for the next one.
                    await anyio.sleep_forever()
                except (RuntimeFailure, ExecutionTimeoutError, DeviceStateError) as reset_exc:
                    self._leave_service(reset_exc)
                    return False
                self._generation += 1
        if not self._policy.auto_reset:
            # The seed's auto_reset=False: the error is raised. A hung device serves nobody,
            # so it was reset all the same, but the batch is not retried.
            return False
        batch.attempts += 1
        if batch.attempts <= self._policy.max_retries:
            self._state.retries += 1
            return True
        return False

    async def reset_device(self) -> None:
        """Reset the device, restoring the last saved variables; READY again when it is done.

        Raises:
            RuntimeFailure, ExecutionTimeoutError: the reset itself failed.
        """
        self._set_status(ReplicaStatus.RESETTING)
        self._state.resets += 1
        self.log.info("device_reset", resets=self._state.resets)
        await self._device.ask(
            Reset(self._state.saved_variables), timeout=self._policy.reset_timeout
        )
        self._set_status(ReplicaStatus.READY)

    def _leave_service(self, exc: BaseException) -> None:
        state = self._state
        if state.status is ReplicaStatus.FAILED:
            return
        state.failure = exc
        state.outages += 1
        # The backoff goes on growing while the replica flaps (back, then out again without
        # serving); a served batch resets it.
        state.probe_delay = state.probe_delay or self._policy.probe_initial
        self.log.error("replica_out_of_service", error=type(exc).__name__, message=str(exc))
        self._set_status(ReplicaStatus.FAILED)
        self._out.set()

    def _out_of_service_error(self) -> BaseException:
        return self._state.failure or UnrecoverableRuntimeError(
            f"replica {self.replica} is out of service", replica=self.replica
        )

    # -- coming back ---------------------------------------------------------------------------

    async def _warm_up(self) -> None:
        """Run one batch of zeros: proves the device runs the program; seeds the deadline.

        A model with variables is reset afterwards, to the last saved variables (or its
        initial ones), so the warm-up leaves no trace in its state.

        Raises:
            RuntimeFailure, ExecutionTimeoutError, InputValidationError, DeviceStateError:
                the run failed.
        """
        layout = self._layout
        # A dynamic dimension at the size the compiler verified the program with.
        inputs = [
            {
                s.name: np.zeros(
                    tuple(d if d >= 0 else DYNAMIC_CHECK_SIZES[0] for d in s.shape), s.dtype
                )
                for s in layout.inputs
            }
            for _ in range(layout.I)
        ]
        t_start = self.clock.monotonic()
        await self._run_main(inputs, probe=True)
        took = self.clock.monotonic() - t_start
        self._times.add(took)
        self._measure(took)
        if self._stateful:  # the zeros ran through the variables: put them back
            await self._device.ask(
                Reset(self._state.saved_variables), timeout=self._policy.reset_timeout
            )

    async def _probe_until_ready(self) -> None:
        """Out of service: reset and probe the device with exponential backoff until it runs.

        A device that cannot be reset (broken, detached) is re-attached: ``reattach`` replaces
        the Device actor and, rest_for_one, this session; the next one goes on probing.
        """
        state, policy = self._state, self._policy
        while True:
            delay = state.probe_delay or policy.probe_initial
            await self.clock.sleep(delay)
            state.probe_delay = min(delay * 2, policy.probe_cap)
            state.probes += 1
            state.heartbeat = self.clock.monotonic()
            try:
                await self._device.ask(Reset(state.saved_variables), timeout=policy.reset_timeout)
                await self._warm_up()
            except ActorStoppedError:
                # The device actor died: its supervisor replaces it and, rest_for_one, this
                # session, which goes on probing.
                await anyio.sleep_forever()
            except (UnrecoverableRuntimeError, DeviceStateError) as exc:
                self.log.warning("probe_failed", error=type(exc).__name__, reattach=True)
                if self._reattach is not None:
                    await self._reattach()
                continue
            except (RuntimeFailure, ExecutionTimeoutError, InputValidationError) as exc:
                self.log.warning("probe_failed", error=type(exc).__name__, message=str(exc))
                continue
            break
        state.failure = None
        state.failed_recoveries = 0
        state.recovering = False
        self.log.info("replica_back_in_service", probes=state.probes, outages=state.outages)
        self._set_status(ReplicaStatus.READY)

    def _set_status(self, status: ReplicaStatus) -> None:
        self._state.set_status(status)
        if self._on_status is not None:
            self._on_status(self.replica, status)


_INF = float("inf")

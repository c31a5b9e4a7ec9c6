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

from collections import deque
from dataclasses import dataclass
from typing import Any

import anyio
import numpy as np

from actors.device.actor import Device
from actors.device.messages import RunSave
from actors.queues.actor import Queue
from actors.queues.batch import Batch
from actors.queues.messages import Complete, Fail
from actors.session.recovery import Recovery, is_resettable
from actors.session.runs import Outputs
from actors.session.state import ReplicaStatus
from model_runtime.errors import (
    ActorStoppedError,
    ApplicationRuntimeError,
    DeviceStateError,
    ExecutionTimeoutError,
    InputValidationError,
    RuntimeFailure,
)

__all__ = ["SaveVariables", "SessionActor"]


@dataclass(frozen=True, slots=True)
class SaveVariables:
    """Ask: run the save programs; answers {variable name: array} (also kept for resets)."""


class _Poisoned(Exception):
    """A run failed because of its data: bisect the batch (never leaves this module)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


class SessionActor(Recovery):
    """Runs one replica's batches on its device; see the module docstring."""

    # -- lifecycle --------------------------------------------------------------------------------

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

    # -- the batch loop ---------------------------------------------------------------------------

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
                if isinstance(queue, Queue) and not queue.has_ready():
                    await queue.batch_ready()
                    continue
                try:  # a batch already sealed is taken without a trip through the loop
                    batch = ready.receive_nowait()
                except anyio.WouldBlock:  # (a stand-in queue's stream)
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
        if self._device_free_at > t_start:  # (not max(): a call and its iteration a batch)
            t_start = self._device_free_at
        t_end = self._device_free_at = self.clock.monotonic()
        self._succeeded(t_start, batch.valid_rows)
        state = self._state
        sizes = state.runs_by_size
        size = self._executed_size(batch)
        sizes[size] = sizes.get(size, 0) + 1
        whole = self._layout.B
        device = self._device.actor
        if size * 2 >= whole and isinstance(device, Device):  # (a few rows: a run's fixed cost)
            state.batch_hops = device.run_hops(size) * whole / size
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

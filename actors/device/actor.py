"""The Device actor: one per attached device; owns its backend and its worker thread.

Every backend call runs in the device's own single worker thread (:mod:`.worker`), and a
``RunMain`` is exactly one hand-off to it whatever its device iterations. Jobs are submitted to
the worker in mailbox order, and answered from the worker's delivery on the loop, so the mailbox
stays free: ``GetStatus`` is answered and ``Reset`` taken while a run is in flight, even a hung
one. The replica's session skips the mailbox on the hot path: :meth:`Device.run_main_nowait`
submits a run at once and returns its future (same loop, same checks, same book-keeping).

A ``Reset`` aborts the runs in flight or queued (they fail with
:class:`~actors.device.backends.RunAborted`, a ``DeviceStateError``): it bumps the device's
generation, releases hung/slow fault waits, asks the backend to terminate its run, waits up to
``abort_grace`` seconds for the worker, and, if the worker is still stuck, abandons it for a
fresh thread and a fresh backend. Then it reloads the executable, re-runs the load programs and
restores the given variables.

The fault plan (:mod:`.faults`) is applied in the worker, on the same path as a real backend
failure. Errors that come out of a run carry ``replica``.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import numpy as np

from actors.actor import Envelope
from actors.clock import Clock
from actors.device import inline
from actors.device._deferred import DeferringActor
from actors.device.backends import Backend, RunAborted, make_backend
from actors.device.faults import FaultInjector, FaultPlan
from actors.device.manager import AttachedDevice
from actors.device.messages import (
    Detach,
    DeviceMessage,
    DeviceState,
    DeviceStatus,
    GetStatus,
    LoadExecutable,
    Reset,
    RunMain,
    RunPrograms,
    RunSave,
    Unload,
)
from actors.device.work import DeviceCrash, DeviceWork, rows_of
from actors.device.worker import Worker
from model_runtime.errors import (
    ActorStoppedError,
    DeviceStateError,
    RuntimeFailure,
    UnrecoverableRuntimeError,
)
from model_runtime.executable import Executable

__all__ = ["Device", "DeviceCrash"]

_INF = float("inf")


@dataclass(slots=True, eq=False)
class _Job:
    kind: str
    started_at: float | None
    envelope: Envelope | None = None
    future: asyncio.Future[Any] = field(init=False)


class Device(DeferringActor[DeviceMessage]):
    """The actor of one device (see the module docstring and :mod:`.messages`).

    ``backend`` defaults to the backend of ``device.spec.kind``. ``detach_on_stop``: release
    the device when the actor stops (it owns the attachment). ``executable`` (with
    ``frozen_inputs`` and saved ``variables``): load it before reporting started, so that
    "started" means "ready to run" (a failed load fails the start).
    """

    fatal = (DeviceCrash,)

    def __init__(
        self,
        device: AttachedDevice,
        backend: Backend | None = None,
        *,
        replica: int = 0,
        fault_plan: FaultPlan | None = None,
        fault_injector: FaultInjector | None = None,
        clock: Clock | None = None,
        name: str | None = None,
        abort_grace: float = 5.0,
        detach_on_stop: bool = True,
        executable: Executable | None = None,
        frozen_inputs: Mapping[str, np.ndarray] | None = None,
        variables: Mapping[str, np.ndarray] | None = None,
        inline_allowed: Callable[[], bool] | None = None,
    ) -> None:
        super().__init__(name or f"device-{replica}", clock=clock)
        self.device = device
        self.replica = replica
        self.fault_plan = fault_plan
        self.abort_grace = abort_grace
        self.detach_on_stop = detach_on_stop
        self.log = self.log.bind(device=device.spec.id, replica=replica)
        # One injector per replica outlives its Device actors (``at=N`` fires once).
        faults = fault_injector or (fault_plan.for_replica(replica) if fault_plan else None)
        self._work = DeviceWork(
            backend if backend is not None else make_backend(device.spec),
            faults,
            replica,
            self._what,
        )
        self._executor: Worker | None = None
        self._jobs: deque[_Job] = deque()
        self._abort = threading.Event()
        self._loaded = False
        self._resetting = False
        self._load_args: tuple[Any, Mapping[str, np.ndarray] | None] | None = None
        self.runs_completed = 0
        self.last_progress = 0.0
        self._initial = (executable, frozen_inputs, variables) if executable is not None else None
        #: Whether a run may hold the loop now beside the other devices of its runner (None:
        #: this device alone decides; see runs_inline).
        self._inline_allowed = inline_allowed

    @property
    def backend(self) -> Backend:
        """The device's backend (replaced by a fresh one when a stuck worker is abandoned)."""
        return self._work.backend

    # -- status ----------------------------------------------------------------------------

    @property
    def state(self) -> DeviceState:
        if not self.device.is_attached:
            return "detached"
        if self._work.broken is not None:
            return "broken"
        if self._resetting:
            return "resetting"
        if not self._loaded:
            return "empty"
        return "running" if self._jobs else "loaded"

    def status(self) -> DeviceStatus:
        """The current :class:`DeviceStatus` (what ``GetStatus`` answers)."""
        return DeviceStatus(
            device=self.device.spec.id,
            replica=self.replica,
            state=self.state,
            runs_completed=self.runs_completed,
            last_progress=self.last_progress,
            run_started_at=self._jobs[0].started_at if self._jobs else None,
            error=self._work.broken,
        )

    # -- lifecycle -------------------------------------------------------------------------

    async def on_start(self) -> None:
        await super().on_start()
        self._executor = self._new_executor()
        self.last_progress = self.clock.monotonic()
        if self._initial is not None:
            executable, frozen, variables = self._initial
            self._load_args = (executable, frozen)
            self._loaded = True
            job = self._submit("load", self._work.load, executable, frozen, variables)
            await self._await_job(job)
        self.log.info("device.started", kind=self.device.spec.kind, loaded=self._loaded)

    async def on_stop(self) -> None:
        stopped = ActorStoppedError(f"actor {self.name} has stopped")
        for job in self._jobs:
            if job.envelope is not None:
                job.envelope.fail(stopped)
        self._abort.set()
        self.backend.terminate()
        if self._executor is not None:
            # Queued jobs are void now; the unload goes last, then the worker thread ends.
            # Stopping means the worker is gone too (no thread outlives its actor), unless it
            # is stuck in a run that ignores termination: then it is abandoned after the grace.
            # asyncio.wait, not await: a cancelled future must not raise CancelledError here,
            # where anyio would take it for a cancellation of the supervisor's scope.
            # Failed, not cancelled: a cancelled future would cancel the task awaiting it.
            self._work.generation += 1
            for job in self._jobs:
                if not job.future.done():
                    job.future.set_exception(stopped)
                    job.future.exception()
            unloaded = self._executor.submit(self.backend.unload)
            self._executor.shutdown()
            self._executor = None
            await asyncio.wait([unloaded], timeout=self.abort_grace)
        if self.detach_on_stop:
            self.device.detach()
        self.log.info("device.stopped")

    def _new_executor(self) -> Worker:
        return Worker(f"device-{self.device.spec.id}")

    # -- dispatch --------------------------------------------------------------------------

    async def _dispatch(self, envelope: Envelope) -> None:
        message = envelope.message
        try:
            match message:
                case GetStatus():
                    envelope.answer(self.status())
                case Reset(variables):
                    self._check_usable()
                    if self._load_args is None:
                        raise DeviceStateError(f"{self._what()}: reset before any executable")
                    await self.defer(envelope, lambda: self._reset(variables))
                case Detach():
                    await self.defer(envelope, self._detach)
                case LoadExecutable(executable, frozen):
                    self._check_usable()
                    self._load_args = (executable, frozen)
                    self._loaded = True
                    job = self._submit("load", self._work.load, executable, frozen)
                    self._reply_when_done(envelope, job)
                case RunMain(batches, probe, into):
                    self._check_loaded()
                    job = self._submit("main", self._work.main, batches, probe, into)
                    self._reply_when_done(envelope, job)
                case RunSave():
                    self._check_loaded()
                    job = self._submit("save", self._work.save)
                    self._reply_when_done(envelope, job)
                case RunPrograms(program_ids, batches):
                    self._check_loaded()
                    job = self._submit("programs", self._work.programs, program_ids, batches)
                    self._reply_when_done(envelope, job)
                case Unload():
                    self._check_usable()
                    self._loaded = False
                    self._load_args = None
                    job = self._submit("unload", self._work.unload)
                    self._reply_when_done(envelope, job)
                case _:
                    await super()._dispatch(envelope)
        except Exception as exc:
            if envelope.reply is None:
                raise
            envelope.fail(exc)

    def _what(self) -> str:
        return f"device {self.device.spec.id} (replica {self.replica})"

    def _check_usable(self) -> None:
        if not self.device.is_attached:
            raise DeviceStateError(f"{self._what()} is detached")
        if self._work.broken is not None:
            raise UnrecoverableRuntimeError(
                f"{self._what()} is broken: {self._work.broken}", replica=self.replica
            )
        if self._resetting:
            raise DeviceStateError(f"{self._what()} is resetting")

    def _check_loaded(self) -> None:
        self._check_usable()
        if not self._loaded:
            raise DeviceStateError(f"{self._what()}: no executable loaded")

    # -- the hot path: a run without the mailbox -------------------------------------------

    def run_main_nowait(
        self,
        batches: Sequence[Mapping[str, np.ndarray]],
        probe: bool = False,
        into: Sequence[Mapping[str, np.ndarray]] | None = None,
    ) -> asyncio.Future[list[dict[str, np.ndarray]]]:
        """Submit a main run now, as ``RunMain`` would, without the mailbox's hop; the future
        gets the outputs or the run's error (a crash: :class:`ActorStoppedError`). For callers
        on the actor's own loop (its replica's session); it overtakes messages still in the
        mailbox, which a session never has in flight beside its runs.

        Raises:
            ActorStoppedError: the actor is not running.
            DeviceStateError: detached, resetting, or nothing loaded.
            UnrecoverableRuntimeError: the device is broken.
        """
        if not self.is_running:
            raise ActorStoppedError(f"actor {self.name} has stopped")
        self._check_loaded()
        if not probe and into is None and self.runs_inline(batches):
            return self._run_inline(batches)
        return self._submit("main", self._work.main, batches, probe, into).future

    def run_inline_nowait(
        self, batches: Sequence[Mapping[str, np.ndarray]]
    ) -> asyncio.Future[list[dict[str, np.ndarray]]] | None:
        """A plain main run of ``batches`` done here and now, when it is one the device runs
        inline (:meth:`runs_inline`): its future is done (outputs, or the run's error, as
        :meth:`run_main_nowait` gives them). None: nothing was run.

        Raises:
            DeviceStateError: detached, resetting, or nothing loaded.
            UnrecoverableRuntimeError: the device is broken.
        """
        if not self.is_running or not self.runs_inline(batches):
            return None
        self._check_loaded()
        return self._run_inline(batches)

    def run_hops(self, rows: int) -> float:
        """A main run of ``rows`` rows on this device in its worker's hops (the measured run
        over the measured round trip of a job to the idle thread and back: how much a run
        weighs against handing it over, on this host as loaded now); 0: not measured."""
        hop = self._executor.hop_seconds if self._executor is not None else 0.0
        run = self._work.run_seconds.get(rows, 0.0)
        return run / hop if hop > 0.0 else 0.0

    @property
    def busy(self) -> bool:
        """A job (a run, a load, a reset...) was asked of this device and has not ended."""
        return bool(self._jobs)

    def runs_inline(self, batches: Sequence[Mapping[str, np.ndarray]]) -> bool:
        """Whether a plain main run of ``batches`` (no probe, no output buffers) would run
        here, on the loop, if asked now: the device is idle, the run is one row and measured
        shorter than the inline limit (:mod:`.inline`), and no
        fault plan is in force."""
        return (
            not self._jobs
            and self._work.faults is None
            and len(batches) == 1
            and rows_of(batches[0]) == 1
            and self._work.run_seconds.get(1, _INF) < self._inline_below()
            and (self._inline_allowed is None or self._inline_allowed())
        )

    def _inline_below(self) -> float:
        """How short a run must be to run inline (:func:`.inline.inline_below`)."""
        return inline.inline_below(self._executor.hop_seconds if self._executor else 0.0)

    def _run_inline(
        self, batches: Sequence[Mapping[str, np.ndarray]]
    ) -> asyncio.Future[list[dict[str, np.ndarray]]]:
        """A run shorter than a thread hop, on an idle device: done here, on the loop (a hop
        to the worker and back costs 75-110 µs on the 2-core machine, and wakes the worker's
        core cold). Same checks, book-keeping and errors as the worker's."""
        # (the worker's loop is this one: asking asyncio for it is a getpid syscall each time)
        executor = self._executor
        loop = executor.loop if executor is not None else asyncio.get_running_loop()
        future: asyncio.Future[list[dict[str, np.ndarray]]] = loop.create_future()
        job = _Job("main", self.clock.monotonic())
        job.future = future
        self._jobs.append(job)
        try:
            result = self._work.main(self._work.generation, self._abort, batches)
        except Exception as exc:
            error = self._delivered(job, exc)
            assert error is not None
            future.set_exception(error)
        else:
            self._delivered(job, None)
            future.set_result(result)
        return future

    # -- jobs (submitted in mailbox order, settled as the worker delivers them) ------------

    def _submit(self, kind: str, fn: Callable[..., Any], *args: Any) -> _Job:
        assert self._executor is not None
        job = _Job(kind, None if self._jobs else self.clock.monotonic())
        job.future = self._executor.submit(
            fn, self._work.generation, self._abort, *args, hook=lambda r, e: self._delivered(job, e)
        )
        self._jobs.append(job)
        return job

    def _delivered(self, job: _Job, exc: BaseException | None) -> BaseException | None:
        """Every job ends here once, on the loop, before its future is resolved."""
        if isinstance(exc, asyncio.CancelledError):
            self._finish(job)
            return exc
        self._settle(job, exc)
        if isinstance(exc, DeviceCrash):
            self.die(exc)
            return ActorStoppedError(f"actor {self.name} crashed: {exc}")
        return exc

    def _settle(self, job: _Job, exc: BaseException | None) -> None:
        """Book-keeping when a job ends (loop thread): progress, counters, error context."""
        self._finish(job)
        if exc is None:
            if job.kind in ("main", "programs"):
                self.runs_completed += 1
        elif isinstance(exc, RuntimeFailure):
            if exc.replica is None:
                exc.replica = self.replica
            self.log.warning("device.run_failed", job=job.kind, error=repr(exc))
        elif isinstance(exc, DeviceCrash):
            self.log.error("device.crash", job=job.kind)
        else:
            if job.kind == "load":
                self._loaded = False
            self.log.info("device.job_failed", job=job.kind, error=repr(exc))

    async def _await_job(self, job: _Job) -> Any:
        try:
            return await job.future
        except asyncio.CancelledError:
            self._finish(job)
            raise

    def _reply_when_done(self, envelope: Envelope, job: _Job) -> None:
        # Answer from the future's done-callback, no task per job.
        job.envelope = envelope
        job.future.add_done_callback(lambda f: self._completed(job, f))

    def _completed(self, job: _Job, future: asyncio.Future[Any]) -> None:
        envelope = job.envelope
        assert envelope is not None
        if future.cancelled():
            self._finish(job)
            envelope.fail(ActorStoppedError(f"actor {self.name} has stopped"))
            return
        exc = future.exception()
        if exc is None:
            envelope.answer(future.result())
        elif envelope.reply is None:  # a failed tell ends the actor, as in the base class
            envelope.fail(exc)
            self.die(exc)
        else:
            envelope.fail(exc)

    def _finish(self, job: _Job) -> None:
        now = self.clock.monotonic()
        self.last_progress = now
        try:
            was_head = self._jobs[0] is job
            self._jobs.remove(job)
        except (IndexError, ValueError):
            return
        if was_head and self._jobs:
            self._jobs[0].started_at = now

    # -- reset / detach --------------------------------------------------------------------

    async def _abort_in_flight(self) -> None:
        """Abort every job in flight or queued; replace the worker if it does not come back."""
        self._work.generation += 1
        old, self._abort = self._abort, threading.Event()
        old.set()
        self.backend.terminate()
        pending = [j.future for j in self._jobs]
        if pending:
            with anyio.move_on_after(self.abort_grace):
                await asyncio.wait(pending)
        if any(not f.done() for f in pending):
            self.log.warning("device.worker_abandoned", stuck=len(pending))
            assert self._executor is not None
            self._executor.abandon(RunAborted(f"{self._what()}: run aborted by a reset"))
            self._executor = self._new_executor()
            self._work.backend = make_backend(self.device.spec)
        self._jobs.clear()

    async def _reset(self, variables: Mapping[str, np.ndarray] | None) -> None:
        self._resetting = True
        self.log.info("device.reset", variables=variables is not None)
        try:
            await self._abort_in_flight()
            assert self._load_args is not None
            executable, frozen = self._load_args
            self._resetting = False  # the reset job is an ordinary job from here on
            self._loaded = True
            job = self._submit("reset", self._work.load, executable, frozen, variables)
            await self._await_job(job)
        except BaseException:
            self._loaded = False
            raise
        finally:
            self._resetting = False

    async def _detach(self) -> None:
        if not self.device.is_attached:
            return
        await self._abort_in_flight()
        self._loaded = False
        self._load_args = None
        job = self._submit("unload", self._work.unload)
        try:
            await self._await_job(job)
        finally:
            self.device.detach()
            self.log.info("device.detached")

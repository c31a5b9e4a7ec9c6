"""``ModelRunner``: many concurrent callers share replicated devices through ``execute()``.

A facade over a :class:`supervisor.Supervisor` tree (DESIGN.md §3)::

    Supervisor "runner"                       one_for_one
     └─ Supervisor "replica-r" r = 0..R-1     rest_for_one
         ├─ Queue r     packs callers' samples into batches, splits outputs back
         ├─ Device r    owns the backend; runs programs in its own worker thread
         └─ Session r   takes ready batches, runs them on Device r, hands outputs to Queue r

The Queue starts first because it holds the callers' requests: a device failure restarts the
Device and the Session after it (rest_for_one) without touching queued requests.

``execute()`` validates on the event loop, picks a replica (``replica_id``, or the least-loaded
ready one) and hands a :class:`Request` to that Queue with a ``tell``: no thread hop, no copy
until the Queue packs the rows into a pooled batch buffer.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Awaitable, Iterable, Mapping
from types import TracebackType
from typing import Any

import anyio
import numpy as np
import structlog

from actors.clock import Clock, SystemClock, move_on_after
from actors.device.actor import Device
from actors.device.backends import create_backend
from actors.device.faults import FaultPlan
from actors.device.manager import AttachedDevice, DeviceManager
from actors.device.wait import DeviceWaitConfig
from actors.queues.actor import Queue
from actors.queues.config import QueueConfig
from actors.queues.messages import Drain, FailAll, GetStats
from actors.queues.request import Request
from actors.session.actor import SaveVariables, SessionActor, SessionPolicy
from actors.session.state import ReplicaState, ReplicaStatus
from actors.watchdog import Watchdog, WatchTarget
from model_runtime.errors import (
    ExecutionTimeoutError,
    InputValidationError,
    ModelRuntimeError,
    RunnerStoppedError,
    SupervisorEscalationError,
)
from model_runtime.executable import Executable
from model_runtime.io import (
    DataDesc,
    describe_anchor,
    request_shapes,
    validate_inputs,
    validate_outputs,
)
from model_runtime.runner_config import ModelRunnerConfig
from model_runtime.stats import StatisticsView
from supervisor import ChildSpec, Restart, Strategy, Supervisor

__all__ = ["ModelRunner", "ModelRunnerConfig"]

log = structlog.get_logger(__name__)
Source = str | os.PathLike[str] | Iterable[str | os.PathLike[str]] | Executable


def _root_cause(exc: BaseException) -> BaseException:
    """The first error in ``exc``'s cause chain that is not the supervision machinery's."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, ModelRuntimeError) and not isinstance(cur, SupervisorEscalationError):
            return cur
        if isinstance(cur, BaseExceptionGroup) and len(cur.exceptions) == 1:
            cur = cur.exceptions[0]
            continue
        cur = cur.__cause__
    return exc


class ModelRunner:
    """Run an executable for many concurrent callers (seed: ``ModelRunner``).

    Use as ``async with ModelRunner(path, config) as runner: await runner.execute(inputs)``.
    """

    def __init__(
        self,
        source: Source,
        config: ModelRunnerConfig | None = None,
        *,
        clock: Clock | None = None,
        device_manager: DeviceManager | None = None,
    ) -> None:
        self.config = config or ModelRunnerConfig()
        self.config.validate()
        self._source = source
        self._clock = clock or SystemClock()
        self._manager = device_manager or DeviceManager(clock=self._clock)
        self._exe: Executable | None = source if isinstance(source, Executable) else None
        self._states: list[ReplicaState] = []
        self._queues: list[Queue] = []
        self._devices: list[AttachedDevice] = []
        self._supervisor: Supervisor | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._accepting = False
        self._closed = False
        self._next_replica = 0
        self._in_shapes: tuple[Any, ...] = ()
        self._out_shapes: tuple[Any, ...] = ()
        self._plan: FaultPlan | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._outstanding: set[asyncio.Future[dict[str, np.ndarray]]] = set()

    # -- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> ModelRunner:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def start(self) -> None:
        """Load the executable, attach devices and start every replica.

        Raises:
            InvalidExecutableError: the executable cannot be loaded.
            DeviceUnavailableError: devices could not be attached per ``device_wait_config``.
            ModelRuntimeError: any other failure while starting (devices are released).
        """
        cfg = self.config
        exe = self._exe
        if exe is None:
            source = self._source
            assert not isinstance(source, Executable)
            exe = await anyio.to_thread.run_sync(
                lambda: Executable.load(source, check_package_hash=cfg.check_package_hash)
            )
            self._exe = exe
        meta = exe.metadata
        where = f"model {meta.model_name!r}"
        self._in_shapes = request_shapes(meta.user_inputs, cfg.batching_dim, where=where)
        self._out_shapes = request_shapes(meta.execute_outputs, cfg.batching_dim, where=where)
        self._plan = (
            FaultPlan.parse(cfg.fault_plan) if isinstance(cfg.fault_plan, str) else cfg.fault_plan
        )
        self._loop = asyncio.get_running_loop()
        wait = cfg.device_wait_config or DeviceWaitConfig()
        try:
            for r in range(cfg.replication_factor):
                if r in cfg.replica_to_device:
                    dev = await self._manager.get_specific_device(
                        cfg.replica_to_device[r], wait_config=wait
                    )
                else:
                    dev = await self._manager.get_device_for(exe, wait_config=wait)
                self._devices.append(dev)
            children = [self._replica_spec(r) for r in range(cfg.replication_factor)]
            children.append(ChildSpec("watchdog", self._make_watchdog))
            self._supervisor = Supervisor(
                "runner", children, strategy=Strategy.ONE_FOR_ONE, clock=self._clock
            )
            self._tg = anyio.create_task_group()
            await self._tg.__aenter__()
            await self._tg.start(self._supervisor.run)
        except SupervisorEscalationError as exc:
            # A replica that cannot start (bad frozen input, a custom op library that is not
            # allowed, ...) is reported as what it is, not as the supervisor giving up.
            await self._abandon_start()
            raise _root_cause(exc) from exc
        except BaseException:
            await self._abandon_start()
            raise
        self._accepting = True
        log.info("runner_started", model=meta.model_name, replicas=cfg.replication_factor)

    async def _abandon_start(self) -> None:
        if self._tg is not None:
            self._tg.cancel_scope.cancel()
            await self._tg.__aexit__(None, None, None)
            self._tg = None
        await self._release_devices()

    def _replica_spec(self, r: int) -> ChildSpec:
        exe = self._executable
        cfg = self.config
        state = ReplicaState(replica=r, device_id=self._devices[r].spec.id)
        self._states.append(state)
        self._queues.append(None)  # type: ignore[arg-type]
        queue_config = QueueConfig(
            batching_dim=cfg.batching_dim,
            timeout=cfg.timeout,
            flush_callback=cfg.flush_callback,
            flush_on_waiting_outputs=cfg.flush_on_waiting_outputs,
            ring_buffer_size_multiplier=cfg.ring_buffer_size_multiplier,
            max_look_ahead=cfg.look_ahead,
            batch_size_timeout=cfg.batch_size_timeout,
            data_parallel_timeout=cfg.data_parallel_timeout,
            is_batch_size_timeout_enabled=cfg.is_batch_size_timeout_enabled,
            request_tracepoints_buffer_size=cfg.request_tracepoints_buffer_size,
        )
        policy = SessionPolicy(
            auto_reset=cfg.auto_reset,
            max_retries=cfg.max_retries,
            execution_timeout=cfg.execution_timeout,
            reset_timeout=cfg.reset_timeout,
            reset_intensity=cfg.reset_intensity,
            reset_period=cfg.reset_period,
            # The seed's max_look_ahead: batches prepared ahead of the device; "unlimited" is
            # ours to choose, and two in the device's queue keep it busy.
            pipeline_depth=2 if cfg.look_ahead is None else 1 + min(cfg.look_ahead, 1),
        )
        sup: Supervisor | None = None

        def make_queue() -> Queue:
            q = Queue(exe.metadata, queue_config, replica=r, clock=self._clock)
            self._queues[r] = q
            return q

        def make_device() -> Device:
            attached = self._devices[r]
            return Device(
                attached,
                create_backend(attached.spec),
                replica=r,
                fault_plan=self._plan,
                clock=self._clock,
                detach_on_stop=False,
                executable=exe,
                frozen_inputs=cfg.frozen_inputs or None,
                variables=state.saved_variables,
            )

        def make_session() -> SessionActor:
            assert sup is not None
            if state.status is not ReplicaStatus.FAILED:  # out of service stays out
                state.set_status(ReplicaStatus.READY)
            return SessionActor(
                replica=r,
                device=sup.ref("device"),
                queue=sup.ref("queue"),
                ready=self._queues[r].ready,
                state=state,
                policy=policy,
                clock=self._clock,
                on_status=self._on_replica_status,
            )

        def make_replica() -> Supervisor:
            nonlocal sup
            if state.status is not ReplicaStatus.FAILED:
                state.set_status(ReplicaStatus.STARTING)
            sup = Supervisor(
                f"replica-{r}",
                [
                    ChildSpec("queue", make_queue, shutdown=cfg.reset_timeout),
                    ChildSpec("device", make_device, shutdown=cfg.reset_timeout),
                    ChildSpec("session", make_session, shutdown=cfg.reset_timeout),
                ],
                strategy=Strategy.REST_FOR_ONE,
                intensity=cfg.reset_intensity,
                period=cfg.reset_period,
                clock=self._clock,
            )
            return sup

        return ChildSpec(f"replica-{r}", make_replica, restart=Restart.TRANSIENT)

    def _make_watchdog(self) -> Watchdog:
        cfg = self.config
        run_deadline = cfg.execution_timeout or 60.0
        tries = cfg.max_retries + 1
        stall_after = cfg.stall_timeout or (run_deadline + cfg.reset_timeout) * (tries + 1)
        return Watchdog(
            self._watch_targets,
            interval=max(0.05, min(1.0, stall_after / 10)),
            stall_after=stall_after,
            clock=self._clock,
        )

    def _watch_targets(self) -> list[WatchTarget]:
        targets = []
        for r, state in enumerate(self._states):

            def waiting(r: int = r) -> int:
                # Read the queue at call time: a restarted queue is a new object.
                return int(self._queues[r].ready.statistics().current_buffer_used)

            async def restart(r: int = r) -> None:
                try:
                    await self._replica_supervisor(r).restart_child("session")
                except ModelRuntimeError as exc:
                    log.warning("session_restart_failed", replica=r, error=str(exc))

            targets.append(
                WatchTarget(
                    state=state,
                    waiting_batches=waiting,
                    restart_session=restart,
                )
            )
        return targets

    async def close(self) -> None:
        """Drain and stop: :meth:`stop` with the configured ``drain_timeout`` as the grace."""
        await self.stop(self.config.drain_timeout)

    async def stop(self, grace: float | None = None) -> None:
        """Stop taking requests, let those in flight finish for up to ``grace`` seconds (None:
        as long as they take), answer what is left with :class:`RunnerStoppedError`, run the
        save programs (``run_save_programs``), stop the actors and detach the devices.

        Every request taken gets exactly one answer. A second call is a no-op.

        Raises:
            nothing: failures while stopping are logged; the devices are always released.
        """
        if self._closed:
            return
        self._closed = True
        self._accepting = False
        sup = self._supervisor
        stopped = RunnerStoppedError("the runner stopped before this request completed")
        try:
            if sup is not None:
                # Draining is part of the grace: a queue whose device hangs cannot drain.
                with anyio.move_on_after(math.inf if grace is None else grace):
                    for r, state in enumerate(self._states):
                        if state.status in (ReplicaStatus.READY, ReplicaStatus.RESETTING):
                            await self._drain_replica(r)
                    await self._wait_outstanding()
                if self.config.run_save_programs:
                    await self._run_save_programs()
                for r in range(len(self._states)):
                    await self._fail_all(r, stopped)
                await sup.stop()
        finally:
            if self._tg is not None:
                self._tg.cancel_scope.cancel()
                await self._tg.__aexit__(None, None, None)
                self._tg = None
            for future in list(self._outstanding):  # the last net: never silence
                if not future.done():
                    future.set_exception(stopped)
            for state in self._states:
                state.set_status(ReplicaStatus.STOPPED)
            await self._release_devices()
        log.info("runner_stopped", model=self._executable.metadata.model_name)

    async def _drain_replica(self, r: int) -> None:
        """Flush replica ``r``'s partial batch so every queued request becomes runnable."""
        try:
            await self._replica_supervisor(r).ref("queue").ask(Drain())
        except ModelRuntimeError as exc:
            log.warning("drain_failed", replica=r, error=str(exc))

    async def _wait_outstanding(self) -> None:
        """Wait until every request taken so far has its answer."""
        while self._outstanding:
            await asyncio.wait(list(self._outstanding))

    async def _run_save_programs(self) -> None:
        for r, state in enumerate(self._states):
            if state.status is not ReplicaStatus.READY:
                continue
            try:
                saved = await self._replica_supervisor(r).ref("session").ask(SaveVariables())
            except ModelRuntimeError as exc:
                log.warning("save_failed", replica=r, error=str(exc))
                continue
            self.config.replica_to_save_programs_outputs[r] = saved

    async def _fail_all(self, r: int, error: BaseException) -> None:
        try:
            await self._replica_supervisor(r).ref("queue").ask(FailAll(error))
        except ModelRuntimeError:
            pass

    async def _release_devices(self) -> None:
        devices, self._devices = self._devices, []
        for dev in devices:
            try:
                dev.detach()
            except ModelRuntimeError as exc:  # pragma: no cover - best effort on shutdown
                log.warning("detach_failed", device=dev.spec.id, error=str(exc))

    def _replica_supervisor(self, r: int) -> Supervisor:
        assert self._supervisor is not None
        child = self._supervisor.ref(f"replica-{r}")
        assert isinstance(child, Supervisor)
        return child

    # -- execution ---------------------------------------------------------------------------

    async def execute(
        self,
        inputs: Mapping[str, np.ndarray],
        outputs: Mapping[str, np.ndarray] | None = None,
        replica_id: int | None = None,
        timeout: float | None = None,
    ) -> dict[str, np.ndarray]:
        """Run the model on ``inputs`` and return its outputs (or fill ``outputs``).

        ``timeout`` bounds the whole request (queue and compute), in seconds.

        Raises:
            InputValidationError: the inputs, outputs or replica_id do not fit the model.
            RunnerStoppedError: the runner is not running.
            ExecutionTimeoutError: the request passed ``timeout``.
            RuntimeFailure: the device failed and recovery (per the config) did not help.
        """
        return await self.execute_async(inputs, outputs, replica_id, timeout)

    def execute_async(
        self,
        inputs: Mapping[str, np.ndarray],
        outputs: Mapping[str, np.ndarray] | None = None,
        replica_id: int | None = None,
        timeout: float | None = None,
    ) -> Awaitable[dict[str, np.ndarray]]:
        """Submit a request now and return an awaitable of its outputs.

        Must be called on the runner's event loop. Raises at once (no awaitable) for the
        errors ``execute`` documents as input errors or a stopped runner.
        """
        if not self._accepting:
            raise RunnerStoppedError("the runner is not running (not started, or closed)")
        exe = self._executable
        meta = exe.metadata
        now = self._clock.monotonic()
        if self.config.validate_io_params:
            arrays, samples = validate_inputs(
                inputs, self._in_shapes, meta.batch_size, self.config.batching_dim is not None
            )
            if outputs is not None:
                validate_outputs(outputs, self._out_shapes, samples)
        else:
            arrays = dict(inputs)
            first = self._in_shapes[0]
            samples = arrays[first.name].shape[first.axis]
        r = self._pick_replica(replica_id)
        assert self._loop is not None
        future: asyncio.Future[dict[str, np.ndarray]] = self._loop.create_future()
        deadline = None if timeout is None else now + timeout
        request = Request(
            inputs=arrays,
            samples=samples,
            future=future,
            outputs=outputs,
            deadline=deadline,
            t_submit=now,
        )
        # The queue's own Enqueue handler, called in place: same loop, same code, one event-loop
        # iteration less per request than a mailbox hop (measured ~7 µs of ~15 µs).
        self._queues[r].enqueue_nowait(request)
        self._outstanding.add(future)
        future.add_done_callback(self._outstanding.discard)
        if timeout is None:
            return future
        return self._with_deadline(future, timeout)

    async def _with_deadline(
        self, future: asyncio.Future[dict[str, np.ndarray]], timeout: float
    ) -> dict[str, np.ndarray]:
        async with move_on_after(self._clock, timeout):
            return await asyncio.shield(future)
        future.cancel()
        raise ExecutionTimeoutError(f"request did not complete within {timeout} s")

    def _on_replica_status(self, r: int, status: ReplicaStatus) -> None:
        """A replica out of service hands its unanswered requests to the others."""
        log.info("replica_status", replica=r, status=status.value)
        if status is not ReplicaStatus.FAILED:
            return
        moved = self._queues[r].evacuate()
        failure = self._states[r].failure
        for old in moved:
            request = Request(
                inputs=old.inputs,
                samples=old.samples,
                future=old.future,
                outputs=old.outputs,
                deadline=old.deadline,
                t_submit=old.t_submit,
            )
            try:
                target = self._pick_replica(None)
            except RunnerStoppedError as exc:
                if not old.future.done():
                    old.future.set_exception(failure or exc)
                continue
            self._queues[target].enqueue_nowait(request)
        if moved:
            log.warning("replica_evacuated", replica=r, requests=len(moved))

    def _pick_replica(self, replica_id: int | None) -> int:
        states = self._states
        n = len(states)
        if replica_id is not None:
            if not 0 <= replica_id < n:
                raise InputValidationError(f"replica_id {replica_id} is out of range [0, {n})")
            return replica_id
        ready = ReplicaStatus.READY
        if n == 1 and states[0].status is ready:
            return 0
        # Least loaded ready replica; ties go round-robin from after the last one picked.
        best = -1
        best_load = math.inf
        queues = self._queues
        start = self._next_replica
        for i in range(n):
            r = start + i
            if r >= n:
                r -= n
            if states[r].status is ready:
                load = queues[r].pending_samples
                if load < best_load:
                    best, best_load = r, load
        if best < 0:
            # Nobody is ready: a replica that is resetting or starting queues the request
            # until it is (bounded by the reset timeout); FAILED ones never take work.
            for r in range(n):
                if states[r].status in (ReplicaStatus.RESETTING, ReplicaStatus.STARTING):
                    return r
            raise RunnerStoppedError("no replica is in service")
        self._next_replica = best + 1 if best + 1 < n else 0
        return best

    # -- descriptions and statistics -----------------------------------------------------------

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

    def replica_status(self) -> list[ReplicaStatus]:
        """The status of every replica."""
        return [s.status for s in self._states]

    def replica_states(self) -> list[ReplicaState]:
        """Every replica's live state (status, device, runs, resets); read, do not modify."""
        return list(self._states)

    @property
    def is_ready(self) -> bool:
        """True while at least one replica takes requests."""
        return self._accepting and any(s.is_ready for s in self._states)

    async def _stats(self, replica_id: int) -> StatisticsView:
        if not 0 <= replica_id < len(self._states):
            raise InputValidationError(f"replica_id {replica_id} is out of range")
        return StatisticsView(await self._queues[replica_id].ref.ask(GetStats()))

    async def get_time_trace(self, replica_id: int = 0) -> dict[str, float]:
        """Durations (µs) of the last request on ``replica_id`` (seed key names)."""
        return (await self._stats(replica_id)).time_trace()

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

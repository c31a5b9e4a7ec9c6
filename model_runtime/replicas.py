"""The replicas of one runner: their devices and their supervisor tree.

:class:`ReplicaSet` builds the tree the :class:`~model_runtime.runner.ModelRunner` runs::

    Supervisor "runner"                    one_for_one
     ├─ Supervisor "replica-r"             rest_for_one, r = 0..R-1
     │   ├─ Queue r      callers' requests (first: a device restart never drops them)
     │   ├─ Device r     the backend, in its own worker thread
     │   └─ Session r    ready batch -> Device r -> outputs -> Queue r
     └─ Watchdog         restarts a session that stops making progress

and keeps what outlives the actors: each replica's :class:`ReplicaState`, its current Queue
(read on the hot path without messaging), and the attached devices. A replica that goes out of
service hands its unanswered requests to the others (:meth:`ReplicaSet.on_status`). Who takes
a request is :mod:`model_runtime.placement`'s. A device runs a short batch inline on the loop
only while no other replica's device is busy (``Device.runs_inline``): the loop it would stall
serves them too.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import structlog

from actors.clock import Clock
from actors.device.actor import Device
from actors.device.backends import create_backend
from actors.device.backends.ort_sessions import OrtSession
from actors.device.faults import FaultPlan
from actors.device.manager import AttachedDevice, DeviceManager
from actors.queues.actor import Queue
from actors.queues.config import QueueConfig
from actors.queues.messages import Drain, FailAll
from actors.queues.request import Request
from actors.session.actor import SaveVariables, SessionActor
from actors.session.runs import SessionPolicy
from actors.session.state import ReplicaState, ReplicaStatus
from actors.supervision import Backoff, ChildSpec, Restart, Strategy, Supervisor
from actors.watchdog import Watchdog, WatchTarget
from model_runtime.errors import (
    ModelRuntimeError,
    RunnerStoppedError,
)
from model_runtime.executable import Executable
from model_runtime.placement import Placement, host_standby
from model_runtime.runner_config import ModelRunnerConfig

__all__ = ["ReplicaSet"]

#: Seconds over which a replica's restarts count toward its supervisor's intensity; progress
#: (a successful batch) forgives them earlier.
_RESTART_PERIOD = 60.0

log = structlog.get_logger(__name__)


class ReplicaSet(Placement):
    """R replicas of one executable on R attached devices (see the module docstring)."""

    def __init__(
        self,
        executable: Executable,
        config: ModelRunnerConfig,
        devices: list[AttachedDevice],
        *,
        fault_plan: FaultPlan | None,
        clock: Clock,
        manager: DeviceManager | None = None,
    ) -> None:
        self._exe = executable
        self._manager = manager
        self.closing = False
        self._config = config
        self._clock = clock
        # One injector per replica for its whole life: a restarted device goes on counting.
        self._faults = [
            fault_plan.for_replica(r) if fault_plan else None for r in range(len(devices))
        ]
        self.devices = devices
        self.states = [ReplicaState(replica=r, device_id=d.spec.id) for r, d in enumerate(devices)]
        self.queues: list[Queue] = [self._new_queue(r) for r in range(len(devices))]
        #: Each replica's current device actor (replaced when the replica restarts).
        self.device_actors: list[Device | None] = [None] * len(devices)
        #: Session actors made per replica: every one after the first is a restart (a session
        #: is the last child of its replica's rest-for-one supervisor, so any restart in the
        #: replica makes a new one, once).
        self._sessions_made = [0] * len(devices)
        self._next, self._filling, self._room, self._collecting = 0, -1, 0, -1  # .placement's
        self.stand_by(host_standby([d.spec for d in devices], config.cores()))
        # The model's supervisor replaces a replica subtree that gave up (restarts without
        # progress) after a backoff that grows to the probe cap, and counts a child's run as
        # stable only after a minute: paced like that, even every replica failing forever
        # stays under the intensity, so the model never gives up on a replica that might
        # come back; only a tree that cannot be rebuilt at all escalates to the root.
        children = len(devices) + 1
        self.supervisor = Supervisor(
            "model",
            [*(self._replica_spec(r) for r in range(len(devices))), self._watchdog_spec()],
            strategy=Strategy.ONE_FOR_ONE,
            intensity=10 * children,
            period=60.0,
            backoff=Backoff(
                initial=config.probe_backoff_initial,
                cap=config.probe_backoff_cap,
                reset_after=60.0,
            ),
            clock=clock,
        )

    # -- the tree ----------------------------------------------------------------------------

    def _new_queue(self, r: int) -> Queue:
        cfg = self._config
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
        return Queue(
            self._exe.metadata,
            queue_config,
            replica=r,
            clock=self._clock,
            handoff=lambda moved, error: self._reroute(r, moved, error),
        )

    def _replica_spec(self, r: int) -> ChildSpec:
        cfg = self._config
        state = self.states[r]
        policy = SessionPolicy(
            auto_reset=cfg.auto_reset,
            max_retries=cfg.max_retries,
            execution_timeout=cfg.execution_timeout,
            reset_timeout=cfg.reset_timeout,
            max_failed_recoveries=cfg.max_failed_recoveries,
            probe_initial=cfg.probe_backoff_initial,
            probe_cap=cfg.probe_backoff_cap,
            # The seed's max_look_ahead: batches prepared ahead of the device; "unlimited" is
            # ours to choose, and two in the device's queue keep it busy.
            pipeline_depth=2 if cfg.look_ahead is None else 1 + min(cfg.look_ahead, 1),
        )
        sup: Supervisor | None = None
        first = True

        def make_queue() -> Queue:
            nonlocal first
            if not first:  # a restarted queue is a fresh one (the first was built up front)
                self.queues[r] = self._new_queue(r)
            first = False
            return self.queues[r]

        def make_device() -> Device:
            attached = self.devices[r]
            device = self.device_actors[r] = Device(
                attached,
                create_backend(attached.spec),
                replica=r,
                fault_injector=self._faults[r],
                clock=self._clock,
                detach_on_stop=False,
                executable=self._exe,
                frozen_inputs=cfg.frozen_inputs or None,
                variables=state.saved_variables,
                inline_allowed=None if len(self.devices) == 1 else lambda: self._others_idle(r),
            )
            return device

        def make_session() -> SessionActor:
            assert sup is not None
            replica_sup = sup
            if self._sessions_made[r]:
                state.restarts += 1
            self._sessions_made[r] += 1
            return SessionActor(
                replica=r,
                device=sup.ref("device"),
                queue=sup.ref("queue"),
                ready=self.queues[r].ready,
                layout=self.queues[r].layout,
                state=state,
                policy=policy,
                clock=self._clock,
                on_status=self.on_status,
                on_progress=replica_sup.forgive,
                reattach=lambda: self._reattach(r),
                stateful=bool(self._exe.metadata.variables),
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
                # Restarts without progress (the session forgives them on its next good
                # batch): a crash storm the device survives never takes the replica out.
                intensity=cfg.max_failed_recoveries,
                period=_RESTART_PERIOD,
                clock=self._clock,
            )
            return sup

        # A replica subtree that gave up is replaced, after the supervisor's backoff; its queue
        # hands its requests to the other replicas as it stops.
        return ChildSpec(f"replica-{r}", make_replica, restart=Restart.PERMANENT)

    def _others_idle(self, r: int) -> bool:
        """No other replica's device is busy: only then may a run of replica ``r`` hold the
        loop (``Device.runs_inline``), which would stall what the loop does for the others."""
        for i, device in enumerate(self.device_actors):
            if i != r and device is not None and device.busy:
                return False
        return True

    def _watchdog_spec(self) -> ChildSpec:
        cfg = self._config
        # Hangs inside a run are the session's (its execution deadline); the watchdog is the
        # last resort for a session that stops itself: well past a run, a reset and a retry.
        run_deadline = cfg.execution_timeout or 10.0
        tries = cfg.max_retries + 1
        stall_after = cfg.stall_timeout or (run_deadline + cfg.reset_timeout) * (tries + 1)

        def make_watchdog() -> Watchdog:
            return Watchdog(
                self._watch_targets,
                interval=max(0.05, min(1.0, stall_after / 10)),
                stall_after=stall_after,
                clock=self._clock,
            )

        return ChildSpec("watchdog", make_watchdog)

    def _watch_targets(self) -> list[WatchTarget]:
        targets = []
        for r, state in enumerate(self.states):

            def waiting(r: int = r) -> int:
                # Read the queue at call time: a restarted queue is a new object.
                return int(self.queues[r].ready.statistics().current_buffer_used)

            async def restart(r: int = r) -> None:
                try:
                    await self.replica_supervisor(r).restart_child("session")
                except ModelRuntimeError as exc:
                    log.warning("session_restart_failed", replica=r, error=str(exc))

            targets.append(
                WatchTarget(state=state, waiting_batches=waiting, restart_session=restart)
            )
        return targets

    def replica_supervisor(self, r: int) -> Supervisor:
        """The supervisor of replica ``r``.

        Raises:
            ActorStoppedError: the replica is not running.
        """
        child = self.supervisor.ref(f"replica-{r}")
        assert isinstance(child, Supervisor)
        return child

    # -- what the replicas run ---------------------------------------------------------------

    def memory(self) -> tuple[int, list[dict[str, int]]]:
        """Bytes of the shared sessions the replicas run (each counted once), and what each
        replica adds beside them (its own session, its state: ``CpuBackend.memory``)."""
        shared: dict[int, int] = {}
        replicas: list[dict[str, int]] = []
        for device in self.device_actors:
            backend = device.backend if device is not None else None
            memory = getattr(backend, "memory", None)
            replicas.append(memory() if callable(memory) else {})
            session = getattr(backend, "ort_session", None)
            if session is not None and session.key is not None:
                shared[id(session)] = session.built_bytes
        return sum(shared.values()), replicas

    def shared_sessions(self) -> list[OrtSession] | None:
        """The onnxruntime sessions the replicas run, when every replica runs a shared one
        (``OrtSession.key`` set: .ort_sessions), else None."""
        sessions: dict[int, OrtSession] = {}
        for device in self.device_actors:
            session = getattr(device.backend, "ort_session", None) if device else None
            if session is None or session.key is None:
                return None
            sessions[id(session)] = session
        return list(sessions.values())

    # -- out of service and back ----------------------------------------------------------------

    def on_status(self, r: int, status: ReplicaStatus) -> None:
        """A replica out of service hands its unanswered requests to the others; one back in
        service takes requests again."""
        log.info("replica_status", replica=r, status=status.value)
        if status is ReplicaStatus.READY:
            self.queues[r].resume()
        elif status is ReplicaStatus.FAILED:
            self._reroute(r, self.queues[r].evacuate(), None)

    def _reroute(self, r: int, moved: list[Request], error: BaseException | None) -> None:
        """Queue requests that replica ``r`` could not answer on other replicas in service.

        A request fails (with ``error``, or the replica's failure) only when every replica in
        service has failed it already, or the runner is closing.
        """
        failure = error or self.states[r].failure
        stopped = RunnerStoppedError("the runner stopped before this request completed")
        for old in moved:
            request = Request(
                inputs=old.inputs,
                samples=old.samples,
                future=old.future,
                outputs=old.outputs,
                deadline=old.deadline,
                t_submit=old.t_submit,
                tried=old.tried | 1 << r,
                waiting=True,  # a moved request is flushed as any other: it waited already
                priority=old.priority,
            )
            try:
                if self.closing:
                    raise stopped
                target = self.pick(None, avoid=request.tried)
            except RunnerStoppedError as exc:
                if not old.future.done():
                    old.future.set_exception(failure if failure and not self.closing else exc)
                continue
            self.queues[target].enqueue_nowait(request)
        if moved:
            log.warning("replica_evacuated", replica=r, requests=len(moved))

    async def _reattach(self, r: int) -> None:
        """Give replica ``r`` a fresh device (another free one if there is one, else its own
        again) and restart its Device actor and, rest_for_one, its session.

        Raises:
            nothing: when no device can be attached the replica stays out of service and the
                session probes again later.
        """
        if self._manager is None or self._config.replica_to_device:
            return  # a pinned device is re-probed where it is
        old = self.devices[r]
        try:
            new = await self._manager.get_device_for(self._exe)
        except ModelRuntimeError:
            old.detach()
            try:
                new = await self._manager.get_device_for(self._exe)
            except ModelRuntimeError as exc:
                log.warning("reattach_failed", replica=r, error=str(exc))
                return
        else:
            old.detach()
        self.devices[r] = new
        self.states[r].device_id = new.spec.id
        log.warning("replica_reattached", replica=r, old=old.spec.id, new=new.spec.id)
        await self.replica_supervisor(r).restart_child("device")

    # -- stopping --------------------------------------------------------------------------

    async def drain(self) -> None:
        """Flush every serving replica's partial batch so every queued request can run."""
        for r, state in enumerate(self.states):
            if state.status in (ReplicaStatus.READY, ReplicaStatus.RESETTING):
                try:
                    await self.replica_supervisor(r).ref("queue").ask(Drain())
                except ModelRuntimeError as exc:
                    log.warning("drain_failed", replica=r, error=str(exc))

    async def run_save_programs(self) -> dict[int, dict[str, np.ndarray]]:
        """Each READY replica's variables, from its save programs."""
        saved: dict[int, dict[str, np.ndarray]] = {}
        for r, state in enumerate(self.states):
            if state.status is not ReplicaStatus.READY:
                continue
            try:
                variables: Mapping[str, np.ndarray] = (
                    await self.replica_supervisor(r).ref("session").ask(SaveVariables())
                )
            except ModelRuntimeError as exc:
                log.warning("save_failed", replica=r, error=str(exc))
                continue
            saved[r] = dict(variables)
        return saved

    async def wait_answered(self) -> None:
        """Return once no queue holds an unanswered request (requests that move between
        replicas meanwhile are followed)."""
        while any(q.inflight_requests > 0 for q in self.queues):
            for queue in list(self.queues):
                await queue.wait_answered()

    def fail_everything(self, error: BaseException) -> None:
        """Answer every request still in any queue with ``error``, at once."""
        for queue in self.queues:
            queue.fail_everything(error)

    async def fail_all(self, error: BaseException) -> None:
        """Answer every request still in a queue with ``error``."""
        for r in range(len(self.states)):
            try:
                await self.replica_supervisor(r).ref("queue").ask(FailAll(error))
            except ModelRuntimeError:
                pass

    def release_devices(self) -> None:
        """Detach every device (idempotent)."""
        devices, self.devices = self.devices, []
        for dev in devices:
            try:
                dev.detach()
            except ModelRuntimeError as exc:  # pragma: no cover - best effort on shutdown
                log.warning("detach_failed", device=dev.spec.id, error=str(exc))

"""``ModelRunner``: many concurrent callers share replicated devices through ``execute()``.

A facade over the actor tree that :class:`~model_runtime.replicas.ReplicaSet` builds (one
Queue, Device and Session per replica under a rest_for_one supervisor, and a Watchdog).

``execute()`` validates on the event loop, picks a replica (``replica_id``, or the ready one
that would run it soonest: ``ReplicaSet.pick``) and hands a :class:`Request` to that replica's
Queue in place — the Queue's own Enqueue handler on the same loop, no mailbox trip, no thread
hop, no copy until the Queue packs the rows into a pooled batch buffer. The caller awaits a
future the Queue resolves.

Its bases are the rest of it: what a request goes through before a queue (validation,
admission bounds, deadlines: :mod:`model_runtime.runner_requests`) and what it tells about its
model and replicas (:mod:`model_runtime.runner_info`).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping
from types import TracebackType
from typing import Any

import anyio
import numpy as np
import structlog

from actors.clock import Clock, SystemClock
from actors.device.backends.native_heap import give_back_freed
from actors.device.backends.ort_sessions import OrtSession
from actors.device.faults import FaultPlan
from actors.device.manager import AttachedDevice, DeviceManager
from actors.device.wait import DeviceWaitConfig
from actors.queues.actor import Queue
from actors.queues.request import Request
from actors.queues.tracing import CURRENT as CURRENT_TRACE, STATE as TRACING
from actors.session.state import ReplicaState, ReplicaStatus
from model_runtime import queue_policy
from model_runtime.errors import (
    ModelRuntimeError,
    RunnerStoppedError,
    SupervisorEscalationError,
)
from model_runtime.executable import Executable
from model_runtime.executable.limits import check_allocation
from model_runtime.io import request_shapes
from model_runtime.placement import JOIN_HOPS
from model_runtime.replicas import ReplicaSet
from model_runtime.runner_config import ModelRunnerConfig
from model_runtime.runner_info import RunnerInfo
from model_runtime.runner_requests import RunnerRequests
from supervisor import Runtime

__all__ = ["ModelRunner", "ModelRunnerConfig"]

log = structlog.get_logger(__name__)
_model_ids = itertools.count(1)
_READY = ReplicaStatus.READY  # read per request: a module global, not an enum lookup
_NDARRAY = np.ndarray
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


def _no_loop() -> asyncio.Future[dict[str, np.ndarray]]:
    raise RunnerStoppedError("the runner has not been started")


def _store_saved(
    into: dict[int, dict[str, np.ndarray]], saved: Mapping[int, Mapping[str, np.ndarray]]
) -> None:
    """Put the save programs' outputs where the caller asked: a buffer the caller placed in
    ``replica_to_save_programs_outputs`` is filled in place (the seed writes to caller memory),
    any other variable gets a new array."""
    for replica, variables in saved.items():
        slots = into.setdefault(replica, {})
        for name, value in variables.items():
            buffer = slots.get(name)
            if isinstance(buffer, np.ndarray) and buffer.shape == value.shape:
                np.copyto(buffer, value, casting="same_kind")
            else:
                slots[name] = value


class ModelRunner(RunnerRequests, RunnerInfo):
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
        #: The onnxruntime sessions the replicas share, held for the runner's life (see
        #: :meth:`_release_weights`).
        self._sessions: list[OrtSession] = []
        self._replicas: ReplicaSet | None = None
        self._root: Runtime | None = None
        self._model_id = ""
        self._failure: BaseException | None = None
        self._accepting = False
        self._closed = False
        self._in_shapes: tuple[Any, ...] = ()
        self._out_shapes: tuple[Any, ...] = ()
        self._loop: asyncio.AbstractEventLoop | None = None
        #: validated input signatures: ((name, dtype, shape), ...) -> samples
        #: (for one input, just its (name, dtype, shape))
        self._signatures: dict[tuple[Any, ...], int] = {}
        #: the last one-array signature looked up: (name, dtype, shape, samples); a request
        #: like the one before costs comparisons, not hashing a dtype
        self._last_one: tuple[Any, ...] = (None, None, None, 0)
        #: execute()'s shortcuts into the replica set: its queues (a list kept in place when a
        #: queue is replaced), and its one replica's state if it has one (whose queue execute()
        #: takes while it is READY: pick's rule for one replica, without the call)
        self._queues: list[Queue] = []
        self._lone: ReplicaState | None = None
        self._lone_r = 0
        self._lone_hops = math.inf
        self._strings = False  # string inputs: every request's elements are checked
        self._dynamic = False  # dynamic dimensions: each new shape's batch bytes are checked
        self._now = self._clock.monotonic
        #: a bound to check before queueing (max_queue_size or latency_budget); set by start()
        self._admission = False
        #: requests count as awaited when queued (else: not until their caller awaits)
        self._waiting = True
        #: accepting, and execute() may submit a plain request itself (no admission bounds,
        #: requests awaited when queued)
        self._plain = False
        self._create_future: Callable[[], asyncio.Future[dict[str, np.ndarray]]] = _no_loop

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
        """Load the executable, attach devices and add the model's subtree to the runtime's
        tree; returns once every replica serves. Works from any task; so does :meth:`stop`.

        Raises:
            InvalidExecutableError: the executable cannot be loaded.
            DeviceUnavailableError: devices could not be attached per ``device_wait_config``.
            RunnerStoppedError: the runner was started before.
            ModelRuntimeError: any other failure while starting (devices are released).
        """
        if self._root is not None or self._closed:
            raise RunnerStoppedError("a runner starts once (make a new one to start again)")
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
        # What the metadata implies (pools, outputs, device copies) is checked before anything
        # is allocated: a sealed file with absurd iterations is refused, not an OOM.
        check_allocation(
            meta,
            cfg.ring_buffer_size_multiplier,
            replicas=cfg.replication_factor,
            tensor_bytes=exe.total_tensor_bytes(),
        )
        where = f"model {meta.model_name!r}"
        self._in_shapes = request_shapes(meta.user_inputs, cfg.batching_dim, where=where)
        self._out_shapes = request_shapes(meta.execute_outputs, cfg.batching_dim, where=where)
        self._strings = any(s.strings for s in self._in_shapes)
        self._dynamic = meta.is_dynamic
        self._admission = (
            cfg.max_queue_size is not None
            or cfg.latency_budget is not None
            or cfg.queue_policy is not None
        )
        self._waiting = not cfg.flush_on_waiting_outputs
        plan = (
            FaultPlan.parse(cfg.fault_plan) if isinstance(cfg.fault_plan, str) else cfg.fault_plan
        )
        self._loop = asyncio.get_running_loop()
        self._create_future = self._loop.create_future
        wait = cfg.device_wait_config or DeviceWaitConfig()
        devices: list[AttachedDevice] = []
        self._root = root = await Runtime.acquire()
        self._model_id = f"{meta.model_name}#{next(_model_ids)}"
        added = False
        try:
            for r in range(cfg.replication_factor):
                if r in cfg.replica_to_device:
                    dev = await self._manager.get_specific_device(
                        cfg.replica_to_device[r], wait_config=wait
                    )
                else:
                    dev = await self._manager.get_device_for(exe, wait_config=wait)
                devices.append(dev)
            self._replicas = ReplicaSet(
                exe, cfg, devices, fault_plan=plan, clock=self._clock, manager=self._manager
            )
            added = True
            await root.add_model(self._model_id, self._replicas.supervisor, self._on_exit)
        except SupervisorEscalationError as exc:
            # A replica that cannot start (bad frozen input, a custom op library that is not
            # allowed, ...) is reported as what it is, not as the supervisor giving up.
            await self._abandon_start(devices, added)
            raise _root_cause(exc) from exc
        except BaseException:
            await self._abandon_start(devices, added)
            raise
        self._release_weights(exe)
        self._accepting = True
        self._plain = self._waiting and not self._admission
        replicas = self._replicas
        self._queues = replicas.queues
        # The replica in service when it is the only one (the others, if any, standing by):
        # the common request goes there without a pick while it is ready.
        sole = 0 if cfg.replication_factor == 1 else replicas.sole()
        self._lone = replicas.states[sole] if sole >= 0 else None
        self._lone_r = sole  # (an index: a restarted replica's queue is a new one)
        # Beside replicas standing by, only while its batches are light (placement's rule).
        self._lone_hops = math.inf if cfg.replication_factor == 1 else JOIN_HOPS
        standby = [r for r in range(cfg.replication_factor) if replicas.standing_by(r)]
        log.info(
            "runner_started",
            model=meta.model_name,
            replicas=cfg.replication_factor,
            **({"standby": standby} if standby else {}),
        )

    def _release_weights(self, exe: Executable) -> None:
        """Once every replica runs a shared session, hold those sessions for the runner's life
        and release the weights they hold a copy of from an executable this runner loaded
        itself (issue 34: the model then holds its weights once; a caller's own Executable is
        left alone). A new session (another kind of device) reads them again, verified."""
        assert self._replicas is not None
        sessions = self._replicas.shared_sessions()
        if sessions is None:
            return
        self._sessions = sessions
        if not isinstance(self._source, Executable):
            freed = exe.release(w for s in sessions for w in s.weights)
            if freed:
                # Released is not returned: the C heap keeps freed pages unless told.
                returned = give_back_freed()
                log.info(
                    "weights_released",
                    model=exe.metadata.model_name,
                    bytes=freed,
                    returned_bytes=returned,
                )

    async def _abandon_start(self, devices: list[AttachedDevice], added: bool) -> None:
        root, self._root = self._root, None
        self._closed = True
        if root is not None:
            if added:  # a cancelled start may have added the subtree all the same
                await root.remove_model(self._model_id)
            await root.release()
        for dev in devices:
            dev.detach()

    def _on_exit(self, reason: BaseException | None) -> None:
        """The model's subtree ended by itself (it gave up): no more requests are taken."""
        self._accepting = self._plain = False
        self._failure = _root_cause(reason) if reason is not None else None
        log.error("model_gave_up", model=self._executable.metadata.model_name, error=repr(reason))
        if self._replicas is not None:
            for state in self._replicas.states:
                state.set_status(ReplicaStatus.FAILED)

    async def close(self) -> None:
        """Drain and stop: :meth:`stop` with the configured ``drain_timeout`` as the grace."""
        await self.stop(self.config.drain_timeout)

    async def stop(self, grace: float | None = None) -> None:
        """Stop taking requests, let those in flight finish for up to ``grace`` seconds (None:
        as long as they take), answer what is left with :class:`RunnerStoppedError`, run the
        save programs (``run_save_programs``), remove the model's subtree from the runtime's
        tree and detach the devices. Works from any task, not only the one that started it.

        Every request taken gets exactly one answer. A second call is a no-op.

        Raises:
            nothing: failures while stopping are logged; the devices are always released.
        """
        if self._closed:
            return
        self._closed = True
        self._accepting = self._plain = False
        replicas = self._replicas
        root, self._root = self._root, None
        stopped = RunnerStoppedError("the runner stopped before this request completed")
        try:
            if replicas is not None:
                replicas.closing = True
                # Draining is part of the grace: a queue whose device hangs cannot drain.
                with anyio.move_on_after(math.inf if grace is None else grace):
                    await replicas.drain()
                    await replicas.wait_answered()
                if self.config.run_save_programs:
                    saved = await replicas.run_save_programs()
                    _store_saved(self.config.replica_to_save_programs_outputs, saved)
                await replicas.fail_all(stopped)
        finally:
            with anyio.CancelScope(shield=True):
                if root is not None:
                    await root.remove_model(self._model_id)
                    await root.release()
            if replicas is not None:
                replicas.fail_everything(stopped)  # the last net: never silence
                for state in replicas.states:
                    state.set_status(ReplicaStatus.STOPPED)
                replicas.release_devices()
            self._sessions = []  # a closed runner that is still referenced holds no session
        log.info("runner_stopped", model=self._executable.metadata.model_name)

    # -- execution ---------------------------------------------------------------------------

    async def execute(
        self,
        inputs: Mapping[str, np.ndarray],
        outputs: Mapping[str, np.ndarray] | None = None,
        replica_id: int | None = None,
        timeout: float | None = None,
        priority: int = 0,
        queue_timeout: float | None = None,
        delay: bool = False,
    ) -> dict[str, np.ndarray]:
        """Run the model on ``inputs`` and return its outputs (or fill ``outputs``).

        ``timeout`` bounds the whole request (queue and compute), in seconds. ``priority``:
        waiting requests of a higher priority are packed into batches first, FIFO among
        equals (0 is the default level; negative values wait behind it). ``queue_timeout``
        bounds its wait to be packed into a batch (Triton's queue policy,
        :mod:`model_runtime.queue_policy`): past it, a request still waiting fails with
        RequestTimeoutError, or with ``delay`` goes behind the others of its priority.
        ``inputs`` (the
        mapping and its arrays) is read when the request is packed into a batch: leave it
        unchanged until this returns.

        Raises:
            InputValidationError: the inputs, outputs or replica_id do not fit the model.
            QueueFullError: ``max_queue_size`` requests already wait (nothing was queued).
            RunnerStoppedError: the runner is not running.
            RequestTimeoutError: the request passed ``timeout`` (an ExecutionTimeoutError).
            RuntimeFailure: the device failed and recovery (per the config) did not help.
        """
        if (
            self._plain
            and outputs is None
            and timeout is None
            and queue_timeout is None
            and replica_id is None
            and type(inputs) is dict
            and len(inputs) == 1
        ):
            # The common request, submitted here (what execute_async does for it, without its
            # checks for what it is not): one array like the one before, validated when first
            # seen; no deadline; a runner without admission bounds. The caller's dict is the
            # request's inputs, not a copy: the caller awaits the answer (and the docstring asks
            # every caller to leave its inputs unchanged until then).
            ((name, value),) = inputs.items()
            last = self._last_one
            if (
                type(value) is _NDARRAY
                and value.dtype is last[1]
                and value.shape == last[2]
                and name == last[0]
            ):
                now = self._now()
                lone = self._lone
                if (
                    lone is not None
                    and lone.status is _READY
                    and now < lone.hung_after
                    and lone.batch_hops < self._lone_hops
                ):
                    queue = self._queues[self._lone_r]
                else:
                    replicas = self._replicas
                    assert replicas is not None
                    queue = self._queues[replicas.pick(None, 0, now, last[3])]
                future = self._create_future()
                request = Request(inputs, last[3], future, now, priority)
                if TRACING.on:
                    request.trace = CURRENT_TRACE.get()
                if queue.enqueue_nowait(request, now):
                    await asyncio.sleep(0)  # answered in place: still let the loop run the others
                return await future
        pending = self.execute_async(
            inputs, outputs, replica_id, timeout, priority, queue_timeout, delay
        )
        if isinstance(pending, asyncio.Future) and pending.done():
            await asyncio.sleep(0)  # answered in place: still let the loop run the others
        return await pending

    def execute_async(
        self,
        inputs: Mapping[str, np.ndarray],
        outputs: Mapping[str, np.ndarray] | None = None,
        replica_id: int | None = None,
        timeout: float | None = None,
        priority: int = 0,
        queue_timeout: float | None = None,
        delay: bool = False,
    ) -> Awaitable[dict[str, np.ndarray]]:
        """Submit a request now and return an awaitable of its outputs.

        Must be called on the runner's event loop. Raises at once (no awaitable) for the
        errors ``execute`` documents as input errors, a full queue or a stopped runner. A lone
        request on an idle replica whose run is shorter than a few thread hops is run before this
        returns (the awaitable is done).
        """
        if not self._accepting:
            if self._failure is not None:
                raise RunnerStoppedError(
                    f"the runner gave up after an unrecoverable failure: {self._failure}"
                )
            raise RunnerStoppedError("the runner is not running (not started, or closed)")
        now = self._now()
        arrays, samples = self._checked(inputs, outputs)
        replicas = self._replicas
        assert replicas is not None
        if self._admission:
            self._admit(replicas, samples)
            if (policy := self.config.queue_policy) is not None:
                policy.admit(priority, replicas.queues, self._executable.metadata.model_name)
                priority = queue_policy.queue_priority(priority)
        queue = replicas.queues[replicas.pick(replica_id, 0, now, samples)]
        assert self._loop is not None
        future: asyncio.Future[dict[str, np.ndarray]] = self._loop.create_future()
        waiting = self._waiting
        # Positional: a third of the cost of keywords on this per-request path. The fields:
        # inputs, samples, future, t_submit, priority, outputs, deadline, tried, waiting.
        request = Request(
            arrays,
            samples,
            future,
            now,
            priority,
            outputs,
            None if timeout is None else now + timeout,
            0,
            waiting,
        )
        if TRACING.on:
            request.trace = CURRENT_TRACE.get()
        # The queue's own Enqueue handler, called in place: same loop, same code, one event-loop
        # iteration less per request than a mailbox hop (measured ~7 µs of ~15 µs).
        queue.enqueue_nowait(request, now)
        if queue_timeout is not None:
            assert self._loop is not None
            past = queue_policy.delay if delay else queue_policy.reject
            self._loop.call_later(queue_timeout, past, queue, request, queue_timeout)
        if timeout is None:
            if waiting:
                return future
            return self._when_awaited(future, lambda: queue.waiting(request))
        wake = None if waiting else (lambda: queue.waiting(request))
        return self._with_deadline(future, timeout, wake)

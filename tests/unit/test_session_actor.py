"""The SessionActor's recovery rules (DESIGN.md §7), on a fake clock.

Each test drives a real Queue, a real Device (cpu backend, tiny executable) made to fail by a
FaultPlan, and the session, wired as ``model_runtime/replicas.py`` wires a replica: Queue,
Device, Session under a rest_for_one supervisor. Time only moves when a test advances the
fake clock; device runs happen in the device's worker thread, so waits for them poll a
condition (bounded), never sleep for ordering.

Covered here and not by the fault suite: retry exhaustion, the progress rule (faults with
progress between never take a replica out; failed recoveries in a row do), the probe backoff,
one reset per fault across concurrent batches, poisoned data, and the derived hang deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import numpy as np
import pytest
from device_fixtures import tiny_exe
from onnx import numpy_helper

from actors.clock import FakeClock
from actors.device import (
    AttachedDevice,
    CpuBackend,
    Device,
    DeviceSpec,
    FaultInjector,
    FaultPlan,
    RunSave,
)
from actors.queues.actor import Queue
from actors.queues.batch import Batch
from actors.queues.config import QueueConfig
from actors.queues.request import Request
from actors.session.actor import SessionActor
from actors.session.runs import SessionPolicy
from actors.session.state import ReplicaState, ReplicaStatus
from actors.supervision import ChildSpec, Strategy, Supervisor, SupervisorEvent
from model_runtime.compiler import CompileOptions, compile_executable
from model_runtime.errors import (
    DeviceStateError,
    ExecutionTimeoutError,
    InputValidationError,
    RecoverableRuntimeError,
    RecoveryAction,
    RuntimeFailure,
    UnrecoverableRuntimeError,
)
from model_runtime.executable import Executable
from model_runtime.executable.testing import tiny_tensors
from tests.models import make_embedding, make_mlp

pytestmark = pytest.mark.timeout(60)

SPEC = DeviceSpec(0, "cpu", 1)
TINY = tiny_exe(batch=2)  # one request of 2 rows fills a batch exactly
_TENSORS = tiny_tensors(0)
#: The only override of the default policy where a test needs resets: the seed's default
#: auto_reset is off, and without it a recoverable fault is simply raised.
AUTO_RESET = SessionPolicy(auto_reset=True)
#: Bound (real seconds) on any wait for the device's worker thread.
WAIT = 10.0


def tiny_rows(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((2, 4)).astype(np.float32)


def check_tiny(answer: dict[str, np.ndarray], x: np.ndarray) -> None:
    np.testing.assert_allclose(answer["y"], x @ _TENSORS["W"] + _TENSORS["b"], rtol=1e-5)


class GatedBackend(CpuBackend):
    """A cpu backend whose save programs each wait for their own gate: a save holds the
    device's one worker thread, so the main runs asked meanwhile queue up behind it. A reset
    (``terminate``) opens the gates of the saves under way, as it ends a real stuck run."""

    def __init__(self, spec: DeviceSpec) -> None:
        super().__init__(spec)
        self.gates = [threading.Event() for _ in range(4)]
        self.entered = [threading.Event() for _ in range(4)]
        self._saves = 0

    def run_save(self) -> dict[str, np.ndarray]:
        i, self._saves = self._saves, self._saves + 1
        self.entered[i].set()
        self.gates[i].wait(WAIT)
        return super().run_save()

    def terminate(self) -> None:
        for gate in self.gates[: self._saves]:
            gate.set()
        super().terminate()

    def open_all(self) -> None:
        for gate in self.gates:
            gate.set()


@dataclass(eq=False)
class Replica:
    """One replica's actors and what the test watches of them."""

    clock: FakeClock
    state: ReplicaState
    injector: FaultInjector
    queue: Queue
    sup: Supervisor
    devices: list[Device]
    statuses: list[ReplicaStatus] = field(default_factory=list)
    events: list[SupervisorEvent] = field(default_factory=list)
    #: Set to the first abnormal exit of a child: a test fails at once, not at its timeout.
    crashed: asyncio.Future[SupervisorEvent] = field(init=False)

    def submit(self, name: str, rows: np.ndarray) -> asyncio.Future[dict[str, np.ndarray]]:
        """Queue one request, as ModelRunner.execute_async does."""
        future: asyncio.Future[dict[str, np.ndarray]] = asyncio.get_running_loop().create_future()
        request = Request(
            inputs={name: rows},
            samples=rows.shape[0],
            future=future,
            t_submit=self.clock.monotonic(),
        )
        self.queue.enqueue_nowait(request)
        return future

    def status(self) -> ReplicaStatus:
        """The replica's status now (a call: type checkers do not narrow it across awaits)."""
        return self.state.status

    @property
    def restarted(self) -> list[str]:
        """Children the supervisor restarted (a session that crashed shows up here)."""
        return [e.child_id for e in self.events if e.kind == "child_restarted"]


@asynccontextmanager
async def replica(
    plan: str = "",
    policy: SessionPolicy = AUTO_RESET,
    exe: Executable = TINY,
    backend: Callable[[DeviceSpec], CpuBackend] = CpuBackend,
    reattach: Callable[[Replica], Awaitable[None]] | None = None,
) -> AsyncIterator[Replica]:
    """Start Queue, Device and Session under a rest_for_one supervisor, as replicas.py does."""
    clock = FakeClock()
    state = ReplicaState(replica=0, device_id=SPEC.id)
    injector = FaultPlan.parse(plan, seed=1).for_replica(0)
    queue = Queue(exe.metadata, QueueConfig(), replica=0, clock=clock)
    rep: Replica | None = None
    sup: Supervisor | None = None
    devices: list[Device] = []

    def on_status(r: int, status: ReplicaStatus) -> None:
        # As ReplicaSet.on_status, for a model with this one replica: out of service, its
        # unanswered requests move to the others, and with none they get its failure.
        assert rep is not None and r == 0
        rep.statuses.append(status)
        if status is ReplicaStatus.READY:
            queue.resume()
        elif status is ReplicaStatus.FAILED:
            for request in queue.evacuate():
                if not request.future.done():
                    request.future.set_exception(state.failure or RuntimeFailure("failed"))

    def on_event(event: SupervisorEvent) -> None:
        assert rep is not None
        rep.events.append(event)
        crashed = event.kind == "child_exited" and event.reason is not None
        if crashed and not rep.crashed.done():
            rep.crashed.set_result(event)

    def make_device() -> Device:
        device = Device(
            AttachedDevice(SPEC),
            backend(SPEC),
            replica=0,
            fault_injector=injector,
            clock=clock,
            detach_on_stop=False,
            executable=exe,
            variables=state.saved_variables,
        )
        devices.append(device)
        return device

    def make_session() -> SessionActor:
        assert sup is not None and rep is not None
        r = rep
        return SessionActor(
            replica=0,
            device=sup.ref("device"),
            queue=sup.ref("queue"),
            ready=queue.ready,
            layout=queue.layout,
            state=state,
            policy=policy,
            clock=clock,
            on_status=on_status,
            on_progress=sup.forgive,
            reattach=None if reattach is None else (lambda: reattach(r)),
            stateful=bool(exe.metadata.variables),
        )

    sup = Supervisor(
        "replica-0",
        [
            ChildSpec("queue", lambda: queue, shutdown=policy.reset_timeout),
            ChildSpec("device", make_device, shutdown=policy.reset_timeout),
            ChildSpec("session", make_session, shutdown=policy.reset_timeout),
        ],
        strategy=Strategy.REST_FOR_ONE,
        intensity=policy.max_failed_recoveries,
        period=60.0,
        clock=clock,
        on_event=on_event,
    )
    rep = Replica(clock, state, injector, queue, sup, devices)
    rep.crashed = asyncio.get_running_loop().create_future()
    async with anyio.create_task_group() as tg:
        with anyio.fail_after(WAIT):
            await tg.start(sup.run)
        try:
            yield rep
        finally:
            for device in devices:  # a failed test never leaves a worker held
                if isinstance(device.backend, GatedBackend):
                    device.backend.open_all()
            with anyio.fail_after(WAIT):
                await sup.stop()


def _check_alive(rep: Replica) -> None:
    if rep.crashed.done():
        event = rep.crashed.result()
        raise AssertionError(f"the {event.child_id} actor crashed: {event.reason!r}")


async def settled() -> None:
    """Every task waits and no callback is due. ``wait_all_tasks_blocked`` alone misses a
    callback already scheduled (a finished task's done-callback that wakes its task group),
    so a chain of task endings can still be under way when it returns."""
    loop = asyncio.get_running_loop()
    while True:
        await anyio.wait_all_tasks_blocked()
        if not loop._ready:  # type: ignore[attr-defined]
            return


async def until(rep: Replica, condition: Callable[[], bool], what: str) -> None:
    """Poll ``condition`` (device work runs in a thread) until it holds, at most WAIT seconds."""
    deadline = anyio.current_time() + WAIT
    while not condition():
        _check_alive(rep)
        if anyio.current_time() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        await anyio.sleep(0.002)


async def answer(
    rep: Replica, future: asyncio.Future[dict[str, np.ndarray]]
) -> dict[str, np.ndarray]:
    """The request's answer (its outputs, or its error raised), at most WAIT seconds."""
    with anyio.fail_after(WAIT):
        waiters: list[asyncio.Future[Any]] = [future, rep.crashed]
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    if not future.done():
        _check_alive(rep)
    return future.result()


# -- 1. retry exhaustion ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "max_retries",
    [
        2,  # the default
        0,  # the limit is the policy's: no retry at all
    ],
)
async def test_a_batch_failing_every_run_gets_the_error_after_max_retries(
    max_retries: int,
) -> None:
    # Runs 2 .. 2+max_retries fail: exactly the first run and the retries of the second batch.
    plan = f"recoverable:every=1:from=2:until={2 + max_retries}"
    policy = SessionPolicy(auto_reset=True, max_retries=max_retries)
    async with replica(plan, policy) as rep:
        x_before, x_failing, x_after = tiny_rows(1), tiny_rows(2), tiny_rows(3)
        check_tiny(await answer(rep, rep.submit("x", x_before)), x_before)

        with pytest.raises(RecoverableRuntimeError, match="injected recoverable fault"):
            await answer(rep, rep.submit("x", x_failing))
        state = rep.state
        assert rep.injector.iteration == 2 + max_retries  # ran 1 + max_retries times, no more
        assert (state.retries, state.resets, state.faults) == (
            max_retries,
            1 + max_retries,
            1 + max_retries,
        )
        assert rep.status() is ReplicaStatus.READY and state.outages == 0

        # The device serves the next batch: nothing else is lost.
        check_tiny(await answer(rep, rep.submit("x", x_after)), x_after)
        assert state.failed_recoveries == 0 and not state.inflight
        assert ReplicaStatus.FAILED not in rep.statuses
        assert rep.restarted == []


async def test_a_run_made_in_place_that_failed_is_retried_by_running_the_batch_again() -> None:
    # A batch the queue offered the session to run in place comes to the batch loop with the
    # outcome of that run (Batch.ran). When the fault is one a reset cures, the retry runs
    # the batch on the device: it does not replay the failed outcome until the retries run out.
    async with replica() as rep:
        loop = asyncio.get_running_loop()
        x = tiny_rows(4)
        future: asyncio.Future[dict[str, np.ndarray]] = loop.create_future()
        request = Request(inputs={"x": x}, samples=2, future=future, t_submit=0.0)
        failed: asyncio.Future[list[dict[str, np.ndarray]]] = loop.create_future()
        failed.set_exception(RecoverableRuntimeError("ran in place", RecoveryAction.IPU_RESET))
        batch = Batch(1 << 30, ({"x": x},), ((request, 0, 0, 0, 2),), 2, False, 0.0, ran=failed)
        session = rep.sup.ref("session").actor
        assert isinstance(session, SessionActor)
        await session._run_batch(batch)
        check_tiny(await answer(rep, future), x)
        assert (rep.state.resets, rep.state.retries) == (1, 1)


# -- 2. the progress rule -----------------------------------------------------------------------


async def test_faults_each_followed_by_a_good_batch_never_take_the_replica_out() -> None:
    # Every even run fails until run 20: ten faults, each cured by the retry that follows.
    async with replica("recoverable:every=2:until=20") as rep:
        xs = [tiny_rows(i) for i in range(11)]
        for x in xs:
            check_tiny(await answer(rep, rep.submit("x", x)), x)
            assert rep.status() is ReplicaStatus.READY
        state = rep.state
        assert (state.faults, state.resets, state.retries) == (10, 10, 10)
        assert state.failed_recoveries == 0 and state.outages == 0
        assert len(state.recovery_times) == 10
        assert ReplicaStatus.FAILED not in rep.statuses
        assert rep.restarted == []


async def test_failed_recoveries_in_a_row_take_the_replica_out_of_service() -> None:
    # From run 2 on, every run fails: no batch ever succeeds after a reset again.
    async with replica("recoverable:every=1:from=2") as rep:
        state = rep.state
        x = tiny_rows(0)
        check_tiny(await answer(rep, rep.submit("x", x)), x)

        # Fault 1 (run 2) is followed by a reset; faults 2 and 3 each say that the reset
        # before them did not recover the replica: 2 failed recoveries, still in service.
        with pytest.raises(RecoverableRuntimeError):
            await answer(rep, rep.submit("x", tiny_rows(1)))
        assert (state.faults, state.failed_recoveries, state.resets) == (3, 2, 3)
        assert rep.status() is ReplicaStatus.READY
        assert ReplicaStatus.FAILED not in rep.statuses and state.outages == 0

        # Fault 4: the third failed recovery in a row (max_failed_recoveries, default 3).
        with pytest.raises(RuntimeFailure):
            await answer(rep, rep.submit("x", tiny_rows(2)))
        assert rep.status() is ReplicaStatus.FAILED
        assert rep.statuses[-1:] == [ReplicaStatus.FAILED]
        assert state.outages == 1 and state.failed_recoveries == 3
        assert isinstance(state.failure, UnrecoverableRuntimeError)
        assert "no progress through 3 recoveries" in str(state.failure)
        assert state.resets == 3  # leaving service is not one more reset
        assert rep.injector.iteration == 5
        assert rep.restarted == []


# -- 3. coming back: backoff and probing -------------------------------------------------------


async def test_a_replica_out_of_service_is_probed_and_comes_back() -> None:
    # Runs 2..5 fail: the replica leaves service at run 5. Probes are never faulted by the
    # plan (RunMain.probe), so the first probe finds the device healthy.
    async with replica("recoverable:every=1:from=2:until=5") as rep:
        state, clock = rep.state, rep.clock
        check_tiny(await answer(rep, rep.submit("x", tiny_rows(0))), tiny_rows(0))
        for seed in (1, 2):
            with pytest.raises(RuntimeFailure):
                await answer(rep, rep.submit("x", tiny_rows(seed)))
        assert rep.status() is ReplicaStatus.FAILED and state.probes == 0

        await settled()  # leaving service asks nothing of the device
        clock.advance(0.5)  # less than probe_initial (1 s): no probe yet
        await settled()
        assert state.probes == 0 and rep.status() is ReplicaStatus.FAILED

        clock.advance(0.5)
        await until(rep, lambda: rep.status() is ReplicaStatus.READY, "a probe brought it back")
        assert state.probes == 1 and rep.statuses[-1:] == [ReplicaStatus.READY]
        assert state.failure is None and state.failed_recoveries == 0
        assert rep.injector.iteration == 5  # the probe is not a served run
        x = tiny_rows(9)
        check_tiny(await answer(rep, rep.submit("x", x)), x)
        assert rep.status() is ReplicaStatus.READY and state.outages == 1
        assert rep.restarted == []


async def test_probes_back_off_exponentially_up_to_the_cap_until_the_device_runs() -> None:
    # Run 2 breaks the device for good: every reset and probe fails until it is re-attached.
    reattached: list[float] = []

    async def reattach(rep: Replica) -> None:
        # As ReplicaSet._reattach: no other device free for the first five failed probes;
        # at the sixth a fresh Device replaces the broken one (rest_for_one: and the session).
        reattached.append(rep.clock.monotonic())
        if len(reattached) == 6:
            await rep.sup.restart_child("device")

    def failed(probes: int) -> bool:
        return len(reattached) == probes

    async with replica("fatal:at=2", reattach=reattach) as rep:
        state, clock = rep.state, rep.clock
        check_tiny(await answer(rep, rep.submit("x", tiny_rows(0))), tiny_rows(0))
        with pytest.raises(UnrecoverableRuntimeError, match="injected fatal fault"):
            await answer(rep, rep.submit("x", tiny_rows(1)))
        assert rep.status() is ReplicaStatus.FAILED and rep.statuses[-1:] == [ReplicaStatus.FAILED]
        assert state.outages == 1 and state.probes == 0

        # Probe k waits d_k = 1, 2, 4, 8, 10, 10 s (doubling, capped at probe_cap = 10).
        for probes, delay in enumerate((1.0, 2.0, 4.0, 8.0, 10.0, 10.0), start=1):
            await settled()
            clock.advance(delay / 2)
            await settled()
            assert state.probes == probes - 1, f"probe {probes} ran before {delay} s"
            clock.advance(delay / 2)
            await until(rep, functools.partial(failed, probes), f"probe {probes} fails")
            assert state.probes == probes
            assert rep.status() is ReplicaStatus.FAILED
        assert reattached == [1.0, 3.0, 7.0, 15.0, 25.0, 35.0]
        assert rep.statuses[-1:] == [ReplicaStatus.FAILED]

        # The sixth probe re-attached a working device (and a new session, which goes on
        # probing at the capped delay): the next probe, 10 s later, runs and it serves again.
        await until(rep, lambda: len(rep.devices) == 2, "a fresh device")
        await until(rep, lambda: clock.next_deadline() == 45.0, "the next probe is 10 s away")
        await settled()
        clock.advance(9.5)
        await settled()
        assert state.probes == 6 and rep.status() is ReplicaStatus.FAILED
        clock.advance(0.5)
        await until(rep, lambda: rep.status() is ReplicaStatus.READY, "the probe brought it back")
        assert state.probes == 7 and rep.statuses[-1:] == [ReplicaStatus.READY]
        assert state.failure is None and state.outages == 1
        x = tiny_rows(9)
        check_tiny(await answer(rep, rep.submit("x", x)), x)
        assert rep.restarted == ["device", "session"]  # the re-attach, nothing else


# -- 4. one reset per fault, however many batches are in flight --------------------------------


async def save(rep: Replica) -> None:
    """Run the save programs on the device (held by GatedBackend until released)."""
    with contextlib.suppress(DeviceStateError):  # aborted by a reset before it started
        await rep.sup.ref("device").ask(RunSave())


async def on_device(rep: Replica, batches: int) -> None:
    """Wait until the session has asked the device to run ``batches`` batches."""
    await until(rep, lambda: len(rep.state.inflight) == batches, f"{batches} batches taken")
    await settled()  # ... and the device queued the runs it was asked


async def test_a_fault_with_a_second_batch_queued_on_the_device_resets_once() -> None:
    async with replica("recoverable:at=1", backend=GatedBackend) as rep:
        backend = rep.devices[0].backend
        assert isinstance(backend, GatedBackend)
        state = rep.state
        x1, x2 = tiny_rows(1), tiny_rows(2)
        async with anyio.create_task_group() as tg:
            # The device's worker, in order: a held save, batch 1, a second held save,
            # batch 2 (both batches in flight: the default pipeline_depth, 2). Batch 1's
            # fault resets the device; the reset opens the second save and aborts batch 2,
            # which has not started: it is run again, with no reset of its own.
            tg.start_soon(save, rep)
            await until(rep, backend.entered[0].is_set, "the first save holds the worker")
            f1 = rep.submit("x", x1)
            await on_device(rep, 1)
            tg.start_soon(save, rep)
            await settled()
            f2 = rep.submit("x", x2)
            await on_device(rep, 2)
            assert rep.injector.iteration == 0
            backend.gates[0].set()
            check_tiny(await answer(rep, f1), x1)
            check_tiny(await answer(rep, f2), x2)
        assert (state.resets, state.faults, state.retries) == (1, 1, 1)
        assert rep.status() is ReplicaStatus.READY and state.failed_recoveries == 0
        assert rep.injector.iteration == 3  # the fault, then each batch once
        assert rep.restarted == []


async def test_a_stuck_device_times_out_both_batches_in_flight_and_resets_once() -> None:
    async with replica(backend=GatedBackend) as rep:
        backend = rep.devices[0].backend
        assert isinstance(backend, GatedBackend)
        state, clock = rep.state, rep.clock
        x1, x2 = tiny_rows(1), tiny_rows(2)
        async with anyio.create_task_group() as tg:
            # The worker is stuck (a save that never ends) with both batches queued behind
            # it: both pass the execution deadline together, one fault for the two.
            tg.start_soon(save, rep)
            await until(rep, backend.entered[0].is_set, "the save holds the worker")
            f1, f2 = rep.submit("x", x1), rep.submit("x", x2)
            await on_device(rep, 2)
            assert state.resets == 0 and clock.next_deadline() == 1.0
            clock.advance(1.0)
            check_tiny(await answer(rep, f1), x1)
            check_tiny(await answer(rep, f2), x2)
        assert (state.resets, state.faults, state.retries) == (1, 1, 2)
        assert rep.status() is ReplicaStatus.READY and state.failed_recoveries == 0
        assert rep.restarted == []


# -- 5. poisoned data ---------------------------------------------------------------------------


EMBEDDING = make_embedding()
TABLE = numpy_helper.to_array(EMBEDDING.graph.initializer[0])


async def test_a_poisoned_request_gets_input_validation_error_and_the_rest_their_rows() -> None:
    exe = compile_executable(EMBEDDING, CompileOptions(batch_size=4))
    async with replica(policy=SessionPolicy(), exe=exe) as rep:
        good1, bad, good2 = np.array([1, 2]), np.array([1000]), np.array([5])
        # 2 + 1 + 1 rows: one batch of 4; id 1000 is outside the 100-row table.
        futures = [rep.submit("ids", ids) for ids in (good1, bad, good2)]
        np.testing.assert_array_equal((await answer(rep, futures[0]))["vectors"], TABLE[good1])
        with pytest.raises(InputValidationError, match="rejected this request's data"):
            await answer(rep, futures[1])
        np.testing.assert_array_equal((await answer(rep, futures[2]))["vectors"], TABLE[good2])

        state = rep.state
        assert state.poisoned == 1
        assert (state.resets, state.faults, state.failed_recoveries) == (0, 0, 0)
        assert rep.status() is ReplicaStatus.READY and rep.statuses == [ReplicaStatus.READY]
        after = np.array([7, 8, 9, 99])
        np.testing.assert_array_equal(
            (await answer(rep, rep.submit("ids", after)))["vectors"], TABLE[after]
        )
        assert rep.restarted == []


# -- 6. the hang deadline -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "auto_reset",
    [
        False,  # the default (the seed's): the hung device is reset, the error is raised
        True,  # the batch is also retried after the reset
    ],
)
async def test_a_hang_is_reset_once_the_clock_passes_the_derived_deadline(
    auto_reset: bool,
) -> None:
    # execution_timeout=None (the default): the deadline is derived from the warm-up run,
    # which took no (fake) time: 20 x 0 s, so the floor of 1 s.
    async with replica("hang:at=1", policy=SessionPolicy(auto_reset=auto_reset)) as rep:
        state, clock = rep.state, rep.clock
        x = tiny_rows(4)
        future = rep.submit("x", x)
        # Started by the device's thread (counted by the fault plan), not only handed to it:
        # a reset before its thread takes the run up would leave it to hang after the reset.
        await until(
            rep,
            lambda: state.hung_after < math.inf and rep.injector.iteration >= 1,
            "the run is on the device",
        )
        await settled()
        assert state.hung_after == 1.0 and clock.next_deadline() == 1.0
        assert state.is_ready_at(0.9) and not state.is_ready_at(1.0)

        clock.advance(0.9)
        await settled()
        assert state.resets == 0 and not future.done()
        assert rep.status() is ReplicaStatus.READY

        clock.advance(0.2)
        if auto_reset:
            check_tiny(await answer(rep, future), x)
        else:
            with pytest.raises(ExecutionTimeoutError, match="past its deadline"):
                await answer(rep, future)
        assert (state.resets, state.faults, state.retries) == (1, 1, int(auto_reset))
        assert rep.status() is ReplicaStatus.READY and state.hung_after == math.inf
        # The reset freed the device: the next batch runs.
        check_tiny(await answer(rep, rep.submit("x", tiny_rows(5))), tiny_rows(5))
        assert rep.restarted == []


# -- 7. what placement reads ---------------------------------------------------------------------


async def test_a_whole_batch_is_measured_in_hops_from_runs_at_least_half_full() -> None:
    # model_runtime.placement reads batch_hops to decide whether an idle replica pays for a
    # request: a one-row run (its bucket) costs a run's fixed cost, not a whole batch's rows,
    # so it is not scaled up into one.
    exe = compile_executable(make_mlp(sizes=(8, 4)), CompileOptions(batch_size=8))
    assert 1 in exe.metadata.run_sizes and 8 in exe.metadata.run_sizes
    x = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
    async with replica(exe=exe) as rep:
        device = rep.devices[0]
        name = exe.metadata.user_inputs[0].name
        await answer(rep, rep.submit(name, x[:1]))
        assert rep.state.runs_by_size == {1: 1} and rep.state.batch_hops == 0.0
        await answer(rep, rep.submit(name, x))
        assert rep.state.runs_by_size == {1: 1, 8: 1}
        assert rep.state.batch_hops == device.run_hops(8) > 0.0

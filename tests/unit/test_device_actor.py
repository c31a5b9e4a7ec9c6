"""The Device actor: lifecycle, one worker thread, one hop per RunMain, heartbeats, typed
errors for bad states, and every fault kind firing exactly where the plan says."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc
import numpy as np
import pytest
from device_fixtures import batch_of, tiny_exe

from actors.actor import ActorRef, Stop
from actors.clock import FakeClock
from actors.device import (
    AttachedDevice,
    CpuBackend,
    Detach,
    Device,
    DeviceCrash,
    DeviceSpec,
    FaultPlan,
    GetStatus,
    LoadExecutable,
    Reset,
    RunAborted,
    RunMain,
    RunPrograms,
    RunSave,
    Unload,
)
from actors.device.inline import INLINE_BELOW
from model_runtime.errors import (
    ActorStoppedError,
    DeviceStateError,
    InputValidationError,
    RecoverableRuntimeError,
    RecoveryAction,
    UnrecoverableRuntimeError,
)

EXE = tiny_exe(device_iterations=2)
BATCHES = (batch_of(EXE, 0), batch_of(EXE, 1))


class SpyBackend(CpuBackend):
    """A cpu backend that records the thread of every call and counts main runs."""

    def __init__(self) -> None:
        super().__init__(DeviceSpec(0, "cpu", 1))
        self.threads: set[str] = set()
        self.main_calls = 0
        self.gate: threading.Event | None = None

    def run_main(self, batches: Sequence[Mapping[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        self.threads.add(threading.current_thread().name)
        self.main_calls += 1
        if self.gate is not None:
            self.gate.wait(10)
        return super().run_main(batches)

    def load(self, executable: Any, frozen_inputs: Any) -> None:
        self.threads.add(threading.current_thread().name)
        super().load(executable, frozen_inputs)


@asynccontextmanager
async def device(
    plan: str = "", replica: int = 0, backend: CpuBackend | None = None, clock: Any = None
) -> AsyncIterator[tuple[ActorRef[Any], Device]]:
    actor = Device(
        AttachedDevice(DeviceSpec(0, "cpu", 1)),
        backend,
        replica=replica,
        fault_plan=FaultPlan.parse(plan, seed=1) if plan else None,
        clock=clock,
    )
    async with anyio.create_task_group() as tg:
        ref: ActorRef[Any] = await tg.start(actor.run)
        yield ref, actor
        await ref.ask(Stop())


async def outcomes(ref: ActorRef[Any], n: int) -> list[str]:
    """Run ``n`` main runs; the outcome of each: "ok" or the error's class name."""
    out = []
    for _ in range(n):
        try:
            await ref.ask(RunMain(BATCHES))
            out.append("ok")
        except Exception as exc:
            out.append(type(exc).__name__)
    return out


async def test_load_run_save_through_the_actor_in_one_worker_thread() -> None:
    spy = SpyBackend()
    async with device(backend=spy) as (ref, _actor):
        assert (await ref.ask(GetStatus())).state == "empty"
        await ref.ask(LoadExecutable(EXE))
        outs = await ref.ask(RunMain(BATCHES))
        assert [float(o["counter_out"][0]) for o in outs] == [1.0, 2.0]
        ref_b = CpuBackend(DeviceSpec(1))
        ref_b.load(EXE, None)
        np.testing.assert_array_equal(outs[1]["y"], ref_b.run_main(BATCHES)[1]["y"])
        assert (await ref.ask(RunSave()))["counter"][0] == 2.0
        status = await ref.ask(GetStatus())
        assert (status.state, status.runs_completed, status.run_started_at) == ("loaded", 1, None)
        # one hand-off per RunMain (both device iterations inside it), always the same thread
        assert spy.main_calls == 1
        assert len(spy.threads) == 1 and next(iter(spy.threads)).startswith("device-0")
        results = await ref.ask(RunPrograms((0, 1, 2), BATCHES))
        assert results[0] is None and len(results[1]) == 2 and results[2]["counter"][0] == 2.0


async def test_reset_restores_initial_or_given_variables() -> None:
    async with device() as (ref, _):
        with pytest.raises(DeviceStateError, match="reset before any executable"):
            await ref.ask(Reset())
        await ref.ask(LoadExecutable(EXE))
        await ref.ask(RunMain(BATCHES))
        await ref.ask(Reset())
        assert (await ref.ask(RunSave()))["counter"][0] == 0.0
        await ref.ask(Reset({"counter": np.array([10.0], np.float32)}))
        assert (await ref.ask(RunMain(BATCHES)))[1]["counter_out"][0] == 12.0


async def test_asked_before_load_or_after_unload_or_detach_is_a_typed_error() -> None:
    async with device() as (ref, actor):
        with pytest.raises(DeviceStateError, match="no executable loaded"):
            await ref.ask(RunMain(BATCHES))
        with pytest.raises(DeviceStateError):
            await ref.ask(RunSave())
        await ref.ask(LoadExecutable(EXE))
        await ref.ask(Unload())
        with pytest.raises(DeviceStateError, match="no executable loaded"):
            await ref.ask(RunMain(BATCHES))
        await ref.ask(LoadExecutable(EXE))
        await ref.ask(Detach())
        assert not actor.device.is_attached
        assert (await ref.ask(GetStatus())).state == "detached"
        with pytest.raises(DeviceStateError, match="detached"):
            await ref.ask(RunMain(BATCHES))
        with pytest.raises(DeviceStateError, match="detached"):
            await ref.ask(LoadExecutable(EXE))


async def test_failed_load_leaves_the_device_empty() -> None:
    async with device() as (ref, _):
        with pytest.raises(Exception, match="names no anchor"):
            await ref.ask(LoadExecutable(EXE, {"nope": np.zeros(1, np.float32)}))
        assert (await ref.ask(GetStatus())).state == "empty"


async def test_status_answers_mid_run_with_the_runs_start_time() -> None:
    clock = FakeClock(100.0)
    spy = SpyBackend()
    spy.gate = threading.Event()
    async with device(backend=spy, clock=clock) as (ref, _):
        await ref.ask(LoadExecutable(EXE))
        async with anyio.create_task_group() as tg:
            tg.start_soon(ref.ask, RunMain(BATCHES))
            await wait_for(lambda: spy.main_calls == 1)
            clock.advance(7)
            status = await ref.ask(GetStatus())
            assert (status.state, status.run_started_at) == ("running", 100.0)
            spy.gate.set()
        status = await ref.ask(GetStatus())
        assert (status.state, status.last_progress, status.runs_completed) == ("loaded", 107.0, 1)


async def test_recoverable_app_error_fire_exactly_where_planned_with_replica_filter() -> None:
    plan = "recoverable:every=3:action=LINK_RESET;app_error:at=4;recoverable:at=1:replica=1"
    async with device(plan, replica=0) as (ref, _):
        await ref.ask(LoadExecutable(EXE))
        assert await outcomes(ref, 7) == [
            "ok", "ok", "RecoverableRuntimeError", "ApplicationRuntimeError", "ok",
            "RecoverableRuntimeError", "ok",
        ]  # fmt: skip
        with pytest.raises(RecoverableRuntimeError) as info:
            await outcomes_raise(ref, 2)  # runs 8, 9
        assert info.value.recovery_action is RecoveryAction.LINK_RESET
        assert info.value.replica == 0 and "run 9" in str(info.value)
    async with device(plan, replica=1) as (ref, _):
        await ref.ask(LoadExecutable(EXE))
        with pytest.raises(RecoverableRuntimeError) as info:
            await ref.ask(RunMain(BATCHES))
        assert info.value.recovery_action is RecoveryAction.IPU_RESET and info.value.replica == 1


async def outcomes_raise(ref: ActorRef[Any], n: int) -> None:
    for _ in range(n):
        await ref.ask(RunMain(BATCHES))


async def test_probabilistic_faults_are_reproducible() -> None:
    runs = []
    for _ in range(2):
        async with device("app_error:p=0.3") as (ref, _):
            await ref.ask(LoadExecutable(EXE))
            runs.append(await outcomes(ref, 30))
    assert runs[0] == runs[1] and "ApplicationRuntimeError" in runs[0] and "ok" in runs[0]


async def test_fatal_breaks_the_device_for_good() -> None:
    async with device("fatal:at=2") as (ref, _):
        await ref.ask(LoadExecutable(EXE))
        assert await outcomes(ref, 3) == ["ok"] + ["UnrecoverableRuntimeError"] * 2
        with pytest.raises(UnrecoverableRuntimeError, match="broken"):
            await ref.ask(Reset())
        status = await ref.ask(GetStatus())
        assert status.state == "broken" and "fatal fault at run 2" in (status.error or "")


async def test_hang_blocks_until_reset_and_status_still_answers() -> None:
    clock = FakeClock()
    async with device("hang:at=2", clock=clock) as (ref, actor):
        await ref.ask(LoadExecutable(EXE))
        assert await outcomes(ref, 1) == ["ok"]
        errors: list[Exception] = []
        async with anyio.create_task_group() as tg:

            async def hung() -> None:
                try:
                    await ref.ask(RunMain(BATCHES))
                except Exception as exc:
                    errors.append(exc)

            tg.start_soon(hung)
            await wait_for(lambda: on_run(actor, 2))
            clock.advance(30)
            status = await ref.ask(GetStatus())
            assert status.state == "running" and clock.monotonic() - status.run_started_at == 30
            assert not errors
            await ref.ask(Reset())
        assert len(errors) == 1 and isinstance(errors[0], RunAborted)
        assert await outcomes(ref, 2) == ["ok", "ok"]  # the device works again (runs 3, 4)
        assert (await ref.ask(RunSave()))["counter"][0] == 4.0  # reset restarted from 0
    assert actor._executor is None


async def test_slow_runs_late_and_a_reset_cuts_it_short() -> None:
    async with device("slow:at=1:seconds=0.001;slow:at=2:seconds=600") as (ref, actor):
        await ref.ask(LoadExecutable(EXE))
        assert await outcomes(ref, 1) == ["ok"]
        async with anyio.create_task_group() as tg:
            tg.start_soon(outcomes, ref, 1)
            await wait_for(lambda: on_run(actor, 2))
            with anyio.fail_after(5):
                await ref.ask(Reset())


async def test_crash_kills_the_actor_and_fails_the_pending_ask() -> None:
    actor = Device(
        AttachedDevice(DeviceSpec(0, "cpu", 1)), fault_plan=FaultPlan.parse("crash:at=2")
    )
    died: list[BaseException] = []

    async def run(*, task_status: anyio.abc.TaskStatus[Any]) -> None:
        try:
            await actor.run(task_status=task_status)
        except Exception as exc:
            died.append(exc)

    async with anyio.create_task_group() as tg:
        ref: ActorRef[Any] = await tg.start(run)
        await ref.ask(LoadExecutable(EXE))
        await ref.ask(RunMain(BATCHES))
        with pytest.raises(ActorStoppedError, match="crashed"):
            await ref.ask(RunMain(BATCHES))
    assert isinstance(died[0], ExceptionGroup) and died[0].subgroup(DeviceCrash) is not None
    assert not ref.is_alive and not actor.device.is_attached
    with pytest.raises(ActorStoppedError):
        await ref.ask(GetStatus())


def on_run(actor: Device, n: int) -> bool:
    """The worker thread is in run ``n`` (counted by the fault plan as it starts), not only
    asked for it: a reset that came before the thread took the run would abort it before the
    plan counts it, and the plan's fault would strike the next run instead."""
    faults = actor._work.faults
    return actor.state == "running" and faults is not None and faults.iteration == n


async def wait_for(predicate: Any) -> None:
    """Yield to the loop until ``predicate()`` holds (a worker thread is involved: real time
    passes, but nothing here sleeps for ordering; the test timeout bounds it)."""
    while not predicate():  # noqa: ASYNC110 -- a worker thread makes it true
        await anyio.sleep(0.001)


async def test_a_device_given_an_executable_is_loaded_when_started() -> None:
    actor = Device(
        AttachedDevice(DeviceSpec(0, "cpu", 1)),
        executable=EXE,
        variables={"counter": np.array([5.0], np.float32)},
    )
    async with anyio.create_task_group() as tg:
        ref: ActorRef[Any] = await tg.start(actor.run)
        assert (await ref.ask(GetStatus())).state == "loaded"
        assert (await ref.ask(RunMain(BATCHES)))[0]["counter_out"][0] == 6.0
        await ref.ask(Stop())
    bad = Device(
        AttachedDevice(DeviceSpec(0, "cpu", 1)), executable=EXE, frozen_inputs={"q": np.zeros(1)}
    )
    with pytest.RaisesGroup(pytest.RaisesExc(InputValidationError, match="names no anchor")):
        async with anyio.create_task_group() as tg:
            await tg.start(bad.run)
    assert not bad.device.is_attached


async def test_a_run_shorter_than_a_hop_runs_on_the_loop_unless_a_fault_plan_is_set() -> None:
    # Once measured on the worker (a moving average per batch size), a tiny run on an idle
    # device is done before run_main_nowait returns, on the loop's thread; with a fault plan
    # (a hang must never block the loop) every run goes to the worker.
    exe = tiny_exe(batch=1)  # one row: what a lone request runs
    batch = (batch_of(exe, 0),)
    for plan, inline in (("", True), ("recoverable:at=1000", False)):
        spy = SpyBackend()
        async with device(plan, backend=spy) as (ref, actor):
            await ref.ask(LoadExecutable(exe))
            first = actor.run_main_nowait(batch)
            assert not first.done()  # nothing measured yet: the worker
            await first
            done_at_once = []
            for _ in range(30):
                run = actor.run_main_nowait(batch)
                done_at_once.append(run.done())
                await run
            assert any(done_at_once) is inline, plan
            assert (threading.current_thread().name in spy.threads) is inline
            assert (await ref.ask(GetStatus())).runs_completed == 31


async def test_what_runs_inline_grows_with_the_measured_hop_within_bounds() -> None:
    async with device() as (ref, actor):
        await ref.ask(LoadExecutable(EXE))
        worker = actor._executor
        assert worker is not None
        # A faster hop than the reference machine's keeps the floor; a slower one moves the
        # limit to three hops, up to four times the floor.
        for hop, limit in ((0.0, INLINE_BELOW), (150e-6, 450e-6), (1e-3, 4 * INLINE_BELOW)):
            worker.hop_seconds = hop
            assert actor._inline_below() == pytest.approx(limit)

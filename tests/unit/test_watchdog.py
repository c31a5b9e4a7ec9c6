"""The watchdog restarts a stalled session and leaves busy or idle ones alone (fake clock)."""

from __future__ import annotations

import anyio

from actors.actor import ActorRef, Stop
from actors.clock import FakeClock
from actors.session.state import ReplicaState, ReplicaStatus
from actors.watchdog import Watchdog, WatchTarget


def target(state: ReplicaState, waiting: list[int], restarts: list[int]) -> WatchTarget:
    async def restart() -> None:
        restarts.append(state.replica)

    return WatchTarget(state=state, waiting_batches=lambda: waiting[0], restart_session=restart)


async def run_checks(clock: FakeClock, watched: list[WatchTarget], seconds: float) -> None:
    async with anyio.create_task_group() as tg:
        dog = Watchdog(lambda: watched, interval=1.0, stall_after=10.0, clock=clock)
        ref: ActorRef[object] = await tg.start(dog.run)
        for _ in range(int(seconds)):
            await anyio.wait_all_tasks_blocked()
            clock.advance(1.0)
        await anyio.wait_all_tasks_blocked()
        await ref.ask(Stop())


async def test_a_session_holding_a_batch_too_long_is_restarted_once() -> None:
    clock = FakeClock()
    state = ReplicaState(replica=0, status=ReplicaStatus.READY, inflight={1: object()})
    restarts: list[int] = []
    await run_checks(clock, [target(state, [0], restarts)], seconds=15)
    assert restarts == [0]


async def test_batches_waiting_for_a_silent_session_is_a_stall() -> None:
    clock = FakeClock()
    state = ReplicaState(replica=1, status=ReplicaStatus.READY)
    restarts: list[int] = []
    await run_checks(clock, [target(state, [2], restarts)], seconds=11)
    assert restarts == [1]


async def test_idle_resetting_or_lively_replicas_are_left_alone() -> None:
    clock = FakeClock()
    idle = ReplicaState(replica=0, status=ReplicaStatus.READY)
    resetting = ReplicaState(replica=1, status=ReplicaStatus.RESETTING, inflight={1: object()})
    lively = ReplicaState(replica=2, status=ReplicaStatus.READY, inflight={1: object()})
    restarts: list[int] = []
    watched = [
        target(idle, [0], restarts),
        target(resetting, [3], restarts),
        target(lively, [3], restarts),
    ]

    async def beat() -> None:
        while True:
            lively.heartbeat = clock.monotonic()
            await clock.sleep(2.0)

    async with anyio.create_task_group() as tg:
        tg.start_soon(beat)
        await run_checks(clock, watched, seconds=30)
        tg.cancel_scope.cancel()
    assert restarts == []

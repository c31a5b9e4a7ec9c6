"""The supervisor: order, strategies, restart types, intensity, backoff, shutdown, nesting."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
import pytest
from structlog.testing import capture_logs

from actors.actor import Actor, ActorRef
from actors.clock import FakeClock
from actors.supervision import (
    Backoff,
    ChildInfo,
    ChildSpec,
    Restart,
    Strategy,
    Supervisor,
    SupervisorEvent,
)
from model_runtime.errors import ActorStoppedError, SupervisorEscalationError

pytestmark = pytest.mark.timeout(10)


@dataclass(frozen=True, slots=True)
class Ping:
    pass


@dataclass(frozen=True, slots=True)
class Crash:
    pass


@dataclass(frozen=True, slots=True)
class Quit:
    pass


@dataclass(frozen=True, slots=True)
class Hang:
    pass


class Worker(Actor[object]):
    """Records its lifecycle in a shared journal; crashes, quits or hangs on request."""

    def __init__(self, name: str, journal: list[str], fail_start: bool = False) -> None:
        super().__init__(name)
        self.journal = journal
        self.fail_start = fail_start

    async def on_start(self) -> None:
        if self.fail_start:
            raise RuntimeError(f"{self.name} cannot start")
        self.journal.append(f"start:{self.name}")

    async def on_stop(self) -> None:
        self.journal.append(f"stop:{self.name}")

    async def handle(self, message: object) -> object:
        match message:
            case Ping():
                return self.name
            case Crash():
                raise ValueError(f"{self.name} crashed")
            case Quit():
                self.stop_soon()
                return None
            case Hang():
                await anyio.sleep_forever()
        return await super().handle(message)


class Journal:
    """Makes specs whose workers write to one journal."""

    def __init__(self) -> None:
        self.entries: list[str] = []

    def spec(
        self, cid: str, restart: Restart = Restart.PERMANENT, shutdown: float = 5.0
    ) -> ChildSpec:
        return ChildSpec(cid, lambda: Worker(cid, self.entries), restart, shutdown)

    def take(self) -> list[str]:
        entries, self.entries[:] = list(self.entries), []
        return entries


@asynccontextmanager
async def supervising(sup: Supervisor) -> AsyncIterator[list[BaseException]]:
    """Run ``sup`` in a task group; collect what run() raised; stop it at the end."""
    raised: list[BaseException] = []

    async def host(*, task_status: anyio.abc.TaskStatus[Supervisor]) -> None:
        try:
            await sup.run(task_status=task_status)
        except Exception as exc:
            raised.append(exc)

    async with anyio.create_task_group() as tg:
        await tg.start(host)
        yield raised
        await sup.stop()


def states(sup: Supervisor) -> dict[str, tuple[str, int]]:
    return {info.id: (info.state, info.restarts) for info in sup.children()}


async def crash(sup: Supervisor, cid: str, message: object = Crash()) -> None:
    """Make child ``cid`` fail (a failed tell ends an actor) and let the supervisor react."""
    sup.ref(cid).tell(message)
    await anyio.wait_all_tasks_blocked()


def make(j: Journal, *ids: str, **kwargs: Any) -> Supervisor:
    kwargs.setdefault("clock", FakeClock())
    return Supervisor("sup", [j.spec(i) for i in ids], **kwargs)


# -- order ------------------------------------------------------------------------------------


async def test_children_start_in_order_and_stop_in_reverse() -> None:
    j = Journal()
    sup = make(j, "a", "b", "c")
    async with supervising(sup) as raised:
        assert j.take() == ["start:a", "start:b", "start:c"]
        assert sup.children() == [ChildInfo(c, "running", 0) for c in "abc"]
        assert await sup.ref("b").ask(Ping()) == "b"
    assert j.take() == ["stop:c", "stop:b", "stop:a"]
    assert raised == []
    assert [s for _, s, _ in sup.children()] == ["stopped"] * 3
    with pytest.raises(ActorStoppedError):
        sup.ref("a")


async def test_stop_is_idempotent_and_run_returns_normally() -> None:
    j = Journal()
    sup = make(j, "a", "b")
    async with supervising(sup) as raised:
        async with anyio.create_task_group() as tg:
            tg.start_soon(sup.stop)
            tg.start_soon(sup.stop)
        await sup.stop()
        assert j.take() == ["start:a", "start:b", "stop:b", "stop:a"]
    await sup.stop()
    assert raised == [] and j.take() == []
    with pytest.raises(ActorStoppedError):
        await sup.restart_child("a")


# -- strategies -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("strategy", "journal"),
    [
        (Strategy.ONE_FOR_ONE, ["stop:b", "start:b"]),
        (Strategy.REST_FOR_ONE, ["stop:b", "stop:c", "start:b", "start:c"]),
        (
            Strategy.ONE_FOR_ALL,
            ["stop:b", "stop:c", "stop:a", "start:a", "start:b", "start:c"],
        ),
    ],
)
async def test_strategy_decides_which_siblings_restart(
    strategy: Strategy, journal: list[str]
) -> None:
    j = Journal()
    sup = make(j, "a", "b", "c", strategy=strategy)
    async with supervising(sup) as raised:
        old = {c: sup.ref(c) for c in "abc"}
        j.take()
        await crash(sup, "b")
        # stop:b comes first because b stops itself (its on_stop) when it crashes.
        assert j.take() == journal
        restarted = {c for c in "abc" if sup.ref(c) is not old[c]}
        assert restarted == {c for c in "abc" if f"start:{c}" in journal}
        assert {c: n for c, (_, n) in states(sup).items()} == {
            c: int(c in restarted) for c in "abc"
        }
    assert raised == []


async def test_new_ref_works_after_restart_and_old_one_is_dead() -> None:
    j = Journal()
    sup = make(j, "a")
    async with supervising(sup):
        old: ActorRef[object] = sup.ref("a")
        await crash(sup, "a")
        new: ActorRef[object] = sup.ref("a")
        assert new is not old and not old.is_alive
        assert await new.ask(Ping()) == "a"
        with pytest.raises(ActorStoppedError):
            await old.ask(Ping())


# -- restart types ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("restart", "message", "restarted"),
    [
        (Restart.PERMANENT, Crash(), True),
        (Restart.PERMANENT, Quit(), True),
        (Restart.TRANSIENT, Crash(), True),
        (Restart.TRANSIENT, Quit(), False),
        (Restart.TEMPORARY, Crash(), False),
        (Restart.TEMPORARY, Quit(), False),
    ],
)
async def test_restart_type_on_normal_and_abnormal_exit(
    restart: Restart, message: object, restarted: bool
) -> None:
    j = Journal()
    events: list[SupervisorEvent] = []
    sup = Supervisor("sup", [j.spec("a", restart)], clock=FakeClock(), on_event=events.append)
    async with supervising(sup):
        if isinstance(message, Quit):
            await sup.ref("a").ask(message)
            await anyio.wait_all_tasks_blocked()
        else:
            await crash(sup, "a", message)
        assert states(sup) == {"a": ("running", 1) if restarted else ("stopped", 0)}
        exited = [e for e in events if e.kind == "child_exited"]
        assert len(exited) == 1
        assert isinstance(exited[0].reason, ValueError) == isinstance(message, Crash)
        assert any(e.kind == "child_restarted" for e in events) == restarted


async def test_temporary_sibling_is_stopped_but_not_restarted() -> None:
    j = Journal()
    specs = [j.spec("a"), j.spec("t", Restart.TEMPORARY), j.spec("c")]
    sup = Supervisor("sup", specs, Strategy.ONE_FOR_ALL, clock=FakeClock())
    async with supervising(sup):
        j.take()
        await crash(sup, "a")
        assert j.take() == ["stop:a", "stop:c", "stop:t", "start:a", "start:c"]
        assert states(sup) == {"a": ("running", 1), "t": ("stopped", 0), "c": ("running", 1)}


# -- intensity --------------------------------------------------------------------------------


async def test_too_many_restarts_within_period_escalate_and_stop_everything() -> None:
    j = Journal()
    events: list[SupervisorEvent] = []
    clock = FakeClock()
    sup = make(j, "a", "b", "c", intensity=2, period=5.0, clock=clock, on_event=events.append)
    with capture_logs() as logs:
        async with supervising(sup) as raised:
            for _ in range(2):
                await crash(sup, "b")
                clock.advance(1.0)
            assert raised == []
            j.take()
            await crash(sup, "b")  # the third restart within 5 s
            assert len(raised) == 1
    error = raised[0]
    assert isinstance(error, SupervisorEscalationError)
    assert isinstance(error.__cause__, ValueError) and "b crashed" in str(error.__cause__)
    assert j.take() == ["stop:b", "stop:c", "stop:a"]
    assert [s for _, s, _ in sup.children()] == ["stopped"] * 3
    assert events[-1] == SupervisorEvent("supervisor_escalated", "b", error.__cause__)
    names = [entry["event"] for entry in logs]
    for name in ("child_started", "child_exited", "child_restarted", "supervisor_escalated"):
        assert name in names
    exited = next(entry for entry in logs if entry["event"] == "child_exited")
    assert exited["child"] == "b" and "b crashed" in exited["reason"]


async def test_restarts_spread_beyond_the_period_do_not_escalate() -> None:
    j = Journal()
    clock = FakeClock()
    sup = make(j, "a", intensity=2, period=5.0, clock=clock)
    async with supervising(sup) as raised:
        for _ in range(5):
            await crash(sup, "a")
            clock.advance(2.6)  # at most two restarts in any 5 s window
        assert raised == []
        assert states(sup) == {"a": ("running", 5)}


async def test_failing_restarts_count_toward_intensity() -> None:
    j = Journal()
    attempts: list[int] = []

    def flaky() -> Worker:
        attempts.append(1)
        return Worker("a", j.entries, fail_start=len(attempts) > 1)

    clock = FakeClock()
    sup = Supervisor("sup", [ChildSpec("a", flaky)], intensity=3, clock=clock)
    async with supervising(sup) as raised:
        await crash(sup, "a")
        for _ in range(10):  # the failed starts back off: let the fake time pass
            clock.advance(1.0)
            await anyio.wait_all_tasks_blocked()
    # the first start, a restart, and two more after failed starts: the next would be the 4th
    assert len(attempts) == 1 + 3
    assert isinstance(raised[0], SupervisorEscalationError)
    assert isinstance(raised[0].__cause__, RuntimeError)


async def test_a_child_that_fails_to_start_fails_the_supervisor_start() -> None:
    j = Journal()
    specs = [j.spec("a"), ChildSpec("b", lambda: Worker("b", j.entries, fail_start=True))]
    sup = Supervisor("sup", [*specs, j.spec("c")], clock=FakeClock())
    with pytest.raises(SupervisorEscalationError) as info:
        await sup.run()
    assert isinstance(info.value.__cause__, RuntimeError)
    assert j.take() == ["start:a", "stop:b", "stop:a"]  # an actor's on_stop runs whatever


# -- shutdown ---------------------------------------------------------------------------------


async def test_a_child_that_ignores_stop_is_cancelled_after_its_shutdown() -> None:
    j = Journal()
    clock = FakeClock()
    specs = [j.spec("a"), j.spec("stuck", shutdown=3.0)]
    sup = Supervisor("sup", specs, clock=clock)
    async with supervising(sup):
        sup.ref("stuck").tell(Hang())  # Stop waits behind a handler that never returns
        async with anyio.create_task_group() as tg:
            tg.start_soon(sup.stop)
            await anyio.wait_all_tasks_blocked()
            clock.advance(2.9)
            await anyio.wait_all_tasks_blocked()
            assert j.entries == ["start:a", "start:stuck"]  # still waiting for it
            clock.advance(0.1)
    assert j.take() == ["start:a", "start:stuck", "stop:stuck", "stop:a"]


async def test_stop_during_a_restart_is_safe() -> None:
    j = Journal()
    clock = FakeClock()
    specs = [j.spec("a"), j.spec("stuck", shutdown=3.0), j.spec("c")]
    sup = Supervisor("sup", specs, Strategy.ONE_FOR_ALL, clock=clock)
    async with supervising(sup) as raised:
        sup.ref("stuck").tell(Hang())
        sup.ref("c").tell(Crash())
        await anyio.wait_all_tasks_blocked()  # the restart waits for "stuck" to stop
        assert states(sup)["c"] == ("restarting", 0)
        async with anyio.create_task_group() as tg:
            tg.start_soon(sup.stop)
            await anyio.wait_all_tasks_blocked()
            clock.advance(3.0)
    assert raised == []
    assert j.take() == ["start:a", "start:stuck", "start:c", "stop:c", "stop:stuck", "stop:a"]
    assert [s for _, s, _ in sup.children()] == ["stopped"] * 3


# -- nesting ----------------------------------------------------------------------------------


async def test_nested_supervisor_is_a_child() -> None:
    j = Journal()
    clock = FakeClock()
    inners: list[Supervisor] = []

    def inner() -> Supervisor:
        sup = Supervisor("inner", [j.spec("x"), j.spec("y")], intensity=0, clock=clock)
        inners.append(sup)
        return sup

    outer = Supervisor("outer", [j.spec("a"), ChildSpec("inner", inner), j.spec("b")], clock=clock)
    async with supervising(outer) as raised:
        assert j.take() == ["start:a", "start:x", "start:y", "start:b"]
        assert outer.ref("inner") is inners[0]
        assert await outer.ref("inner").ref("y").ask(Ping()) == "y"
        # the inner supervisor gives up at once (intensity 0); the outer one restarts it
        await crash(inners[0], "x")
        assert j.take() == ["stop:x", "stop:y", "start:x", "start:y"]
        assert outer.ref("inner") is inners[1]
        assert states(outer)["inner"] == ("running", 1)
    assert raised == []
    assert j.take() == ["stop:b", "stop:y", "stop:x", "stop:a"]


# -- deliberate operations --------------------------------------------------------------------


async def test_restart_child_applies_the_strategy_and_counts_toward_intensity() -> None:
    j = Journal()
    sup = make(j, "a", "b", "c", strategy=Strategy.REST_FOR_ONE, intensity=1)
    async with supervising(sup) as raised:
        j.take()
        old_a = sup.ref("a")
        await sup.restart_child("b")
        assert j.take() == ["stop:c", "stop:b", "start:b", "start:c"]
        assert sup.ref("a") is old_a
        assert states(sup) == {"a": ("running", 0), "b": ("running", 1), "c": ("running", 1)}
        with pytest.raises(SupervisorEscalationError):
            await sup.restart_child("a")
        await anyio.wait_all_tasks_blocked()
        assert len(raised) == 1


async def test_terminate_start_and_delete_children() -> None:
    j = Journal()
    sup = make(j, "a", "b")
    async with supervising(sup):
        j.take()
        await sup.terminate_child("a")
        assert j.take() == ["stop:a"]
        assert states(sup) == {"a": ("stopped", 0), "b": ("running", 0)}
        with pytest.raises(ActorStoppedError):
            sup.ref("a")
        await sup.restart_child("a")  # back in service
        assert j.take() == ["start:a"]

        ref = await sup.start_child(j.spec("c", Restart.TRANSIENT))
        assert ref is sup.ref("c") and await ref.ask(Ping()) == "c"
        assert [c for c, _, _ in sup.children()] == ["a", "b", "c"]
        with pytest.raises(ValueError, match="already has"):
            await sup.start_child(j.spec("c"))
        await crash(sup, "c")
        assert states(sup)["c"] == ("running", 1)

        await sup.delete_child("b")
        assert [c for c, _, _ in sup.children()] == ["a", "c"]
        with pytest.raises(KeyError):
            sup.ref("b")
        with pytest.raises(KeyError):
            await sup.terminate_child("b")
        j.take()
    assert j.take() == ["stop:c", "stop:a"]


async def test_start_child_that_fails_is_not_added() -> None:
    j = Journal()
    sup = make(j, "a")
    async with supervising(sup) as raised:
        bad = ChildSpec("bad", lambda: Worker("bad", j.entries, fail_start=True))
        with pytest.raises(RuntimeError, match="cannot start"):
            await sup.start_child(bad)
        assert [c for c, _, _ in sup.children()] == ["a"]
    assert raised == []


async def test_on_event_failures_do_not_break_supervision() -> None:
    def explode(event: SupervisorEvent) -> None:
        raise RuntimeError("observer bug")

    j = Journal()
    sup = make(j, "a", on_event=explode)
    async with supervising(sup) as raised:
        await crash(sup, "a")
        assert states(sup) == {"a": ("running", 1)}
    assert raised == []


async def test_cancelling_run_leaves_nothing_running() -> None:
    j = Journal()
    sup = make(j, "a", "b")
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            await tg.start(sup.run)
            a: ActorRef[object] = sup.ref("a")
            scope.cancel()
    assert not a.is_alive
    assert sorted(j.take()) == ["start:a", "start:b", "stop:a", "stop:b"]
    assert [s for _, s, _ in sup.children()] == ["stopped"] * 2
    await sup.stop()  # returns at once


async def test_shutdown_timeout_on_the_system_clock() -> None:
    j = Journal()
    sup = Supervisor("sup", [j.spec("stuck", shutdown=0.05)])  # real time, but tiny
    async with supervising(sup):
        sup.ref("stuck").tell(Hang())
        with anyio.fail_after(2):
            await sup.stop()
    assert j.take() == ["start:stuck", "stop:stuck"]


# -- backoff and progress ---------------------------------------------------------------------


async def wait_for_restart(sup: Supervisor, clock: FakeClock, cid: str) -> float:
    """Move the fake time in 1 ms steps until ``cid`` runs again; how long that took."""
    start = clock.monotonic()
    for _ in range(1000):
        if states(sup)[cid][0] == "running":
            break
        clock.advance(0.001)
        await anyio.wait_all_tasks_blocked()
    assert states(sup)[cid][0] == "running"
    return clock.monotonic() - start


@pytest.mark.parametrize(
    ("backoff", "waits"),
    [
        (Backoff(), [0.0, 0.01, 0.02, 0.04, 0.08, 0.16]),
        (Backoff(cap=0.03), [0.0, 0.01, 0.02, 0.03, 0.03, 0.03]),
        (None, [0.0] * 6),
    ],
)
async def test_a_child_that_keeps_crashing_is_restarted_after_growing_delays(
    backoff: Backoff | None, waits: list[float]
) -> None:
    j = Journal()
    clock = FakeClock()
    # intensity 10: this test watches the delays grow past the default intensity of 3 restarts
    sup = make(j, "a", "b", intensity=10, clock=clock, backoff=backoff)
    async with supervising(sup) as raised:
        seen = []
        for n in range(1, 7):
            await crash(sup, "a")
            seen.append(await wait_for_restart(sup, clock, "a"))
            assert states(sup) == {"a": ("running", n), "b": ("running", 0)}
        assert seen == pytest.approx(waits, abs=0.0015)
    assert raised == []


async def test_a_child_whose_start_keeps_failing_is_not_retried_in_a_tight_loop() -> None:
    j = Journal()
    attempts: list[int] = []

    def flaky() -> Worker:
        attempts.append(1)
        return Worker("a", j.entries, fail_start=len(attempts) > 1)

    clock = FakeClock()
    sup = Supervisor("sup", [ChildSpec("a", flaky)], clock=clock)
    async with supervising(sup) as raised:
        await crash(sup, "a")
        assert len(attempts) == 2  # the first start, and a restart at once that failed
        assert states(sup) == {"a": ("restarting", 0)}
        for step, expected in [(0.009, 2), (0.002, 3), (0.018, 3), (0.003, 4)]:
            clock.advance(step)  # waits 0.01, then 0.02, between the failed starts
            await anyio.wait_all_tasks_blocked()
            assert len(attempts) == expected
        # the 4th restart within the period passed the (default) intensity
        assert len(raised) == 1 and isinstance(raised[0], SupervisorEscalationError)
        assert isinstance(raised[0].__cause__, RuntimeError)


async def test_a_stable_run_resets_the_backoff() -> None:
    j = Journal()
    clock = FakeClock()
    # intensity 10: five restarts within the period; this test is about the backoff
    sup = make(j, "a", intensity=10, clock=clock)
    async with supervising(sup) as raised:
        await crash(sup, "a")
        await crash(sup, "a")
        assert await wait_for_restart(sup, clock, "a") == pytest.approx(0.01, abs=0.0015)
        clock.advance(0.9)  # shorter than reset_after (1 s): still crashing in a loop
        await crash(sup, "a")
        assert await wait_for_restart(sup, clock, "a") == pytest.approx(0.02, abs=0.0015)
        clock.advance(1.0)  # ran reset_after: its next restart is a first one again
        await crash(sup, "a")
        assert states(sup) == {"a": ("running", 4)}
        await crash(sup, "a")
        assert await wait_for_restart(sup, clock, "a") == pytest.approx(0.01, abs=0.0015)
        assert states(sup) == {"a": ("running", 5)}
    assert raised == []


@pytest.mark.parametrize("progress", [True, False])
async def test_forgive_lets_a_subtree_that_makes_progress_outlive_its_intensity(
    progress: bool,
) -> None:
    j = Journal()
    clock = FakeClock()
    sup = make(j, "a", "b", clock=clock)  # intensity 3 in 5 s
    async with supervising(sup) as raised:
        for n in range(1, 7):
            await crash(sup, "a")
            if raised:
                break
            if progress:  # forgiven: every restart is a first one, at once
                assert states(sup)["a"] == ("running", n)
            clock.advance(0.5)  # past any backoff, well within the period
            await anyio.wait_all_tasks_blocked()
            assert states(sup)["a"] == ("running", n)
            if progress:
                sup.forgive("a" if n % 2 else None)
        with pytest.raises(KeyError):
            sup.forgive("nobody")
    if progress:
        assert raised == []
        assert states(sup) == {"a": ("stopped", 6), "b": ("stopped", 0)}
    else:
        assert n == 4  # the 4th restart within 5 s passed the intensity
        assert len(raised) == 1 and isinstance(raised[0], SupervisorEscalationError)


@pytest.mark.parametrize("how", ["crash", "restart_child"])
async def test_stop_during_a_backoff_wait_returns_promptly(how: str) -> None:
    j = Journal()
    clock = FakeClock()
    sup = make(j, "a", "b", clock=clock)
    async with supervising(sup) as raised:
        await crash(sup, "a")  # restarted at once; the next restart waits
        async with anyio.create_task_group() as tg:
            if how == "crash":
                await crash(sup, "a")
            else:

                async def restart() -> None:
                    with pytest.raises(ActorStoppedError):
                        await sup.restart_child("a")

                tg.start_soon(restart)
                await anyio.wait_all_tasks_blocked()
            assert states(sup)["a"] == ("restarting", 1)
            with anyio.fail_after(1):  # the fake clock never moves: only stop() ends the wait
                await sup.stop()
    assert raised == []
    assert j.take() == ["start:a", "start:b", "stop:a", "start:a", "stop:a", "stop:b"]
    assert states(sup) == {"a": ("stopped", 1), "b": ("stopped", 0)}


def test_backoff_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="factor"):
        Backoff(factor=0.5)
    with pytest.raises(ValueError):
        Backoff(initial=-1.0)


async def test_rest_for_one_restarts_from_an_earlier_sibling_that_died_unnoticed() -> None:
    """b and c die together, c's exit handled first: c's start needs a live b (as a session
    needs its device), so the group restarts from b instead of failing c's start in a loop
    until the intensity is spent."""
    j = Journal()
    holder: list[Supervisor] = []

    def make_c() -> Worker:
        holder[0].ref("b")  # raises ActorStoppedError while b is dead
        return Worker("c", j.entries)

    sup = Supervisor(
        "sup",
        [j.spec("a"), j.spec("b"), ChildSpec("c", make_c)],
        strategy=Strategy.REST_FOR_ONE,
        intensity=2,
        clock=FakeClock(),
    )
    holder.append(sup)
    async with supervising(sup) as raised:
        j.take()
        c, b = sup.ref("c"), sup.ref("b")
        c.tell(Crash())
        b.tell(Crash())
        await anyio.wait_all_tasks_blocked()
        assert raised == []
        assert states(sup)["b"] == ("running", 1) and states(sup)["c"][0] == "running"
        assert "start:b" in j.take()
        assert await sup.ref("c").ask(Ping()) == "c"

"""The actor core: ask/tell failure semantics, pending asks on stop, back-pressure, fake clock."""

from __future__ import annotations

from dataclasses import dataclass

import anyio
import pytest

from actors.actor import Actor, ActorRef, MailboxFullError, Stop
from actors.clock import FakeClock, move_on_after
from model_runtime.errors import ActorStoppedError, ExecutionTimeoutError


@dataclass(frozen=True, slots=True)
class Add:
    n: int


@dataclass(frozen=True, slots=True)
class Boom:
    pass


@dataclass(frozen=True, slots=True)
class Block:
    event: anyio.Event


class Counter(Actor[object]):
    def __init__(self) -> None:
        super().__init__("counter")
        self.total = 0
        self.stopped = False

    async def handle(self, message: object) -> object:
        match message:
            case Add(n):
                self.total += n
                return self.total
            case Boom():
                raise ValueError("boom")
            case Block(event):
                await event.wait()
                return None
        return await super().handle(message)

    async def on_stop(self) -> None:
        self.stopped = True


async def test_ask_returns_the_handlers_answer() -> None:
    async with anyio.create_task_group() as tg:
        ref: ActorRef[object] = await tg.start(Counter().run)
        assert await ref.ask(Add(2)) == 2
        assert await ref.ask(Add(3)) == 5
        await ref.ask(Stop())


async def test_failed_ask_goes_to_the_asker_and_the_actor_carries_on() -> None:
    async with anyio.create_task_group() as tg:
        ref: ActorRef[object] = await tg.start(Counter().run)
        with pytest.raises(ValueError, match="boom"):
            await ref.ask(Boom())
        assert await ref.ask(Add(1)) == 1
        await ref.ask(Stop())


async def test_failed_tell_ends_the_actor_and_fails_pending_asks() -> None:
    actor = Counter()
    with pytest.raises(ExceptionGroup) as info:
        async with anyio.create_task_group() as tg:
            ref: ActorRef[object] = await tg.start(actor.run)
            gate = anyio.Event()
            results: list[BaseException] = []

            async def asker() -> None:
                try:
                    await ref.ask(Add(1))
                except ActorStoppedError as exc:
                    results.append(exc)

            ref.tell(Block(gate))
            ref.tell(Boom())
            tg.start_soon(asker)
            await anyio.wait_all_tasks_blocked()
            gate.set()
    assert info.group_contains(ValueError, match="boom")
    assert len(results) == 1
    assert actor.stopped and not actor.is_running
    with pytest.raises(ActorStoppedError):
        await ref.ask(Add(1))
    with pytest.raises(ActorStoppedError):
        ref.tell(Add(1))


async def test_tell_on_a_full_mailbox_raises() -> None:
    class Small(Counter):
        mailbox_size = 1

    async with anyio.create_task_group() as tg:
        ref: ActorRef[object] = await tg.start(Small().run)
        gate = anyio.Event()
        ref.tell(Block(gate))
        await anyio.wait_all_tasks_blocked()  # the actor now waits inside Block
        ref.tell(Add(1))
        with pytest.raises(MailboxFullError):
            ref.tell(Add(1))
        gate.set()
        await ref.ask(Stop())


async def test_ask_timeout_is_typed() -> None:
    async with anyio.create_task_group() as tg:
        ref: ActorRef[object] = await tg.start(Counter().run)
        gate = anyio.Event()
        with pytest.raises(ExecutionTimeoutError):
            await ref.ask(Block(gate), timeout=0.01)
        gate.set()
        assert await ref.ask(Add(1)) == 1
        await ref.ask(Stop())


async def test_fake_clock_wakes_sleepers_in_order_without_sleeping() -> None:
    clock = FakeClock()
    woke: list[str] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append(name)

    async with anyio.create_task_group() as tg:
        tg.start_soon(sleeper, "late", 10.0)
        tg.start_soon(sleeper, "early", 1.0)
        await anyio.wait_all_tasks_blocked()
        clock.advance(1.0)
        await anyio.wait_all_tasks_blocked()
        assert woke == ["early"]
        clock.advance(9.0)
    assert woke == ["early", "late"]


async def test_move_on_after_with_fake_clock() -> None:
    clock = FakeClock()
    async with anyio.create_task_group() as tg:

        async def bounded() -> None:
            async with move_on_after(clock, 5.0) as scope:
                await anyio.sleep_forever()
            assert scope.cancelled_caught

        tg.start_soon(bounded)
        await anyio.wait_all_tasks_blocked()
        clock.advance(5.0)

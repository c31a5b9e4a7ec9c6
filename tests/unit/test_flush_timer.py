"""The flush timer on the system clock: a deadline due now is met by a callback on the loop's
next iteration (the timer's task stays asleep), a later one by the task's sleep, and what
``on_due`` raises in a callback kills the task, as if it had run there."""

from __future__ import annotations

import math

import anyio
import anyio.lowlevel
import pytest

from actors.clock import SystemClock
from actors.queues.timer import FlushTimer


class _Deadline:
    def __init__(self, clock: SystemClock) -> None:
        self.clock = clock
        self.at = math.inf
        self.due: list[float] = []
        self.fail: BaseException | None = None
        self.flushed: anyio.Event | None = None

    def __call__(self) -> float:
        return self.at

    def on_due(self) -> None:
        if self.fail is not None:
            raise self.fail
        self.due.append(self.clock.monotonic())
        self.at = math.inf  # flushed: nothing waits
        if self.flushed is not None:
            self.flushed.set()


async def _settle(turns: int = 5) -> None:
    for _ in range(turns):
        await anyio.lowlevel.checkpoint()


async def test_a_deadline_due_now_is_met_without_waking_the_task() -> None:
    clock = SystemClock()
    deadline = _Deadline(clock)
    timer = FlushTimer(clock, deadline, deadline.on_due)
    steps = 0

    async def run() -> None:
        nonlocal steps
        steps += 1
        await timer.run()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        await _settle()
        waiting = timer._event
        assert waiting is not None  # asleep, nothing due
        for _ in range(3):
            deadline.at = clock.monotonic()  # a partial batch, due at once
            timer.kick()
            timer.kick()  # (one callback, however many kicks)
            await _settle()
        assert len(deadline.due) == 3
        assert timer._event is waiting and not waiting.is_set()  # the task never woke
        tg.cancel_scope.cancel()
    assert steps == 1


async def test_a_later_deadline_wakes_the_task_to_sleep_until_it() -> None:
    clock = SystemClock()
    deadline = _Deadline(clock)
    timer = FlushTimer(clock, deadline, deadline.on_due)
    async with anyio.create_task_group() as tg:
        tg.start_soon(timer.run)
        await _settle()
        kicked = clock.monotonic()
        deadline.at = kicked + 0.02
        deadline.flushed = flushed = anyio.Event()
        timer.kick()
        with anyio.fail_after(5):
            await flushed.wait()
        assert deadline.due[0] >= kicked + 0.02
        tg.cancel_scope.cancel()


async def test_what_on_due_raises_in_a_callback_ends_the_timer_task() -> None:
    clock = SystemClock()
    deadline = _Deadline(clock)
    deadline.fail = RuntimeError("flush failed")
    timer = FlushTimer(clock, deadline, deadline.on_due)
    with pytest.raises(BaseExceptionGroup) as caught:
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(timer.run)
                await _settle()
                deadline.at = clock.monotonic()
                timer.kick()
                await anyio.sleep_forever()
    assert caught.group_contains(RuntimeError, match="flush failed")


async def test_a_stopped_timer_runs_no_callback() -> None:
    clock = SystemClock()
    deadline = _Deadline(clock)
    timer = FlushTimer(clock, deadline, deadline.on_due)
    async with anyio.create_task_group() as tg:
        tg.start_soon(timer.run)
        await _settle()
        tg.cancel_scope.cancel()
    deadline.at = clock.monotonic()
    timer.kick()  # the queue stopped: nobody flushes
    await _settle()
    assert deadline.due == []

"""Injectable time: every actor reads time and sleeps through a :class:`Clock`.

:class:`SystemClock` is the real thing. :class:`FakeClock` never moves by itself: tests call
:meth:`FakeClock.advance` and every sleeper whose deadline has passed wakes up, so tests of
timeouts, intensity windows and wait strategies run instantly and deterministically.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Protocol

import anyio

__all__ = ["Clock", "FakeClock", "SystemClock", "move_on_after"]


class Clock(Protocol):
    """Monotonic time in seconds, and sleeping on that time."""

    def monotonic(self) -> float:
        """Seconds on a monotonic clock."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` (<= 0: yield once)."""
        ...

    async def sleep_until(self, deadline: float) -> None:
        """Sleep until :meth:`monotonic` reaches ``deadline``."""
        ...


class SystemClock:
    """The real monotonic clock. ``time.monotonic`` directly: it is what asyncio's loop reads,
    and anyio's ``current_time()`` costs ~4 µs of backend lookup on every request."""

    monotonic = staticmethod(time.monotonic)

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(max(0.0, seconds))

    async def sleep_until(self, deadline: float) -> None:
        # Relative to the same clock as monotonic() (uvloop's loop time is a cached copy).
        await anyio.sleep(max(0.0, deadline - time.monotonic()))


class FakeClock:
    """A clock that only moves when told to. Sleepers wake in deadline order."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, int, anyio.Event]] = []
        self._seq = itertools.count()

    def monotonic(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        await self.sleep_until(self._now + max(0.0, seconds))

    async def sleep_until(self, deadline: float) -> None:
        if deadline <= self._now:
            await anyio.lowlevel.checkpoint()
            return
        event = anyio.Event()
        heapq.heappush(self._sleepers, (deadline, next(self._seq), event))
        await event.wait()

    @property
    def sleepers(self) -> int:
        """How many tasks are sleeping on this clock (cancelled ones included until woken)."""
        return len(self._sleepers)

    def next_deadline(self) -> float:
        """The earliest deadline anyone sleeps until (``inf`` when nobody sleeps)."""
        return self._sleepers[0][0] if self._sleepers else math.inf

    def advance(self, seconds: float) -> None:
        """Move time forward and wake every sleeper whose deadline has come."""
        if seconds < 0:
            raise ValueError("time does not go backwards")
        self._now += seconds
        while self._sleepers and self._sleepers[0][0] <= self._now:
            _, _, event = heapq.heappop(self._sleepers)
            event.set()


@asynccontextmanager
async def move_on_after(clock: Clock, seconds: float | None) -> AsyncIterator[anyio.CancelScope]:
    """Like :func:`anyio.move_on_after`, but on ``clock`` (``None``: no limit).

    With a :class:`SystemClock` it is exactly anyio's; with a fake clock a watcher task cancels
    the scope when the fake time passes the deadline.
    """
    if seconds is None or isinstance(clock, SystemClock):
        with anyio.move_on_after(math.inf if seconds is None else seconds) as scope:
            yield scope
        return
    deadline = clock.monotonic() + seconds
    try:
        async with anyio.create_task_group() as tg:
            scope = anyio.CancelScope()

            async def watch() -> None:
                await clock.sleep_until(deadline)
                scope.cancel()

            tg.start_soon(watch)
            try:
                with scope:
                    yield scope
            finally:
                tg.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # The watcher's task group wraps what the body raised; callers must see it as is,
        # exactly as with the system clock (the watcher itself never raises).
        if len(group.exceptions) == 1:
            raise group.exceptions[0]  # noqa: B904 - the original, cause and all
        raise

"""The flush timer: sleeps on the injected clock until a partial batch is due to be flushed."""

from __future__ import annotations

import math
from collections.abc import Callable

import anyio
import anyio.lowlevel

from actors.clock import Clock, SystemClock

__all__ = ["FlushTimer"]


#: Below this, the loop's timers are too coarse to sleep on (epoll counts milliseconds).
_TIMER_RESOLUTION = 0.001


class FlushTimer:
    """Calls ``on_due()`` whenever ``deadline()`` (a clock time; ``inf``: none) has passed.

    One task runs :meth:`run`. Deadlines that move later (a new arrival) cost nothing: the
    timer finds out when it wakes. Call :meth:`kick` after a change that may move the deadline
    earlier (a new partial batch, a freed buffer): it wakes the timer only if needed.
    """

    __slots__ = ("_clock", "_deadline", "_event", "_on_due", "_scope", "_target")

    def __init__(
        self, clock: Clock, deadline: Callable[[], float], on_due: Callable[[], None]
    ) -> None:
        self._clock = clock
        self._deadline = deadline
        self._on_due = on_due
        self._target = math.inf  # what the timer sleeps until now
        self._scope: anyio.CancelScope | None = None
        self._event: anyio.Event | None = None

    def kick(self) -> None:
        """Wake the timer if the deadline is now before what it sleeps until."""
        if self._deadline() < self._target:
            if self._scope is not None:
                self._scope.cancel()
            elif self._event is not None:
                self._event.set()

    async def run(self) -> None:
        """Run until cancelled; ``on_due`` runs in this task and must not await."""
        while True:
            deadline = self._deadline()
            if deadline == math.inf:
                self._event = anyio.Event()
                await self._event.wait()
                self._event = None
            elif (now := self._clock.monotonic()) >= deadline:
                self._on_due()
                await anyio.lowlevel.checkpoint()  # never spin, even if on_due changed nothing
            elif deadline - now < _TIMER_RESOLUTION and isinstance(self._clock, SystemClock):
                # The event loop's timers round sleeps up to ~1 ms (epoll); a sub-millisecond
                # flush timeout would become 1 ms. Yield one loop iteration at a time instead,
                # so arrivals still get in and the flush comes on time.
                await anyio.lowlevel.checkpoint()
            else:
                self._target = deadline
                with anyio.CancelScope() as self._scope:
                    await self._clock.sleep_until(deadline)
                self._scope = None
                self._target = math.inf

"""The flush timer: sleeps on the injected clock until a partial batch is due to be flushed."""

from __future__ import annotations

import asyncio
import contextvars
import math
from collections.abc import Callable

import anyio

from actors.clock import Clock, SystemClock

__all__ = ["FlushTimer"]


#: Below this, the loop's timers are too coarse to sleep on (epoll counts milliseconds).
_TIMER_RESOLUTION = 0.001


class FlushTimer:
    """Calls ``on_due()`` whenever ``deadline()`` (a clock time; ``inf``: none) has passed.

    One task runs :meth:`run`. Deadlines that move later (a new arrival) cost nothing: the
    timer finds out when it wakes. Call :meth:`kick` after a change that may move the deadline
    earlier (a new partial batch, a freed buffer): it wakes the timer only if needed.

    On the system clock, a deadline kicked while the task waits with nothing due that is due
    now, or within the loop's timer resolution, is met by a callback on the loop's next
    iteration (iteration by iteration until it is due), not by waking the task: the task only
    wakes to sleep until a later deadline, or to raise what ``on_due`` raised there (the task,
    and the actor that runs it, dies of it as if ``on_due`` had run in it).
    """

    __slots__ = (
        "_clock",
        "_context",
        "_deadline",
        "_error",
        "_event",
        "_on_due",
        "_scope",
        "_soon",
        "_target",
    )

    def __init__(
        self, clock: Clock, deadline: Callable[[], float], on_due: Callable[[], None]
    ) -> None:
        self._clock = clock
        self._deadline = deadline
        self._on_due = on_due
        self._target = math.inf  # what the timer sleeps until now
        self._scope: anyio.CancelScope | None = None
        # Set while the task waits with nothing due. asyncio's own (the queues run on asyncio):
        # anyio's looks its backend up at each creation, about once a batch.
        self._event: asyncio.Event | None = None
        self._soon = False  # a callback is scheduled (only while the task waits)
        self._error: BaseException | None = None  # what on_due raised in a callback
        self._context = contextvars.copy_context()  # the task's, for the callbacks (run())

    def kick(self) -> None:
        """Wake the timer if the deadline is now before what it sleeps until."""
        deadline = self._deadline()
        if deadline < self._target:
            if self._scope is not None:
                self._scope.cancel()
            elif self._event is not None and not self._soon:
                if (
                    isinstance(self._clock, SystemClock)
                    and deadline - self._clock.monotonic() < _TIMER_RESOLUTION
                ):
                    self._soon = True
                    asyncio.get_running_loop().call_soon(self._due_soon, context=self._context)
                else:
                    self._event.set()

    def _due_soon(self) -> None:
        """The callback of a deadline due now or within the timer resolution (see the class)."""
        self._soon = False
        event = self._event
        if event is None:  # the task is up (or gone): it sees to the deadline itself
            return
        deadline = self._deadline()
        if deadline == math.inf:
            return
        if deadline - self._clock.monotonic() >= _TIMER_RESOLUTION:
            event.set()  # later than the loop can resolve: the task sleeps until it
            return
        if self._clock.monotonic() >= deadline:
            try:
                self._on_due()
            except BaseException as exc:
                self._error = exc
                event.set()
                return
            if self._deadline() == math.inf:
                return
        self._soon = True  # due on (or not yet due): looked at again next iteration
        asyncio.get_running_loop().call_soon(self._due_soon, context=self._context)

    async def run(self) -> None:
        """Run until cancelled; ``on_due`` runs in this task (or in a callback, see the class)
        and must not await.

        Raises:
            BaseException: what ``on_due`` raised.
        """
        self._context = contextvars.copy_context()  # (not the context of whoever kicks)
        try:
            while True:
                if self._error is not None:
                    error, self._error = self._error, None
                    raise error
                deadline = self._deadline()
                if deadline == math.inf:
                    self._event = asyncio.Event()
                    await self._event.wait()
                    self._event = None
                elif (now := self._clock.monotonic()) >= deadline:
                    self._on_due()
                    await asyncio.sleep(0)  # never spin, even if on_due changed nothing
                elif deadline - now < _TIMER_RESOLUTION and isinstance(self._clock, SystemClock):
                    # The event loop's timers round sleeps up to ~1 ms (epoll); a sub-millisecond
                    # flush timeout would become 1 ms. Yield one loop iteration at a time instead,
                    # so arrivals still get in and the flush comes on time.
                    await asyncio.sleep(0)  # (anyio's checkpoint, without its backend lookup)
                else:
                    self._target = deadline
                    with anyio.CancelScope() as self._scope:
                        await self._clock.sleep_until(deadline)
                    self._scope = None
                    self._target = math.inf
        finally:
            self._event = None  # callbacks still scheduled find the timer gone
            self._scope = None
            self._target = math.inf

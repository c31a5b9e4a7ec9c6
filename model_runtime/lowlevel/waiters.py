"""How threads and coroutines wait on state one lock guards (the rings' and queues' waiting).

A waiting thread sleeps on the lock's ``Condition``, a waiting coroutine on a future of its own
loop, woken from other threads with ``call_soon_threadsafe``. Every wait passes an *attempt*
that does its work or returns :data:`PENDING`.
"""

from __future__ import annotations

import asyncio
import enum
import threading
import time
from collections.abc import Callable
from typing import Literal, TypeVar

from model_runtime.errors import DeviceStateError

__all__ = ["PENDING", "Pending", "Waiters", "earliest", "refuse_on_loop"]

R = TypeVar("R")


class _Pending(enum.Enum):
    PENDING = 0


Pending = Literal[_Pending.PENDING]
PENDING: Pending = _Pending.PENDING
"""What an attempt passed to :meth:`Waiters.wait` returns when it must wait and try again."""

Attempt = Callable[[], "R | Pending"]


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class Waiters:
    """Threads and coroutines waiting for a change of the state one lock guards.

    Every waiting call passes an *attempt*, run with the lock held, that either does its work
    and returns the result or returns :data:`PENDING`; the waiter then sleeps until the next
    :meth:`notify` (which the state's owner calls, with the lock held, after every change) and
    tries again. A thread sleeps on :attr:`cond`; a coroutine on a future of its own loop.
    """

    __slots__ = ("_blocked", "_futures", "_sleepers", "_watchers", "cond")

    def __init__(self, lock: threading.Lock | None = None) -> None:
        self.cond = threading.Condition(lock if lock is not None else threading.Lock())
        self._futures: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._sleepers = 0  # threads in cond.wait for a change
        self._watchers = 0  # threads in wait_until_blocked
        self._blocked = 0  # waiting calls, threads and coroutines

    def notify(self) -> None:
        """Wake every waiter. Call with :attr:`cond` held."""
        if self._sleepers:
            self.cond.notify_all()
        if not self._futures:
            return
        futures, self._futures = self._futures, []
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        for loop, fut in futures:
            if loop is running:
                _wake(fut)
            else:
                try:
                    loop.call_soon_threadsafe(_wake, fut)
                except RuntimeError:  # that loop is closed: nobody is left to wake
                    pass

    async def wait(
        self,
        attempt: Attempt[R],
        timeout: float | None,
        idle: tuple[float, Callable[[], object]] | None = None,
    ) -> R:
        """Run ``attempt`` until it is not :data:`PENDING`; ``idle = (period, cb)`` calls ``cb``
        every ``period`` seconds spent waiting.

        Raises:
            TimeoutError: still pending after ``timeout`` seconds.
        """
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        deadline = None if timeout is None else now + timeout
        idle_at = None if idle is None else now + idle[0]
        while True:
            with self.cond:
                result = attempt()
                if result is not PENDING:
                    return result
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    raise TimeoutError
                idle_due = idle_at is not None and now >= idle_at
                if not idle_due:
                    fut: asyncio.Future[None] = loop.create_future()
                    entry = (loop, fut)
                    self._futures.append(entry)
                    self._blocked += 1
                    self._watched()
            if idle_due:
                assert idle is not None
                idle[1]()
                idle_at = time.monotonic() + idle[0]
                continue
            try:
                wake_at = earliest(deadline, idle_at)
                if wake_at is None:
                    await fut
                else:
                    await asyncio.wait((fut,), timeout=wake_at - now)
            finally:
                with self.cond:
                    self._blocked -= 1
                    if not fut.done():
                        fut.cancel()
                        if entry in self._futures:
                            self._futures.remove(entry)

    def wait_blocking(
        self,
        attempt: Attempt[R],
        timeout: float | None,
        idle: tuple[float, Callable[[], object]] | None = None,
        *,
        instead: str = "the async call (await it)",
    ) -> R:
        """:meth:`wait` for a thread: sleeps on :attr:`cond` (``idle`` runs without the lock).

        Raises:
            TimeoutError: still pending after ``timeout`` seconds.
            DeviceStateError: called on a thread running an event loop (it would block the
                loop; use ``instead``).
        """
        refuse_on_loop(instead)
        now = time.monotonic()
        deadline = None if timeout is None else now + timeout
        idle_at = None if idle is None else now + idle[0]
        while True:
            with self.cond:
                while True:
                    result = attempt()
                    if result is not PENDING:
                        return result
                    now = time.monotonic()
                    if deadline is not None and now >= deadline:
                        raise TimeoutError
                    if idle_at is not None and now >= idle_at:
                        break  # run the idle callback without the lock
                    wake_at = earliest(deadline, idle_at)
                    self._blocked += 1
                    self._sleepers += 1
                    self._watched()
                    try:
                        self.cond.wait(None if wake_at is None else wake_at - now)
                    finally:
                        self._blocked -= 1
                        self._sleepers -= 1
            assert idle is not None
            idle[1]()
            idle_at = time.monotonic() + idle[0]

    def wait_until_blocked(self, count: int = 1, timeout: float = 5.0) -> bool:
        """Block until ``count`` calls are waiting (a thread-side aid for tests and debugging:
        it says *when* the other side sleeps, without sleeping for it). False on timeout."""
        with self.cond:
            self._watchers += 1
            try:
                return self.cond.wait_for(lambda: self._blocked >= count, timeout)
            finally:
                self._watchers -= 1

    @property
    def blocked(self) -> int:
        """How many calls are waiting now."""
        return self._blocked

    def _watched(self) -> None:
        # A new waiter: wake wait_until_blocked (and, spuriously, sleepers, who retry).
        if self._watchers:
            self.cond.notify_all()


def refuse_on_loop(instead: str) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise DeviceStateError(
        f"a blocking call would block the event loop running in this thread; use {instead}"
    )


def earliest(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else min(a, b)

"""The deadlines of one event loop's requests, kept with one timer for those that come in
deadline order (a python model's submitted requests; requests queued directly on an ONNX model's
runner by ``server/inference/direct.py``).

Requests usually come in the order of their deadlines (a server's one request timeout; an
ensemble's steps, each bounded by its request's deadline, reach a model in about the order the
requests came): each is added behind the last in a line that one timer, armed for the first
still waiting, serves; adding and discarding one is a dict insert and pop, where a timer per
request would be made, started, stopped and closed on the loop each time. A request whose
deadline falls before the last one in line gets a timer of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["Deadlines"]

K = TypeVar("K", bound=Hashable)


class Deadlines(Generic[K]):
    """Keys of one event loop, each expired (``expire(key, timeout)``, on the loop) once the
    ``timeout`` seconds it was added with have passed, unless discarded first."""

    __slots__ = ("_armed_at", "_expire", "_line", "_own", "_tail", "_timer", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, expire: Callable[[K, float], None]) -> None:
        self.loop = loop
        self._expire = expire
        #: key -> (deadline in loop time, timeout), the deadlines in the order added
        self._line: dict[K, tuple[float, float]] = {}
        self._tail = 0.0  # the deadline of the last key added to the line
        self._timer: asyncio.TimerHandle | None = None  # armed while the line may hold one
        self._armed_at = 0.0
        #: keys whose deadline came before the line's last: a timer each
        self._own: dict[K, asyncio.TimerHandle] = {}

    def __len__(self) -> int:
        return len(self._line) + len(self._own)

    def add(self, key: K, timeout: float) -> None:
        """Expire ``key`` ``timeout`` seconds from now."""
        loop = self.loop
        at = loop.time() + timeout
        line = self._line
        if line and at < self._tail:  # before the last in line: a timer of its own
            self._own[key] = loop.call_at(at, self._own_expired, key, timeout)
            return
        line[key] = (at, timeout)
        self._tail = at
        timer = self._timer
        if timer is None or at < self._armed_at:  # (the line was empty: its timer may be late)
            if timer is not None:
                timer.cancel()
            self._timer = loop.call_at(at, self._fire)
            self._armed_at = at

    def discard(self, key: K) -> None:
        """``key`` no longer expires (answered, or gone); nothing if it was not waiting."""
        if self._line.pop(key, None) is None:
            own = self._own.pop(key, None)
            if own is not None:
                own.cancel()

    def _own_expired(self, key: K, timeout: float) -> None:
        if self._own.pop(key, None) is not None:
            self._expire(key, timeout)

    def _fire(self) -> None:
        """Expire the keys of the line past their deadlines, in order; arm the timer for the
        next one."""
        self._timer = None
        line = self._line
        now = self.loop.time()
        while line:
            key = next(iter(line))
            at, timeout = line[key]
            if at > now:  # the next deadline (those before it were discarded)
                if self._timer is not None:  # (armed by an add as one expired)
                    self._timer.cancel()
                self._timer = self.loop.call_at(at, self._fire)
                self._armed_at = at
                return
            del line[key]
            self._expire(key, timeout)

"""One incarnation of a supervised child: its task, how it reports started and exited, its stop.

A :class:`~actors.supervision.Supervisor` starts a child by hosting :meth:`Incarnation.host` in
its task group. The incarnation records when the child reported started and when its task
ended, and tells the supervisor how it exited (``None``: normally; else the failure, unwrapped
from single-exception groups) unless it was being stopped on purpose. :meth:`Incarnation.stop`
is the graceful stop: ask, wait up to the spec's shutdown time, then cancel the task.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import anyio
import anyio.abc
import structlog

from actors.actor import ActorRef, Stop
from actors.child_spec import Child
from actors.clock import Clock, move_on_after

__all__ = ["Incarnation"]

_log = structlog.get_logger("actors.supervision")


@runtime_checkable
class _Stoppable(Protocol):
    async def stop(self) -> None: ...


def _unwrap(exc: BaseException) -> BaseException:
    """The one real failure inside nested single-exception groups (an actor's task group)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


@dataclass(eq=False, slots=True)
class Incarnation:
    """One run of a child: its task's cancel scope, its ref, whether it started and ended."""

    child: Child
    ref: Any = None
    started: bool = False
    began: float = 0.0  #: when it reported started (the clock's time)
    ended: float = math.inf  #: when its task ended
    stopping: bool = False
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    done: anyio.Event = field(default_factory=anyio.Event)

    async def host(
        self,
        clock: Clock,
        on_exit: Callable[[BaseException | None], None],
        log: Any,
        *,
        task_status: anyio.abc.TaskStatus[Any],
    ) -> None:
        """The child's task: run it in its own cancel scope, then report how it exited.

        A failure before the child reported started goes to the starter (through
        ``tg.start``); one after it is passed to ``on_exit``, which is not called when the
        incarnation was being stopped on purpose.
        """
        reason: BaseException | None = None
        try:
            with self.scope:
                try:
                    await self.child.run(task_status=_Relay(task_status, self))
                except Exception as exc:
                    if not self.started:
                        raise
                    reason = _unwrap(exc)
        finally:
            self.ended = clock.monotonic()
            self.done.set()
        if self.stopping:
            if reason is not None:
                log.warning("child_stop_failed")
        else:
            on_exit(reason)

    async def stop(self, clock: Clock, shutdown: float, log: Any) -> None:
        """Stop gracefully within ``shutdown`` seconds (ask, then wait), else cancel the task."""
        self.stopping = True
        if self.done.is_set():
            return
        async with move_on_after(clock, shutdown):
            try:
                if isinstance(self.child, _Stoppable):
                    await self.child.stop()
                elif isinstance(self.ref, ActorRef):
                    await self.ref.ask(Stop())
            except Exception:  # e.g. it stopped already: waiting below is what counts
                pass
            await self.done.wait()
        if not self.done.is_set():
            log.warning("child_killed")
            self.scope.cancel()
            await self.done.wait()


class _Relay:
    """Passes ``started(ref)`` on to the starter and records it on the incarnation."""

    def __init__(self, outer: anyio.abc.TaskStatus[Any], run: Incarnation) -> None:
        self._outer = outer
        self._run = run

    def started(self, value: Any = None) -> None:
        self._run.ref = value
        self._run.started = True
        self._outer.started(value)

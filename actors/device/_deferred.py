"""Deferred answers: an actor whose slow handlers run as tasks, so its mailbox stays responsive.

The base :class:`~actors.actor.Actor` answers an ``ask`` with what ``handle`` returns, which
means the mailbox waits for the handler. The device actors must answer ``GetStatus`` and take a
``Reset`` while a run (or an attach) is still going, so :meth:`DeferringActor.defer` runs the
slow part in a task group that :meth:`DeferringActor.background` owns and answers the envelope
when it is done. Semantics stay the base's: a failure goes to the asker of an ``ask``; a failure
of a ``tell`` (or an exception in ``fatal``) ends the actor; a task cut short by the actor's end
fails its asker with :class:`ActorStoppedError`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import anyio.abc

from actors.actor import Actor, Envelope
from model_runtime.errors import ActorStoppedError

__all__ = ["DeferringActor"]

M = TypeVar("M")


class DeferringActor(Actor[M]):
    """An actor with a task group for answers that come later (see the module docstring)."""

    #: Exceptions that end the actor even when they come from an ``ask``.
    fatal: tuple[type[BaseException], ...] = ()

    _tasks: anyio.abc.TaskGroup | None = None
    _tasks_ready: anyio.Event | None = None
    _death: anyio.Event | None = None
    _death_cause: BaseException | None = None

    async def on_start(self) -> None:
        self._tasks_ready = anyio.Event()
        self._death = anyio.Event()
        await super().on_start()

    async def background(self) -> None:
        assert self._tasks_ready is not None and self._death is not None
        async with anyio.create_task_group() as tg:
            self._tasks = tg
            self._tasks_ready.set()
            await self._death.wait()
            assert self._death_cause is not None
            raise self._death_cause

    def die(self, cause: BaseException) -> None:
        """End the actor with ``cause`` (from a callback, where raising reaches nobody)."""
        if self._death is not None and self._death_cause is None:
            self._death_cause = cause
            self._death.set()

    async def task_group(self) -> anyio.abc.TaskGroup:
        if self._tasks is None:
            assert self._tasks_ready is not None
            await self._tasks_ready.wait()
        assert self._tasks is not None
        return self._tasks

    async def defer(self, envelope: Envelope, work: Callable[[], Awaitable[Any]]) -> None:
        """Run ``work()`` in the actor's task group and answer ``envelope`` with its result."""
        tg = await self.task_group()
        tg.start_soon(self._answer_later, envelope, work)

    async def _answer_later(self, envelope: Envelope, work: Callable[[], Awaitable[Any]]) -> None:
        try:
            result = await work()
        except self.fatal:
            envelope.fail(ActorStoppedError(f"actor {self.name} crashed"))
            raise
        except Exception as exc:
            if envelope.reply is None:
                raise
            envelope.fail(exc)
        else:
            envelope.answer(result)
        finally:
            envelope.fail(ActorStoppedError(f"actor {self.name} has stopped"))  # no-op if done

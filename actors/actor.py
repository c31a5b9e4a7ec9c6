"""The actor core: a bounded mailbox, one loop that handles one message at a time, refs.

An :class:`Actor` is started inside a task group with ``ref = await tg.start(actor.run)``, so
"started" means its mailbox is open and :meth:`Actor.on_start` has finished. Messages are frozen
dataclasses handled by :meth:`Actor.handle` (with ``match``).

Failure semantics (pykka's, and DESIGN.md §3):

* an exception while handling an ``ask`` goes back to the asker; the actor carries on;
* an exception while handling a ``tell``, or from :meth:`Actor.background`, ends the actor: the
  exception leaves :meth:`Actor.run`, i.e. it reaches whoever supervises the task;
* when an actor stops, for any reason, every ask still in its mailbox, and every later ask,
  fails with :class:`ActorStoppedError`: no caller waits forever.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import anyio
import anyio.abc
import structlog
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from actors.clock import Clock, SystemClock
from model_runtime.errors import ActorError, ActorStoppedError, ExecutionTimeoutError

__all__ = ["Actor", "ActorRef", "Envelope", "MailboxFullError", "Stop"]

M = TypeVar("M")
_ids = itertools.count()


class MailboxFullError(ActorError):
    """``tell`` found the actor's bounded mailbox full (back-pressure: use ``send``/``ask``)."""


@dataclass(frozen=True, slots=True)
class Stop:
    """Ask an actor to stop after the messages already in its mailbox."""


@dataclass(slots=True)
class Envelope:
    """A message and, for an ``ask``, the future its answer goes to."""

    message: object
    reply: asyncio.Future[Any] | None = None

    def answer(self, value: object) -> None:
        if self.reply is not None and not self.reply.done():
            self.reply.set_result(value)

    def fail(self, exc: BaseException) -> None:
        if self.reply is not None and not self.reply.done():
            self.reply.set_exception(exc)
            # The asker may have gone (cancelled); do not warn about an unread exception.
            self.reply.exception()


class ActorRef(Generic[M]):
    """A handle to send messages to an actor. Cheap to copy; safe to keep after it stops."""

    __slots__ = ("_actor", "_send", "name")

    def __init__(self, actor: Actor[M], send: MemoryObjectSendStream[Envelope]) -> None:
        self._actor = actor
        self._send = send
        self.name = actor.name

    @property
    def is_alive(self) -> bool:
        return self._actor.is_running

    @property
    def actor(self) -> Actor[M]:
        """The actor itself, for the few same-loop fast paths that skip the mailbox (each
        documented where it is defined, e.g. ``Queue.enqueue_nowait``)."""
        return self._actor

    def tell(self, message: M) -> None:
        """Send ``message`` without waiting for room or for an answer.

        Raises:
            MailboxFullError: the mailbox is full.
            ActorStoppedError: the actor has stopped.
        """
        try:
            self._send.send_nowait(Envelope(message))
        except anyio.WouldBlock:
            raise MailboxFullError(f"actor {self.name}: mailbox full") from None
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            raise ActorStoppedError(f"actor {self.name} has stopped") from None

    async def send(self, message: M) -> None:
        """Send ``message``, waiting for room in the mailbox but not for an answer.

        Raises:
            ActorStoppedError: the actor has stopped.
        """
        try:
            await self._send.send(Envelope(message))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            raise ActorStoppedError(f"actor {self.name} has stopped") from None

    async def ask(self, message: M, timeout: float | None = None) -> Any:
        """Send ``message`` and wait for the answer (or the handler's exception).

        Raises:
            ActorStoppedError: the actor stopped before it answered.
            ExecutionTimeoutError: no answer within ``timeout`` seconds.
            Exception: whatever the handler raised, unchanged.
        """
        reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        try:
            with anyio.fail_after(timeout):
                await self._send.send(Envelope(message, reply))
                return await reply
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            raise ActorStoppedError(f"actor {self.name} has stopped") from None
        except TimeoutError:
            raise ExecutionTimeoutError(
                f"actor {self.name}: no answer to {type(message).__name__} within {timeout} s"
            ) from None
        finally:
            if not reply.done():
                reply.cancel()

    def __repr__(self) -> str:
        return f"ActorRef({self.name})"


#: Messages handled back to back without yielding to the event loop, when they are waiting.
_BURST = 128


async def _drain(recv: MemoryObjectReceiveStream[Envelope]) -> AsyncIterator[Envelope]:
    """Yield the mailbox's messages. Waiting messages are taken without a trip through the
    event loop (``receive`` costs one loop iteration each, ~10 µs here, more than handling a
    typical message); a checkpoint every ``_BURST`` keeps other tasks running under load."""
    burst = 0
    while True:
        try:
            envelope = recv.receive_nowait()
        except anyio.WouldBlock:
            burst = 0
            try:
                envelope = await recv.receive()
            except anyio.EndOfStream:
                return
        except anyio.EndOfStream:
            return
        else:
            burst += 1
            if burst >= _BURST:
                burst = 0
                await anyio.lowlevel.checkpoint()
        yield envelope


class Actor(Generic[M]):
    """Base class: override :meth:`handle`, and optionally the lifecycle hooks."""

    #: Capacity of the mailbox; senders wait (``send``/``ask``) or fail (``tell``) past it.
    mailbox_size = 256

    def __init__(self, name: str | None = None, *, clock: Clock | None = None) -> None:
        self.name = name or f"{type(self).__name__}-{next(_ids)}"
        self.clock: Clock = clock or SystemClock()
        self.log = structlog.get_logger(type(self).__module__).bind(actor=self.name)
        self._ref: ActorRef[M] | None = None
        self._running = False
        self._stopping = False

    # -- to override -------------------------------------------------------------------------

    async def handle(self, message: M) -> Any:
        """Handle one message; the return value answers an ``ask``."""
        raise ActorError(f"actor {self.name}: unexpected message {type(message).__name__}")

    async def on_start(self) -> None:
        """Runs before the actor reports started (acquire resources here)."""

    async def on_stop(self) -> None:
        """Runs when the actor stops, whatever the reason (release resources here). Shielded."""

    async def background(self) -> None:
        """Optional work that runs beside the mailbox loop; raising ends the actor."""

    # -- machinery ---------------------------------------------------------------------------

    @property
    def ref(self) -> ActorRef[M]:
        if self._ref is None:
            raise ActorStoppedError(f"actor {self.name} was never started")
        return self._ref

    @property
    def is_running(self) -> bool:
        return self._running

    def stop_soon(self) -> None:
        """Stop after the current message (from inside the actor, e.g. a handler)."""
        self._stopping = True

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[ActorRef[M]] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Run the actor until it is stopped or fails (start it with ``tg.start``)."""
        send, recv = anyio.create_memory_object_stream[Envelope](self.mailbox_size)
        self._ref = ActorRef(self, send)
        current: Envelope | None = None
        try:
            await self.on_start()
            self._running = True
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.background)
                task_status.started(self._ref)
                async for envelope in _drain(recv):
                    current = envelope
                    if isinstance(envelope.message, Stop):
                        envelope.answer(None)
                        current = None
                        break
                    await self._dispatch(envelope)
                    current = None
                    if self._stopping:
                        break
                tg.cancel_scope.cancel()
        finally:
            self._running = False
            send.close()
            stopped = ActorStoppedError(f"actor {self.name} has stopped")
            if current is not None:
                current.fail(stopped)
            self._fail_pending(recv, stopped)
            with anyio.CancelScope(shield=True):
                await self.on_stop()

    async def _dispatch(self, envelope: Envelope) -> None:
        try:
            result = await self.handle(envelope.message)  # type: ignore[arg-type]
        except Exception as exc:
            if envelope.reply is None:
                raise
            envelope.fail(exc)
        else:
            envelope.answer(result)

    @staticmethod
    def _fail_pending(recv: MemoryObjectReceiveStream[Envelope], exc: BaseException) -> None:
        while True:
            try:
                envelope = recv.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                break
            envelope.fail(exc)
        recv.close()

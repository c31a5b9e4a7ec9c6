"""The Supervisor: starts children in order, restarts them by strategy, escalates past intensity.

OTP's supervision mechanism (``sup_princ``) on anyio. A :class:`Supervisor` owns a list of
:class:`ChildSpec`; :meth:`Supervisor.run` starts the children in order (each with
``await tg.start``, so each is ready before the next starts) and then supervises them:

* when a child's ``run()`` exits, its restart type decides whether it comes back: ``permanent``
  always, ``transient`` only after an abnormal exit (an exception), ``temporary`` never;
* the strategy decides what comes back with it: ``one_for_one`` just the child, ``rest_for_one``
  the child and the ones started after it, ``one_for_all`` every child. Siblings are stopped in
  reverse order first, then everything is started again in order. Temporary siblings stay stopped;
* more than ``intensity`` restarts within ``period`` seconds (on the injected clock) and the
  supervisor gives up: it stops every child in reverse order and :meth:`Supervisor.run` raises
  :class:`SupervisorEscalationError`, chained to the last child failure, to *its* supervisor;
* a child is never restarted in a tight loop: its restarts back off (:class:`Backoff`), and
  :meth:`Supervisor.forgive` tells the supervisor that the subtree made progress.

How a restart happens (the strategy's group, the backoff, the intensity) is
:class:`~actors.restarts.Restarts`, the supervisor's base; here are the tree's life, its public
calls, the supervising loop, and starting and stopping one child.

Stopping a child is graceful first: an actor is asked :class:`~actors.actor.Stop`, a nested
supervisor is told to :meth:`Supervisor.stop`; past the spec's ``shutdown`` seconds its task is
cancelled. Every structural change (exits, restarts, the public calls) is made by the
supervisor's own task, one at a time, so a caller that is cancelled mid-call never leaves a
half-restarted tree behind.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import anyio
import anyio.abc
import structlog
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from actors.actor import Envelope
from actors.child_spec import (
    Backoff,
    Child,
    ChildInfo,
    ChildSpec,
    ChildState,
    EventKind,
    Restart,
    Strategy,
    SupervisorEvent,
)
from actors.clock import Clock, SystemClock
from actors.incarnation import Incarnation
from actors.restarts import GiveUp, Restarts, Slot
from model_runtime.errors import ActorError, ActorStoppedError, SupervisorEscalationError

__all__ = [
    "Backoff",
    "Child",
    "ChildInfo",
    "ChildSpec",
    "ChildState",
    "EventKind",
    "Restart",
    "Strategy",
    "Supervisor",
    "SupervisorEvent",
]

_log = structlog.get_logger(__name__)

_DEFAULT_BACKOFF = Backoff()  # frozen: one shared default is safe


def _drain(recv: MemoryObjectReceiveStream[Envelope]) -> list[Envelope]:
    with recv:
        return [recv.receive_nowait() for _ in range(recv.statistics().current_buffer_used)]


# -- internals --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Exited:
    slot: Slot
    run: Incarnation
    reason: BaseException | None


@dataclass(frozen=True, slots=True)
class _Op:
    kind: Literal["restart", "terminate", "start", "delete"]
    child_id: str
    spec: ChildSpec | None = None


class Supervisor(Restarts):
    """Supervises children by strategy; itself a valid child (its ref is the supervisor).

    Restarts count toward the intensity until the subtree shows progress: more than
    ``intensity`` restarts within ``period`` seconds with no :meth:`forgive` between them and the
    supervisor gives up. So the intensity bounds restarts *without progress*, not restarts over
    time: a subtree whose owner reports progress (a batch computed, a request answered) survives
    any number of crashes, each one after another stretch of useful work.

    Restarts of one child back off by ``backoff`` (``None``: never wait). While it waits, the
    supervisor does nothing else, as OTP's supervisor is busy while it restarts: exits of other
    children and public calls wait in its mailbox; :meth:`stop` cuts the wait short.
    """

    def __init__(
        self,
        name: str,
        children: Sequence[ChildSpec],
        strategy: Strategy = Strategy.ONE_FOR_ONE,
        intensity: int = 3,
        period: float = 5.0,
        clock: Clock | None = None,
        on_event: Callable[[SupervisorEvent], None] | None = None,
        backoff: Backoff | None = _DEFAULT_BACKOFF,
    ) -> None:
        """Describe the tree; nothing starts until :meth:`run`.

        Raises:
            ValueError: two children share an id, or intensity/period is negative.
        """
        if intensity < 0 or period < 0:
            raise ValueError("intensity and period must not be negative")
        self.name = name
        self.strategy = strategy
        self.intensity = intensity
        self.period = period
        self.backoff = backoff
        self._clock: Clock = clock or SystemClock()
        self._on_event = on_event
        self._slots: list[Slot] = []
        for spec in children:
            self._check_new_id(spec.id)
            self._slots.append(Slot(spec))
        self._restart_times: deque[float] = deque()
        self._tg: anyio.abc.TaskGroup | None = None
        self._send: MemoryObjectSendStream[Envelope] | None = None
        self._stopping = False
        self._pause: anyio.CancelScope | None = None  # the backoff wait now under way
        self._ran = False
        self._blame = ""
        self._finished = anyio.Event()

    # -- public API ---------------------------------------------------------------------------

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[Supervisor] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Start the children in order, report started (with ``self``), supervise until stopped.

        Returns normally after :meth:`stop`; every child has stopped by then.

        Raises:
            SupervisorEscalationError: a child failed to start, or restarts passed the
                intensity; every child was stopped first. ``__cause__`` is the last failure.
            ActorError: this supervisor was run before (a supervisor runs once; the spec's
                factory makes a fresh one for each restart).
        """
        if self._ran:
            raise ActorError(f"supervisor {self.name} has already run")
        self._ran = True
        send, recv = anyio.create_memory_object_stream[Envelope](math.inf)
        self._send = send
        escalation: SupervisorEscalationError | None = None
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                try:
                    for slot in list(self._slots):
                        if not self._stopping:
                            await self._start(slot, "child_started")
                except Exception as exc:
                    escalation = self._escalate(slot.spec.id, exc, "failed to start")
                else:
                    task_status.started(self)
                    escalation = await self._supervise(recv)
                await self._stop_all()
                tg.cancel_scope.cancel()
        finally:
            self._stopping = True
            for slot in self._slots:  # also after a cancellation, which skips _stop_all
                slot.run, slot.state = None, "stopped"
            send.close()
            for envelope in _drain(recv):
                envelope.fail(ActorStoppedError(f"supervisor {self.name} has stopped"))
            self._finished.set()
        if escalation is not None:
            self._emit("supervisor_escalated", self._blame, escalation.__cause__, level="error")
            raise escalation

    async def stop(self) -> None:
        """Stop every child in reverse order, each within its shutdown time; then run() returns.

        Idempotent: later calls (and calls after run() ended) wait for the same stop.

        Raises:
            nothing: cancelling the caller only stops the waiting; the stop goes on.
        """
        if not self._ran:
            self._stopping = True
            self._finished.set()
        if not self._stopping:
            self._stopping = True
            if self._send is not None:
                self._send.send_nowait(Envelope(None))  # wakes the supervising loop
            if self._pause is not None:
                self._pause.cancel()  # ... which may be waiting out a restart's backoff
        await self._finished.wait()

    def ref(self, child_id: str) -> Any:
        """The current ref of a running child (an ActorRef, or a nested Supervisor).

        Raises:
            KeyError: no child has that id.
            ActorStoppedError: the child is not running (stopped, or being restarted).
        """
        slot = self._slot(child_id)
        if slot.state != "running" or slot.run is None or slot.run.done.is_set():
            raise ActorStoppedError(f"child {child_id} of {self.name} is {slot.state}")
        return slot.run.ref

    def children(self) -> list[ChildInfo]:
        """Every child in start order: id, state and how many times it was restarted."""
        return [ChildInfo(s.spec.id, s.state, s.restarts) for s in self._slots]

    async def restart_child(self, child_id: str) -> None:
        """Restart a child on purpose, by the strategy (it counts toward the intensity).

        It backs off like a crash when the child has not run ``backoff.reset_after`` seconds.
        A stopped (terminated) child is started again the same way, at once.

        Raises:
            KeyError: no child has that id.
            ActorStoppedError: the supervisor is not running, or was stopped before the restart.
            SupervisorEscalationError: this restart passed the intensity; the supervisor gave up.
        """
        await self._call(_Op("restart", child_id))

    async def terminate_child(self, child_id: str) -> None:
        """Stop a child (gracefully, within its shutdown) and keep its spec; it is not restarted.

        Raises:
            KeyError: no child has that id.
            ActorStoppedError: the supervisor is not running.
        """
        await self._call(_Op("terminate", child_id))

    async def start_child(self, spec: ChildSpec) -> Any:
        """Add a child after the others and start it; returns its ref.

        Raises:
            ValueError: a child with that id exists.
            ActorStoppedError: the supervisor is not running.
            Exception: whatever the child raised while starting (it is not added).
        """
        return await self._call(_Op("start", spec.id, spec))

    async def delete_child(self, child_id: str) -> None:
        """Stop a child if it runs (gracefully, within its shutdown) and forget its spec.

        Raises:
            KeyError: no child has that id.
            ActorStoppedError: the supervisor is not running.
        """
        await self._call(_Op("delete", child_id))

    def __repr__(self) -> str:
        return f"Supervisor({self.name})"

    # -- supervising loop (the only place where the tree changes) -----------------------------

    async def _call(self, op: _Op) -> Any:
        if self._send is None or self._stopping:
            raise ActorStoppedError(f"supervisor {self.name} is not running")
        reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._send.send_nowait(Envelope(op, reply))
        return await reply

    async def _supervise(
        self, recv: MemoryObjectReceiveStream[Envelope]
    ) -> SupervisorEscalationError | None:
        if self._stopping:
            return None
        async for envelope in recv:
            if self._stopping:
                envelope.fail(ActorStoppedError(f"supervisor {self.name} is stopping"))
                return None
            try:
                match envelope.message:
                    case _Exited(slot, run, reason):
                        await self._on_exit(slot, run, reason)
                    case _Op() as op:
                        envelope.answer(await self._apply(op))
            except GiveUp as give_up:
                escalation = self._escalate(
                    give_up.child_id,
                    give_up.cause,
                    f"passed the intensity ({self.intensity} restarts in {self.period} s)",
                )
                error = SupervisorEscalationError(str(escalation))
                error.__cause__ = escalation.__cause__
                envelope.fail(error)  # the caller of restart_child gets its own copy
                return escalation
            except Exception as exc:
                if envelope.reply is None:
                    raise  # a bug in the supervisor itself: let run() fail loudly
                envelope.fail(exc)
        return None

    async def _on_exit(self, slot: Slot, run: Incarnation, reason: BaseException | None) -> None:
        if slot.run is not run:
            return  # an incarnation we already replaced or stopped
        slot.run = None
        spec = slot.spec
        self._emit("child_exited", spec.id, reason, abnormal=reason is not None)
        if spec.restart is Restart.PERMANENT or (
            spec.restart is Restart.TRANSIENT and reason is not None
        ):
            await self._restart(slot, reason, ran=run.ended - run.began)
        else:
            slot.state = "stopped"

    async def _apply(self, op: _Op) -> Any:
        if op.kind == "start":
            assert op.spec is not None
            self._check_new_id(op.child_id)
            slot = Slot(op.spec)
            await self._start(slot, "child_started")  # added only once it started
            self._slots.append(slot)
            return self.ref(op.child_id)
        slot = self._slot(op.child_id)
        if op.kind == "restart":
            run = slot.run  # a terminated child has none: it is not crashing, restart at once
            ran = math.inf if run is None else self._clock.monotonic() - run.began
            await self._restart(slot, None, ran=ran)
            if self._stopping:  # stop() came first: the caller learns it was not restarted
                raise ActorStoppedError(f"supervisor {self.name} stopped before the restart")
        else:
            await self._stop_child(slot)
            slot.state = "stopped"
            if op.kind == "delete":
                self._slots.remove(slot)
        return None

    # -- starting and stopping one child ------------------------------------------------------

    async def _start(self, slot: Slot, kind: EventKind) -> None:
        assert self._tg is not None
        run = Incarnation(slot.spec.start())
        await self._tg.start(
            run.host, self._clock, self._on_exited(slot, run), self._child_log(slot)
        )
        run.began = self._clock.monotonic()
        slot.run = run
        slot.state = "running"
        if kind == "child_restarted":
            slot.restarts += 1
        self._emit(kind, slot.spec.id, None, restarts=slot.restarts)

    def _on_exited(self, slot: Slot, run: Incarnation) -> Callable[[BaseException | None], None]:
        def exited(reason: BaseException | None) -> None:
            if self._send is not None and not self._stopping:
                self._send.send_nowait(Envelope(_Exited(slot, run, reason)))

        return exited

    async def _stop_child(self, slot: Slot) -> None:
        """Stop the slot's child: gracefully within its shutdown time, else cancel it."""
        run, slot.run = slot.run, None
        if run is None:
            return
        await run.stop(self._clock, slot.spec.shutdown, self._child_log(slot))
        self._emit("child_stopped", slot.spec.id, None)

    async def _stop_all(self) -> None:
        self._stopping = True
        for slot in reversed(self._slots):
            await self._stop_child(slot)
            slot.state = "stopped"

    # -- small helpers ------------------------------------------------------------------------

    def _child_log(self, slot: Slot) -> Any:
        return _log.bind(supervisor=self.name, child=slot.spec.id)

    def _check_new_id(self, child_id: str) -> None:
        if any(s.spec.id == child_id for s in self._slots):
            raise ValueError(f"supervisor {self.name} already has a child {child_id!r}")

    def _emit(
        self, kind: EventKind, child_id: str, reason: BaseException | None, **fields: Any
    ) -> None:
        level = fields.pop("level", "warning" if reason is not None else "info")
        getattr(_log, level)(
            kind,
            supervisor=self.name,
            child=child_id,
            reason=repr(reason) if reason else None,
            **fields,
        )
        if self._on_event is not None:
            try:
                self._on_event(SupervisorEvent(kind, child_id, reason))
            except Exception:
                _log.exception("on_event_failed", supervisor=self.name, child=child_id)

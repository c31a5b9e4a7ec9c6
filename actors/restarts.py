"""How a supervisor restarts a child: the group its strategy takes down with it, the backoff
before the start, and the intensity past which it gives up.

:class:`Restarts` is the restart half of :class:`~actors.supervision.Supervisor` (which adds
the tree's life, its public calls and the supervising loop, and starts and stops one child).
A restart stops the group in reverse order, waits out the child's :class:`Backoff`, and starts
the group again in order, a failed start counting as one more crash. Restarts count toward the
intensity until :meth:`Restarts.forgive`: more than ``intensity`` within ``period`` seconds and
:class:`GiveUp` is raised, which the supervising loop turns into an escalation.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass

import anyio
import structlog

from actors.child_spec import Backoff, ChildSpec, ChildState, EventKind, Restart, Strategy
from actors.clock import Clock
from actors.incarnation import Incarnation
from model_runtime.errors import SupervisorEscalationError

__all__ = ["GiveUp", "Restarts", "Slot"]

_log = structlog.get_logger("actors.supervision")


@dataclass(eq=False, slots=True)
class Slot:
    """One child of a supervisor: its spec and its current incarnation."""

    spec: ChildSpec
    run: Incarnation | None = None
    state: ChildState = "stopped"
    restarts: int = 0
    delay: float = 0.0  #: the backoff before its next consecutive restart (0: at once)


class GiveUp(Exception):
    """Restarts passed the intensity (raised to the supervising loop; never leaves the
    supervisor)."""

    def __init__(self, child_id: str, cause: BaseException | None) -> None:
        self.child_id = child_id
        self.cause = cause


class Restarts(ABC):
    """The restart policy of a supervisor (see the module docstring); the supervisor sets the
    attributes below and provides :meth:`_start` and :meth:`_stop_child`."""

    name: str
    strategy: Strategy
    intensity: int
    period: float
    backoff: Backoff | None
    _clock: Clock
    _slots: list[Slot]
    _restart_times: deque[float]
    _stopping: bool
    _pause: anyio.CancelScope | None  # the backoff wait now under way
    _blame: str

    @abstractmethod
    async def _start(self, slot: Slot, kind: EventKind) -> None:
        """Start ``slot``'s child (the supervisor's own)."""

    @abstractmethod
    async def _stop_child(self, slot: Slot) -> None:
        """Stop ``slot``'s child (the supervisor's own)."""

    def forgive(self, child_id: str | None = None) -> None:
        """The owner reports that the subtree made progress: the restarts so far are forgiven.

        Clears every restart counted toward the intensity (OTP's intensity is per supervisor,
        not per child) and the backoff of ``child_id`` (of every child when ``None``), so its
        next restart happens at once. A backoff wait already under way runs to its end.

        Raises:
            KeyError: no child has that id.
        """
        slots = self._slots if child_id is None else [self._slot(child_id)]
        self._restart_times.clear()
        for slot in slots:
            slot.delay = 0.0

    def _slot(self, child_id: str) -> Slot:
        for slot in self._slots:
            if slot.spec.id == child_id:
                return slot
        raise KeyError(f"supervisor {self.name} has no child {child_id!r}")

    async def _restart(self, slot: Slot, cause: BaseException | None, ran: float) -> None:
        """Restart ``slot`` and, by the strategy, its siblings: stop in reverse, start in order.

        ``ran`` is how long the slot's last incarnation ran; between the stop and the start the
        restart waits out the slot's backoff.

        Raises:
            GiveUp: this restart, or a failed start, passed the intensity.
        """
        self._count_restart(slot.spec.id, cause)
        i = self._slots.index(slot)
        if self.strategy is Strategy.REST_FOR_ONE:
            # A sibling started earlier that died too, its exit not handled yet, restarts the
            # group from there: this child would only fail to start against a dead sibling.
            # (Its exit message, handled later, is then stale and ignored.)
            i = next((j for j, s in enumerate(self._slots[:i]) if s.run and s.run.done.is_set()), i)
        group = {
            Strategy.ONE_FOR_ONE: [slot],
            Strategy.REST_FOR_ONE: self._slots[i:],
            Strategy.ONE_FOR_ALL: list(self._slots),
        }[self.strategy]
        temporary = Restart.TEMPORARY
        again = [s for s in group if s is slot or (s.run and s.spec.restart is not temporary)]
        for s in reversed(group):
            await self._stop_child(s)
            s.state = "restarting" if s in again else "stopped"
        await self._back_off(slot, ran)
        for s in again:
            while not self._stopping:
                try:
                    await self._start(s, "child_restarted")
                except Exception as exc:  # a failed start is one more crash of that child
                    _log.warning("child_start_failed", supervisor=self.name, child=s.spec.id)
                    self._count_restart(s.spec.id, exc)
                    await anyio.lowlevel.checkpoint()  # let the rest of the tree move on
                    await self._back_off(s, None)
                else:
                    break

    async def _back_off(self, slot: Slot, ran: float | None) -> None:
        """Wait out ``slot``'s backoff before it starts again; ``ran=None``: its start failed.

        The wait runs in a cancel scope that the supervisor's ``stop`` cancels (it sets
        ``_stopping`` first, and everything here runs on one event loop, so a stop either finds
        the scope and cancels it or comes before and is seen by the check below). The caller
        then sees ``_stopping`` and starts nothing. A cancel scope rather than racing the sleep
        against an event keeps the wait a plain ``clock.sleep``, with no extra task.
        """
        backoff = self.backoff
        if backoff is None:
            return
        delay, slot.delay = backoff.step(slot.delay, ran)
        if delay <= 0 or self._stopping:
            return
        _log.info("child_backoff", supervisor=self.name, child=slot.spec.id, delay=delay)
        self._pause = anyio.CancelScope()
        try:
            with self._pause:
                await self._clock.sleep(delay)
        finally:
            self._pause = None

    def _count_restart(self, child_id: str, cause: BaseException | None) -> None:
        now = self._clock.monotonic()
        self._restart_times.append(now)
        while self._restart_times and self._restart_times[0] <= now - self.period:
            self._restart_times.popleft()
        if len(self._restart_times) > self.intensity:
            raise GiveUp(child_id, cause)

    def _escalate(
        self, child_id: str, cause: BaseException | None, why: str
    ) -> SupervisorEscalationError:
        error = SupervisorEscalationError(f"supervisor {self.name}: child {child_id} {why}")
        error.__cause__ = cause
        self._blame = child_id
        return error

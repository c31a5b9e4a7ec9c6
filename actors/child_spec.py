"""What a supervisor is told and tells: child specs, restart types, strategies, backoff, events.

The vocabulary of :mod:`actors.supervision` (OTP's child specification), apart from the
supervisor that acts on it, so that a module that only describes children (the replicas, the
python backend's pool) does not depend on the supervisor's machinery.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Protocol

import anyio.abc

__all__ = [
    "Backoff",
    "Child",
    "ChildInfo",
    "ChildSpec",
    "ChildState",
    "EventKind",
    "Restart",
    "Strategy",
    "SupervisorEvent",
]

ChildState = Literal["running", "restarting", "stopped"]
EventKind = Literal[
    "child_started", "child_exited", "child_restarted", "child_stopped", "supervisor_escalated"
]


class Restart(enum.Enum):
    """When a child that exited is started again (OTP restart types)."""

    PERMANENT = "permanent"  #: always
    TRANSIENT = "transient"  #: only after an abnormal exit (an exception)
    TEMPORARY = "temporary"  #: never


class Strategy(enum.Enum):
    """Which children are restarted with the one that exited (OTP restart strategies)."""

    ONE_FOR_ONE = "one_for_one"  #: just that child
    REST_FOR_ONE = "rest_for_one"  #: that child and the children started after it
    ONE_FOR_ALL = "one_for_all"  #: every child


class Child(Protocol):
    """Something a supervisor can run: an :class:`~actors.actor.Actor` or a :class:`Supervisor`.

    ``run`` must report its ref with ``task_status.started(ref)`` once it is ready. To stop it,
    the supervisor awaits its ``stop()`` if it has one, else asks ``Stop()`` of the reported ref
    if that is an :class:`~actors.actor.ActorRef`; past the shutdown time the task is cancelled.
    """

    async def run(self, *, task_status: anyio.abc.TaskStatus[Any]) -> None: ...


@dataclass(frozen=True, slots=True)
class ChildSpec:
    """How to start one child: ``start`` returns a fresh child for every (re)start."""

    id: str
    start: Callable[[], Child]
    restart: Restart = Restart.PERMANENT
    shutdown: float = 5.0  #: seconds to stop gracefully before the child is cancelled


@dataclass(frozen=True, slots=True)
class Backoff:
    """How long a supervisor waits before restarting a child that keeps failing (per child).

    A child's first restart after a stable run (its last incarnation ran at least
    ``reset_after`` seconds, or it was never restarted) happens at once; each further
    consecutive restart waits ``initial``, ``initial * factor``, ... seconds, at most ``cap``.
    A start that fails counts as one more consecutive restart.

    Raises:
        ValueError: a negative duration, or ``factor`` below 1.
    """

    initial: float = 0.01
    factor: float = 2.0
    cap: float = 10.0
    reset_after: float = 1.0

    def __post_init__(self) -> None:
        if min(self.initial, self.cap, self.reset_after) < 0 or self.factor < 1:
            raise ValueError(f"invalid {self}: durations must be >= 0 and factor >= 1")

    def step(self, delay: float, ran: float | None) -> tuple[float, float]:
        """``(wait now, the next delay)`` for a child whose backoff stands at ``delay``.

        ``ran`` is how long its last incarnation ran (``None``: its start failed); a run of at
        least ``reset_after`` makes this restart a first one again, at once.
        """
        if ran is not None and ran >= self.reset_after:
            delay = 0.0
        return delay, min(self.cap, self.initial if delay == 0 else delay * self.factor)


@dataclass(frozen=True, slots=True)
class SupervisorEvent:
    """What happened to which child (given to ``on_event``); ``reason`` is the exit's exception."""

    kind: EventKind
    child_id: str
    reason: BaseException | None = None


class ChildInfo(NamedTuple):
    """One row of :meth:`Supervisor.children`."""

    id: str
    state: ChildState
    restarts: int

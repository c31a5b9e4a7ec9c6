"""Triton's queue policy (``ModelQueuePolicy``), per priority level of a model's queue.

Each level (an ``execute`` priority) has a policy, its own or the model's default: how long a
request may wait (the level's ``default_timeout``; a request's own timeout counts only where
``allow_timeout_override`` says so, and only when shorter), what happens past it (REJECT: the
request fails with Triton's "Request timeout expired"; DELAY: it waits on behind the requests
of its level that are still within their time, ahead of the lower levels), and how many
requests the level may hold waiting (``max_queue_size``, counted per level, delayed ones
included). The runner asks :meth:`QueuePolicy.admit` before it queues a request, and
:func:`reject` or :func:`delay` when its time in the queue has passed (Triton's timeout bounds
the wait in the queue, not the run).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from model_runtime.errors import LevelQueueFullError, RequestTimeoutError

__all__ = [
    "DELAYED",
    "STEP",
    "LevelPolicy",
    "PendingQueue",
    "QueuePolicy",
    "delay",
    "queue_priority",
    "reject",
]

#: A request's place in the queue of a runner with a policy is its priority times this, and a
#: delayed request's is one less: behind every request of its level (later ones too), ahead of
#: the next level down, in integers (exact, however large the levels).
STEP = 2
DELAYED = 1


def queue_priority(priority: int) -> int:
    """Where a request of ``priority`` waits in a runner's queue with a policy."""
    return priority * STEP


@dataclass(frozen=True, slots=True)
class LevelPolicy:
    """One level's policy. ``default_timeout`` in seconds (None: none); ``max_queue_size``
    None: no bound."""

    delay: bool = False
    default_timeout: float | None = None
    allow_timeout_override: bool = False
    max_queue_size: int | None = None

    def timeout(self, requested: float | None) -> float | None:
        """How long a request that asked for ``requested`` seconds (None or 0: nothing) may
        wait: Triton's rule, the default unless overriding is allowed and the request's own is
        shorter (with no default, a request's own does not count either)."""
        timeout = self.default_timeout
        if self.allow_timeout_override and requested and timeout and requested < timeout:
            return requested
        return timeout


class PendingQueue(Protocol):
    """What :func:`delay` and :meth:`QueuePolicy.admit` need of a replica's queue."""

    def waiting_at(self, low: int, high: int) -> int: ...

    def demote(self, request: Any, by: int) -> None: ...

    def expire(self, request: Any, error: BaseException) -> None: ...


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """The model's default policy and its levels' own (keyed by ``execute`` priority)."""

    default: LevelPolicy = LevelPolicy()
    levels: Mapping[int, LevelPolicy] = field(default_factory=dict)

    def of(self, priority: int) -> LevelPolicy:
        """The policy of the level ``priority``."""
        return self.levels.get(priority, self.default)

    @property
    def bounded(self) -> bool:
        """Whether some level bounds its queue."""
        return self.default.max_queue_size is not None or any(
            p.max_queue_size is not None for p in self.levels.values()
        )

    def admit(self, priority: int, queues: Iterable[PendingQueue], model: str) -> None:
        """Refuse a request at ``priority`` whose level already holds its ``max_queue_size``
        waiting requests (over ``queues``, every replica's).

        Raises:
            LevelQueueFullError: in Triton's words first.
        """
        limit = self.of(priority).max_queue_size
        at = queue_priority(priority)
        if limit is not None and sum(q.waiting_at(at - DELAYED, at) for q in queues) >= limit:
            raise LevelQueueFullError(
                f"Exceeds maximum queue size: model {model!r} has {limit} requests waiting at "
                f"this priority level (max_queue_size {limit}); retry later"
            )


def delay(queue: PendingQueue, request: Any, timeout: float) -> None:
    """A DELAY request waited ``timeout`` seconds: it waits on behind its level's requests (a
    request already packed or answered is left as it is)."""
    queue.demote(request, DELAYED)


def reject(queue: PendingQueue, request: Any, timeout: float) -> None:
    """A REJECT request waited ``timeout`` seconds: one still waiting fails with Triton's
    words (one already packed runs on, as Triton's timeout bounds the queue only)."""
    queue.expire(
        request,
        RequestTimeoutError(
            f"Request timeout expired: the request waited {timeout} s in the queue"
        ),
    )

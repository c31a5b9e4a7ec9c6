"""Messages of the Queue actor (frozen dataclasses, handled with ``match``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from actors.actor import Stop
from actors.queues.batch import Batch
from actors.queues.request import Request

__all__ = [
    "Complete",
    "Drain",
    "Enqueue",
    "Fail",
    "FailAll",
    "Flush",
    "GetStats",
    "QueueMessage",
    "Settle",
]


@dataclass(frozen=True, slots=True)
class Enqueue:
    """(tell) Queue a validated request; its rows are packed as soon as a buffer is free."""

    request: Request


@dataclass(frozen=True, slots=True)
class Complete:
    """(tell) ``batch`` ran: ``outputs[i]`` maps each output anchor to iteration i's B rows.

    The arrays are owned by the queue from now on (callers get views into them).
    ``t_start``/``t_end`` are clock times around the main run.
    """

    batch: Batch
    outputs: Sequence[Mapping[str, np.ndarray]]
    t_start: float
    t_end: float


@dataclass(frozen=True, slots=True)
class Fail:
    """(tell) ``batch`` failed for good: every request with rows in it gets ``error`` once.

    ``elsewhere``: failed for good *on this replica* (a device fault that retries did not
    cure): its requests are handed to the queue's ``handoff`` to try another replica, and get
    ``error`` only where there is none.
    """

    batch: Batch
    error: BaseException
    elsewhere: bool = False


@dataclass(frozen=True, slots=True)
class Settle:
    """(tell) ``batch`` was bisected after a data error (a poisoned request).

    Each of ``parts`` is a part of ``batch`` (the same batch with only some of its segments)
    and the outputs of the run that computed exactly those rows; each request of ``rejected``
    gets its error (an ``InputValidationError``). Every request of ``batch`` is in exactly one
    part or in ``rejected``. ``t_start``/``t_end`` span the runs of the bisection.
    """

    batch: Batch
    parts: Sequence[tuple[Batch, Sequence[Mapping[str, np.ndarray]]]]
    rejected: Sequence[tuple[Request, BaseException]]
    t_start: float
    t_end: float


@dataclass(frozen=True, slots=True)
class Flush:
    """(tell) Flush the partially filled batch now (padded), as a timeout would."""


@dataclass(frozen=True, slots=True)
class Drain:
    """(ask) Refuse new requests and flush what is pending; answers when nothing is unpacked."""


@dataclass(frozen=True, slots=True)
class FailAll:
    """(ask) Fail every request not answered yet, packed or not, with ``error``."""

    error: BaseException


@dataclass(frozen=True, slots=True)
class GetStats:
    """(ask) A :class:`~actors.queues.stats.QueueStats` snapshot."""


#: What a Queue's ref accepts (``Stop`` is the actor core's).
QueueMessage = Enqueue | Complete | Settle | Fail | Flush | Drain | FailAll | GetStats | Stop

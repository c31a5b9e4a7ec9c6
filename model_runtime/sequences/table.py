"""The live sequences of one model and their states: admission in arrival order, slots, idle
release (see :mod:`model_runtime.sequences`)."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from actors.clock import Clock, SystemClock, move_on_after
from model_runtime.errors import ConfigurationError, ExecutionTimeoutError, InputValidationError
from model_runtime.sequences.config import SequenceConfig, SequenceStep

__all__ = ["SequenceCounts", "SequenceTable"]

log = logging.getLogger("model_runtime.sequences")

#: How many released sequence ids are remembered, to say why their next request is refused.
_REMEMBERED = 4096


@dataclass(slots=True, eq=False)
class _Live:
    id: int | str
    state: dict[str, np.ndarray]
    last: float
    #: Done when this sequence's latest step is: the next one waits for it.
    tail: asyncio.Future[None] | None = None
    busy: int = 0  # steps admitted and not finished
    #: Why it takes no more steps (ended, released, got no slot); None: it does.
    closed: str | None = None
    #: The runner's replica faults counted when its latest step succeeded (None: no step
    #: yet); more at its next step means its state outlived a fault.
    faults_seen: int | None = None


@dataclass(slots=True)
class SequenceCounts:
    """What a table has counted (for ``/metrics``)."""

    started: int = 0
    ended: int = 0
    released_idle: int = 0
    restarted: int = 0
    steps: int = 0
    failed_steps: int = 0
    #: Steps of sequences that outlived a fault on any of the runner's replicas (a reset, a
    #: restart, a replica leaving service) since their previous step: each went on from the
    #: state kept on the host, whichever replica its steps ran on.
    restored: int = 0


class SequenceTable:
    """The live sequences of one model and their states (the module docstring)."""

    def __init__(self, config: SequenceConfig, clock: Clock | None = None) -> None:
        if config.slots < 1:
            raise ConfigurationError(
                f"sequence batching needs at least one slot, got {config.slots}"
            )
        self.config = config
        self.clock = clock or SystemClock()
        #: Live sequences, least recently active first.
        self._live: OrderedDict[int | str, _Live] = OrderedDict()
        #: Recently released ids -> why (bounded).
        self._released: OrderedDict[int | str, str] = OrderedDict()
        self._slot_freed = asyncio.Event()
        #: STARTs waiting for a slot, by id: steps sent after them queue behind them.
        self._pending: dict[int | str, _Live] = {}
        #: New sequences waiting for a slot now (Triton's backlog).
        self.waiting = 0
        self._next_reap = 0.0
        self.counts = SequenceCounts()

    @property
    def live(self) -> int:
        """Sequences live now (each holds a slot)."""
        return len(self._live)

    # -- admission -----------------------------------------------------------------------------

    async def admit(
        self, step: SequenceStep, model: str, deadline: float | None
    ) -> tuple[_Live, asyncio.Future[None] | None, asyncio.Future[None]]:
        """The sequence ``step`` belongs to (a new one for a ``start``, once it has a slot, by
        ``deadline`` on :attr:`clock`; None: no limit), the sequence's previous step to wait
        for (None: none) and this step's own ``done`` (set it when the step ends: the next
        waits for it). The step is in line from the moment it arrives: steps sent after a START
        that waits for a slot queue behind it.

        Raises:
            InputValidationError: not a sequence id, not started, or a START while another
                START of the same id waits for a slot (Triton's texts where it has them).
            ExecutionTimeoutError: no slot freed by ``deadline``.
        """
        if step.id in (0, "") or isinstance(step.id, bool):
            raise InputValidationError(
                f"inference request to model '{model}' must specify a non-zero or non-empty "
                "correlation ID"
            )
        now = self.clock.monotonic()
        self._reap(now)
        sid = step.id
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if not step.start:
            live = self._live.get(sid) or self._pending.get(sid)
            if live is None:
                why = self._released.get(sid)
                raise InputValidationError(
                    f"inference request for sequence {sid} to model '{model}' must specify the "
                    "START flag on the first request of the sequence"
                    + (f" (the sequence {why})" if why else "")
                )
            previous, live.tail = live.tail, done
            live.busy += 1
            return live, previous, done
        if sid in self._pending:
            raise InputValidationError(
                f"sequence {sid} of model '{model}': a START is already waiting for a slot"
            )
        new = _Live(sid, {s.input: s.start_value() for s in self.config.states}, now, done)
        new.busy = 1
        previous = None
        old = self._live.pop(sid, None)
        if old is not None:
            # Triton's rule: the previous sequence did not end; its steps already sent still
            # run on its state, then the new one starts (after them), in the slot it had.
            log.warning(
                "sequence %s for model %r has a conflict: the previous sequence did not end "
                "before this sequence start; it is ended early",
                sid,
                model,
            )
            self.counts.restarted += 1
            previous = old.tail
        elif len(self._live) >= self.config.slots or self.waiting:
            self._pending[sid] = new
            try:
                await self._wait_for_slot(sid, deadline)
            except BaseException:
                new.closed = "got no slot before its START's timeout"
                new.busy -= 1
                _settle(done)  # the steps queued behind it go on, and find it closed
                raise
            finally:
                if self._pending.get(sid) is new:
                    del self._pending[sid]
        self._live[sid] = new
        self._released.pop(sid, None)
        self.counts.started += 1
        return new, previous, done

    async def _wait_for_slot(self, sequence_id: int | str, deadline: float | None) -> None:
        """Until a slot is free (first come, first served), or ``deadline``."""
        self.waiting += 1
        try:
            while len(self._live) >= self.config.slots:
                self._slot_freed.clear()
                wait = self._next_expiry()
                if deadline is not None:
                    left = deadline - self.clock.monotonic()
                    if left <= 0:
                        raise ExecutionTimeoutError(
                            f"sequence {sequence_id}: all {self.config.slots} sequence slots "
                            "stayed in use until the request's timeout"
                        )
                    wait = left if wait is None else min(wait, left)
                async with move_on_after(self.clock, wait):  # on the table's clock
                    await self._slot_freed.wait()
                self._next_reap = 0.0  # a waiter looks now
                self._reap(self.clock.monotonic())
        finally:
            self.waiting -= 1

    def touch(self, live: _Live) -> None:
        """A step of ``live`` finished: it is the most recently active sequence, and when it
        has no step in flight any more, waiters for a slot look at the idle ones again."""
        live.last = self.clock.monotonic()
        if self._live.get(live.id) is live:
            self._live.move_to_end(live.id)
        if live.busy == 0:
            self._slot_freed.set()

    def _next_expiry(self) -> float | None:
        """Seconds until the least recently active idle sequence may be released."""
        for live in self._live.values():
            if live.busy == 0:
                return max(0.0, live.last + self.config.max_idle - self.clock.monotonic())
        return None

    def _reap(self, now: float) -> None:
        """Release the sequences idle longer than ``max_idle`` (none with a step in flight).
        Live sequences are ordered by activity, so this stops at the first young one; and it
        looks at most ten times per ``max_idle``."""
        if now < self._next_reap:
            return
        self._next_reap = now + self.config.max_idle / 10
        limit = now - self.config.max_idle
        expired = []
        for live in self._live.values():
            if live.last > limit:
                break
            if live.busy == 0:
                expired.append(live)
        for live in expired:
            self.counts.released_idle += 1
            self._drop(
                live,
                f"was released after {self.config.max_idle:g} s without a request "
                "(max_sequence_idle_microseconds)",
            )

    def _drop(self, live: _Live, why: str) -> None:
        live.closed = why
        if self._live.get(live.id) is not live:
            return  # ended early by a new START: the id belongs to that one now
        del self._live[live.id]
        self._released[live.id] = why
        while len(self._released) > _REMEMBERED:
            self._released.popitem(last=False)
        self._slot_freed.set()

    def end(self, live: _Live) -> None:
        """``live`` ended (its END step succeeded)."""
        self.counts.ended += 1
        self._drop(live, "ended (its last request set the END flag)")


def _settle(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)

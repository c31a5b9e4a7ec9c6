"""Stateful models: Triton's sequence batcher, with each sequence's state kept on the host.

A stateful model (an RNN over a session, streaming speech, an online accumulator) keeps state
between the requests of one client: a *sequence*, named by its correlation id (an integer other
than 0, or a non-empty string), opened by a request with ``start`` and closed by one with
``end``. Triton describes such a model in ``config.pbtxt``'s ``sequence_batching``: control
inputs the batcher fills (START, END, READY, CORRID) and implicit ``state`` pairs, an input the
model reads its state from and an output it writes the next state to.

Here the model itself is stateless (an ONNX graph of inputs to outputs): :class:`SequenceRunner`
wraps a runner, and for each step of a sequence feeds the control inputs and the sequence's
current state beside the client's inputs, runs the step like any request (so steps of
different sequences share batches: the runner's dynamic batching puts one row per sequence in
a batch), and keeps the state output as the sequence's state once the step succeeded. The state
lives on the host, in :class:`SequenceTable`, never on a device, so:

* a step is applied exactly once: the state changes only when its step's answer is produced; a
  step that fails (a device fault the runner could not retry away, a timeout) leaves the state
  as it was, and the client may send it again;
* a replica reset, restart or evacuation loses no state: the runner retries or moves the batch
  like any other, and the next step of every sequence reads the state of its last completed
  step, on whichever replica runs it (Triton keeps implicit state on its instance, so a fault
  there loses the sequence);
* a reload keeps live sequences (the repository hands the table to the model's next version
  when its sequence settings are the same).

Triton's rules, as its sequence batcher applies them: a request of a sequence model must name
a sequence (:data:`NO_CORRELATION_ID`); one row per request (:data:`BATCH_ONE`); the first
request of a sequence must set ``start`` (:data:`NOT_STARTED`, which also says when the
sequence was released for idling); a ``start`` for a live sequence ends that one and begins
anew (Triton's "previous sequence will be terminated early", logged); a sequence idle longer
than ``max_idle`` is released; at most ``slots`` sequences are live at once (Triton's direct
strategy: one slot per batch row per instance), and a new one waits for a slot (Triton's
backlog), within the request's timeout. The steps of one sequence run one at a time, in the
order they arrived.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from actors.clock import Clock, SystemClock
from model_runtime.errors import (
    ConfigurationError,
    ExecutionTimeoutError,
    InputValidationError,
)

__all__ = [
    "Control",
    "ControlKind",
    "SequenceConfig",
    "SequenceRunner",
    "SequenceStep",
    "SequenceTable",
    "StatePair",
]

log = logging.getLogger(__name__)

#: How many released sequence ids are remembered, to say why their next request is refused.
_REMEMBERED = 4096


class ControlKind(enum.Enum):
    """What a control input tells the model (Triton's ``CONTROL_SEQUENCE_*``)."""

    START = "START"
    END = "END"
    READY = "READY"
    CORRID = "CORRID"


@dataclass(frozen=True, slots=True)
class Control:
    """A control input the batcher fills: ``name``, of ``dtype``, ``false`` / ``true`` its
    values (CORRID: the sequence's id, ``false`` and ``true`` unused)."""

    kind: ControlKind
    name: str
    dtype: np.dtype[Any]
    false: Any = 0
    true: Any = 1


@dataclass(frozen=True, slots=True)
class StatePair:
    """An implicit state: the model reads it from input ``input`` and writes the next one to
    output ``output``; ``dims`` past the batch axis; ``initial`` its value at START (None:
    zeros)."""

    input: str
    output: str
    dtype: np.dtype[Any]
    dims: tuple[int, ...]
    initial: np.ndarray | None = None

    def start_value(self) -> np.ndarray:
        """The state a new sequence starts from: [1, *dims]."""
        if self.initial is None:
            return np.zeros((1, *self.dims), self.dtype)
        return np.array(self.initial, self.dtype).reshape(1, *self.dims)


@dataclass(frozen=True, slots=True)
class SequenceConfig:
    """A model's sequence batching (see the module docstring). ``max_idle`` in seconds (Triton's
    default ``max_sequence_idle_microseconds`` is 1 s); ``slots``: live sequences at most."""

    controls: tuple[Control, ...] = ()
    states: tuple[StatePair, ...] = ()
    max_idle: float = 1.0
    slots: int = 1
    strategy: str = "direct"

    @property
    def hidden_inputs(self) -> frozenset[str]:
        """Inputs the batcher fills: not the client's."""
        return frozenset({c.name for c in self.controls} | {s.input for s in self.states})

    @property
    def hidden_outputs(self) -> frozenset[str]:
        """Outputs the batcher keeps: not the client's."""
        return frozenset(s.output for s in self.states)


@dataclass(frozen=True, slots=True)
class SequenceStep:
    """One request's place in its sequence: the correlation ``id``, and whether it starts or
    ends the sequence."""

    id: int | str
    start: bool = False
    end: bool = False


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


@dataclass(slots=True)
class SequenceCounts:
    """What a table has counted (for ``/metrics``)."""

    started: int = 0
    ended: int = 0
    released_idle: int = 0
    restarted: int = 0
    steps: int = 0
    failed_steps: int = 0


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
                try:
                    await asyncio.wait_for(self._slot_freed.wait(), wait)
                except TimeoutError:
                    pass
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


class SequenceRunner:
    """A runner of a stateful model: each request is a step of a sequence (module docstring).

    Everything but :meth:`execute` and the input/output lists is the wrapped runner's
    (``current``, as the server's wrappers keep theirs).
    """

    def __init__(
        self, runner: Any, sequences: SequenceConfig | SequenceTable, model: str = ""
    ) -> None:
        """``runner`` (a ``ModelRunner``, started or not) behind the sequence batching
        ``sequences`` (a config, or the table of another runner's live sequences to go on
        with); ``model`` names it in errors."""
        self.current = runner
        self.table = sequences if isinstance(sequences, SequenceTable) else SequenceTable(sequences)
        self.model = model
        #: (name, kind, its [1, 1] false and true values): built once, read-only, shared.
        self._controls = tuple(
            (c.name, c.kind, _constant(c, c.false), _constant(c, c.true))
            for c in self.table.config.controls
        )

    # -- what the wrapped runner is ------------------------------------------------------------

    async def start(self) -> None:
        """Start the wrapped runner, then :meth:`check` the model."""
        await self.current.start()
        self.check()

    async def close(self) -> None:
        await self.current.close()

    async def __aenter__(self) -> SequenceRunner:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def check(self) -> None:
        """Check the config's control and state tensors against the (started) model.

        Raises:
            ConfigurationError: one the model lacks, or of another type or shape.
        """
        config = self.table.config
        inputs = {d.name: d for d in self.current.get_execute_inputs()}
        outputs = {d.name: d for d in self.current.get_execute_outputs()}
        where = f"model {self.model!r}: sequence_batching"
        for c in config.controls:
            d = inputs.get(c.name)
            if d is None:
                raise ConfigurationError(f"{where}: control input {c.name!r} is no model input")
            _same_dtype(where, c.name, d, c.dtype)
        for s in config.states:
            for name, table in ((s.input, inputs), (s.output, outputs)):
                d = table.get(name)
                if d is None:
                    kind = "input" if table is inputs else "output"
                    raise ConfigurationError(f"{where}: state {kind} {name!r} is no model {kind}")
                _same_dtype(where, name, d, s.dtype)
        if not any(i not in config.hidden_inputs for i in inputs):
            raise ConfigurationError(f"{where}: the model has no input left for the client")

    def get_execute_inputs(self) -> list[Any]:
        """The client's inputs: the model's, less those the batcher fills."""
        hidden = self.table.config.hidden_inputs
        return [d for d in self.current.get_execute_inputs() if d.name not in hidden]

    def get_execute_outputs(self) -> list[Any]:
        """The client's outputs: the model's, less the next states."""
        hidden = self.table.config.hidden_outputs
        return [d for d in self.current.get_execute_outputs() if d.name not in hidden]

    def __getattr__(self, name: str) -> Any:  # statistics, replica states, memory, ...
        return getattr(self.current, name)

    # -- a step --------------------------------------------------------------------------------

    async def execute(
        self,
        inputs: Mapping[str, np.ndarray],
        outputs: Mapping[str, np.ndarray] | None = None,
        replica_id: int | None = None,
        timeout: float | None = None,
        priority: int = 0,
        *,
        sequence: SequenceStep | None = None,
    ) -> dict[str, np.ndarray]:
        """Run one step of ``sequence`` (module docstring).

        Raises:
            InputValidationError: no sequence, not started, more than one row, or output
                buffers given.
            TimeoutError: no sequence slot freed within ``timeout``.
            ModelRuntimeError: whatever the runner raises (the state stays as it was).
        """
        table = self.table
        clock = table.clock
        deadline = None if timeout is None else clock.monotonic() + timeout
        if sequence is None:
            sequence = SequenceStep(0)
        if outputs is not None:
            raise InputValidationError("output buffers cannot be given to a sequence model")
        if any(a.ndim == 0 or a.shape[0] != 1 for a in inputs.values()):
            raise InputValidationError(
                f"inference request to model '{self.model}' must specify batch-size 1 due to "
                "requirements of sequence batcher"
            )
        corrid = self._corrid(sequence.id)  # a bad id is refused before it takes a slot
        live, previous, done = await table.admit(sequence, self.model, deadline)
        try:
            if previous is not None and not previous.done():
                await self._after(previous, sequence, deadline)
            if live.closed is not None:  # ended, released, or never started while it waited
                raise InputValidationError(
                    f"inference request for sequence {sequence.id} to model '{self.model}' "
                    f"must specify the START flag on the first request of the sequence (the "
                    f"sequence {live.closed})"
                )
            feed = dict(inputs)
            for name, kind, false, true in self._controls:
                if kind is ControlKind.CORRID:
                    assert corrid is not None
                    feed[name] = corrid
                elif kind is ControlKind.START:
                    feed[name] = true if sequence.start else false
                elif kind is ControlKind.END:
                    feed[name] = true if sequence.end else false
                else:  # READY: a real request is always ready
                    feed[name] = true
            feed.update(live.state)
            table.counts.steps += 1
            left = None if deadline is None else max(deadline - clock.monotonic(), 1e-6)
            try:
                result: dict[str, np.ndarray] = await self.current.execute(
                    feed, None, replica_id, left, priority
                )
            except BaseException:
                table.counts.failed_steps += 1
                raise
            # The step succeeded: its next state is the sequence's (a copy: the answer's
            # arrays may be views of the batch the runner split).
            for s in table.config.states:
                live.state[s.input] = np.array(result.pop(s.output), copy=True)
            if sequence.end:
                table.end(live)
            return result
        finally:
            live.busy -= 1
            table.touch(live)
            if previous is not None and not previous.done():
                # Cancelled or timed out while waiting: the next step still waits for the
                # one before this (else it would run beside it, on the same state).
                previous.add_done_callback(lambda _: _settle(done))
            else:
                done.set_result(None)

    async def _after(
        self, previous: asyncio.Future[None], step: SequenceStep, deadline: float | None
    ) -> None:
        """Wait for the sequence's previous step, within ``deadline``.

        Raises:
            ExecutionTimeoutError: the previous steps took past it.
        """
        left = None if deadline is None else deadline - self.table.clock.monotonic()
        try:
            await asyncio.wait_for(asyncio.shield(previous), left)
        except TimeoutError:
            raise ExecutionTimeoutError(
                f"sequence {step.id}: its earlier steps were still running at the request's timeout"
            ) from None

    def _corrid(self, sequence_id: int | str) -> np.ndarray | None:
        """The [1, 1] CORRID value of a sequence (None: the model takes none).

        Raises:
            InputValidationError: the id does not fit the model's CORRID type.
        """
        for name, kind, false, _ in self._controls:
            if kind is ControlKind.CORRID:
                return _corrid(name, false.dtype, sequence_id)
        return None


def _settle(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)


def _constant(c: Control, value: Any) -> np.ndarray:
    """A read-only [1, 1] array of ``value`` as control ``c`` takes it (CORRID: a zero)."""
    arr = np.full(
        (1, 1), 0 if c.kind is ControlKind.CORRID or c.dtype.kind == "O" else value, c.dtype
    )
    arr.flags.writeable = False
    return arr


def _corrid(name: str, dtype: np.dtype[Any], sequence_id: int | str) -> np.ndarray:
    """The [1, 1] CORRID value of a sequence: its id, as a number or as bytes."""
    if dtype.kind == "O":
        return np.full((1, 1), str(sequence_id).encode(), dtype=dtype)
    try:
        return np.full((1, 1), int(sequence_id), dtype=dtype)
    except (ValueError, OverflowError):
        raise InputValidationError(
            f"sequence id {sequence_id!r} does not fit the model's CORRID control {name!r}, "
            f"which is {dtype.name}"
        ) from None


def _same_dtype(where: str, name: str, desc: Any, dtype: np.dtype[Any]) -> None:
    have = np.dtype(desc.dtype)
    if have != dtype and not (have.kind in "OSU" and dtype.kind in "OSU"):
        raise ConfigurationError(
            f"{where}: {name!r} is {dtype.name} in the config, {have.name} in the model"
        )

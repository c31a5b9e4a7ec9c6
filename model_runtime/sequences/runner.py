"""The runner of a stateful model: each request a step of a sequence (see
:mod:`model_runtime.sequences`)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import numpy as np

from model_runtime.errors import ConfigurationError, ExecutionTimeoutError, InputValidationError
from model_runtime.sequences.config import Control, ControlKind, SequenceConfig, SequenceStep
from model_runtime.sequences.table import SequenceTable, _settle

__all__ = ["SequenceRunner"]


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
            faults = self._faults()
            if live.faults_seen is not None and faults > live.faults_seen:
                table.counts.restored += 1
            live.faults_seen = faults
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

    def _faults(self) -> int:
        """Faults the wrapped runner's replicas have seen so far (0: it reports none)."""
        states = getattr(self.current, "replica_states", None)
        return 0 if states is None else sum(s.faults for s in states())

    def _corrid(self, sequence_id: int | str) -> np.ndarray | None:
        """The [1, 1] CORRID value of a sequence (None: the model takes none).

        Raises:
            InputValidationError: the id does not fit the model's CORRID type.
        """
        for name, kind, false, _ in self._controls:
            if kind is ControlKind.CORRID:
                return _corrid(name, false.dtype, sequence_id)
        return None


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

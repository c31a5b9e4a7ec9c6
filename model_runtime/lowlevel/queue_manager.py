"""The queue manager (seed ``QueueManager``): one queue per user anchor of a session.

Made by :meth:`Session.create_queue_manager`, which binds each queue to its anchor: a run reads
one element from each input queue per device iteration (waiting at most ``timeout`` seconds,
then raising :class:`QueueTimeoutError` and keeping what it read) and writes one element to
each output queue.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from model_runtime.errors import ConfigurationError, InputValidationError
from model_runtime.executable.model import Anchor
from model_runtime.lowlevel.queues import InputQueue, OutputQueue
from model_runtime.lowlevel.ring_size_multiplier_factory import RingSizeMultiplierProd

__all__ = ["DEFAULT_QUEUE_TIMEOUT", "QueueManager"]

#: Seconds a run waits for input data (or output room), and ``enqueue`` for a free buffer.
DEFAULT_QUEUE_TIMEOUT = 5.0


class QueueManager:
    """Input and output queues of one session, by anchor name (see the module docstring).

    ``elements_per_run(anchor)`` is how many elements a run reads or writes for the anchor; a
    queue holds ``multiplier * elements_per_run`` tensors.

    Raises:
        ConfigurationError: (constructor) a multiplier below 1, or a bad ``timeout``.
    """

    def __init__(
        self,
        inputs: Iterable[Anchor],
        outputs: Iterable[Anchor],
        elements_per_run: Mapping[str, int],
        ring_buffer_size_multiplier: int | RingSizeMultiplierProd = 2,
        *,
        timeout: float = DEFAULT_QUEUE_TIMEOUT,
    ) -> None:
        if not (isinstance(timeout, int | float) and math.isfinite(timeout) and timeout > 0):
            raise ConfigurationError(f"QueueManager: timeout {timeout!r} must be a finite s > 0")
        mult = ring_buffer_size_multiplier

        def size(anchor: Anchor) -> int:
            m = mult(anchor) if callable(mult) else mult
            if isinstance(m, bool) or not isinstance(m, int) or m < 1:
                raise ConfigurationError(
                    f"QueueManager: ring size multiplier {m!r} for {anchor.name!r} must be >= 1"
                )
            return m * max(1, elements_per_run.get(anchor.name, 1))

        self.timeout = float(timeout)
        self.inputs: dict[str, InputQueue] = {
            a.name: InputQueue(a, size(a), self.timeout) for a in inputs
        }
        self.outputs: dict[str, OutputQueue] = {
            a.name: OutputQueue(a, size(a), self.timeout) for a in outputs
        }

    def input_queue(self, name: str) -> InputQueue:
        """The input queue of anchor ``name``.

        Raises:
            InputValidationError: no input queue of that name.
        """
        try:
            return self.inputs[name]
        except KeyError:
            raise InputValidationError(
                f"no input queue {name!r}; input queues: {sorted(self.inputs)}"
            ) from None

    def output_queue(self, name: str) -> OutputQueue:
        """The output queue of anchor ``name``.

        Raises:
            InputValidationError: no output queue of that name.
        """
        try:
            return self.outputs[name]
        except KeyError:
            raise InputValidationError(
                f"no output queue {name!r}; output queues: {sorted(self.outputs)}"
            ) from None

    def _all(self) -> list[InputQueue | OutputQueue]:
        return [*self.inputs.values(), *self.outputs.values()]

    def flush_all(self) -> None:
        """:meth:`~InputQueue.flush` every queue."""
        for q in self._all():
            q.flush()

    def disconnect_all(self) -> None:
        """:meth:`~InputQueue.disconnect` every queue."""
        for q in self._all():
            q.disconnect()

    def reset_all(self) -> None:
        """:meth:`~InputQueue.reset` every queue (after a session stop)."""
        for q in self._all():
            q.reset()

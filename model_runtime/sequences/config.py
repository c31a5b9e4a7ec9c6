"""A stateful model's sequence batching, as data: its controls, its states, a request's step
(see :mod:`model_runtime.sequences`)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Control", "ControlKind", "SequenceConfig", "SequenceStep", "StatePair"]


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

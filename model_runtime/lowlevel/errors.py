"""Errors of the low-level API (subclasses of the runtime's hierarchy, see model_runtime.errors).

InputValidationError
└── AnchorsNotConnectedError   anchors a program needs have no callback or queue
ExecutionTimeoutError
└── QueueTimeoutError          a queue had no data (or no room) within its timeout
DeviceStateError
└── QueueDisconnectedError     enqueue on a queue that was disconnected
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from model_runtime.errors import DeviceStateError, ExecutionTimeoutError, InputValidationError

__all__ = ["AnchorsNotConnectedError", "QueueDisconnectedError", "QueueTimeoutError"]


class AnchorsNotConnectedError(InputValidationError):
    """Programs need anchors that have no callback; ``anchors`` maps program id -> names."""

    def __init__(self, anchors: Mapping[int, Sequence[str]]) -> None:
        self.anchors: dict[int, tuple[str, ...]] = {p: tuple(n) for p, n in anchors.items()}
        listing = "; ".join(f"program {p}: {', '.join(n)}" for p, n in self.anchors.items())
        super().__init__(f"anchors not connected to callbacks: {listing}")

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.anchors,))


class QueueTimeoutError(ExecutionTimeoutError):
    """A queue had no data to read (or no room to write) within its timeout."""


class QueueDisconnectedError(DeviceStateError):
    """The queue was disconnected: it takes no more data until :meth:`reset`."""

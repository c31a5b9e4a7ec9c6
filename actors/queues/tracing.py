"""Per-request compute timestamps for request tracing (Triton's trace extension).

A traced request carries a :class:`ComputeStamps` receiver (``Request.trace``). While
:data:`STATE` says tracing is on, the queue hands it each answered batch's times: when its rows
were packed, the run's start and end, and when the outputs reached their callers (clock
seconds). With tracing off the queue checks one flag per batch and the runner one per request.
The receiver is set by whoever submits the request, through :data:`CURRENT` (a context
variable: it crosses the wrappers between the daemon and the runner without their help).
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Protocol

__all__ = ["CURRENT", "STATE", "ComputeStamps", "TracingState"]


class ComputeStamps(Protocol):
    """Receives the times of a batch that answered (part of) a traced request."""

    def computed(self, t_packed: float, t_start: float, t_end: float, t_out: float) -> None:
        """Clock seconds: rows packed, run started, run ended, outputs given back."""
        ...


class TracingState:
    """Whether any request may be traced now (the daemon's tracer sets :attr:`on`)."""

    __slots__ = ("on",)

    def __init__(self) -> None:
        self.on = False


#: The process's switch: off, nothing is looked at.
STATE = TracingState()
#: The receiver of the request being submitted in this context (None: not traced).
CURRENT: ContextVar[ComputeStamps | None] = ContextVar("model_runtime_trace", default=None)

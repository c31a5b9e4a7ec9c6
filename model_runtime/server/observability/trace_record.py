"""One traced request's record (Triton's trace extension): its facts and timestamps, the
setting that sampled it, and where finished traces go.

:class:`RequestTrace` collects the timestamps (steady clock nanoseconds) and, at the
``TENSORS`` level, copies of its tensors; :func:`ordered_stamps` gives them in Triton's order.
:class:`ScopeSetting` is one scope's effective setting (global or a model's) with its sampling
counters. A :class:`TraceSink` (a file, or OpenTelemetry spans) takes finished traces. The
:class:`~.trace.Tracer` makes all of these; the sinks read them.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

__all__ = ["RequestTrace", "ScopeSetting", "SettingValues", "TraceSink", "ordered_stamps"]


class TraceSink(Protocol):
    """Where finished traces go (a file in ``triton`` mode, spans in ``opentelemetry``)."""

    def emit(self, trace: RequestTrace) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class SettingValues:
    level: tuple[str, ...]
    rate: int
    count: int
    log_frequency: int


class ScopeSetting:
    """One scope's effective setting and its counters (made anew by each update)."""

    __slots__ = ("collected", "count", "forceable", "in_file", "sampled", "values")

    def __init__(self, values: SettingValues, forceable: bool = False) -> None:
        self.values = values
        #: a request with a trace context is traced whatever the rate and count say
        #: (Triton's OpenTelemetry mode; rate 0: only those)
        self.forceable = forceable
        self.count = values.count  # what is left (-1: no limit)
        self.sampled = 0  # requests seen
        self.collected = 0
        self.in_file = 0

    @property
    def on(self) -> bool:
        v = self.values
        return bool(v.level) and ((v.rate > 0 and self.count != 0) or self.forceable)

    def sample(self, force: bool = False) -> bool:
        """Whether the next request is traced: every ``rate``-th while ``count`` lasts, and
        (``force``) one that carries a trace context where that is allowed."""
        v = self.values
        if not v.level:
            return False
        force = force and self.forceable
        if v.rate == 0 or self.count == 0:
            return force
        self.sampled += 1
        hit = self.sampled % v.rate == 0
        if hit and self.count > 0:
            self.count -= 1
        return hit or force


class RequestTrace:
    """One traced request's facts and timestamps (ns); see the module docstring."""

    __slots__ = (
        "id",
        "model",
        "request_id",
        "setting",
        "stamps",
        "tensor_records",
        "traceparent",
        "version",
    )

    def __init__(
        self,
        trace_id: int,
        model: str,
        version: str,
        request_id: str,
        setting: ScopeSetting,
        traceparent: str | None,
    ) -> None:
        self.id = trace_id
        self.model = model
        self.version = version
        self.request_id = request_id
        self.setting = setting
        self.traceparent = traceparent
        self.stamps: dict[str, int] = {"REQUEST_START": time.monotonic_ns()}
        #: (activity, tensor name, array) at the ``TENSORS`` level
        self.tensor_records: list[tuple[str, str, Any]] = []

    def stamp(self, name: str) -> None:
        """Record timestamp ``name`` now."""
        self.stamps[name] = time.monotonic_ns()

    def tensors(self, activity: str, arrays: Mapping[str, Any]) -> None:
        """Record ``arrays`` as ``activity`` (``TENSOR_QUEUE_INPUT``, ``TENSOR_BACKEND_OUTPUT``)
        when the trace's level has ``TENSORS``."""
        if "TENSORS" in self.setting.values.level:
            # copies: an answer's arrays may be views of a batch buffer used again later
            self.tensor_records += [(activity, n, np.array(a)) for n, a in arrays.items()]

    def computed(self, t_packed: float, t_start: float, t_end: float, t_out: float) -> None:
        """A batch that held rows of this request answered (clock seconds; a request over
        several batches: the first start, the last end)."""
        stamps = self.stamps
        if "COMPUTE_START" not in stamps:
            stamps["COMPUTE_START"] = stamps["COMPUTE_INPUT_END"] = int(t_start * 1e9)
        stamps["COMPUTE_OUTPUT_START"] = int(t_end * 1e9)
        stamps["COMPUTE_END"] = int(t_out * 1e9)


_ORDER = (
    "REQUEST_START",
    "QUEUE_START",
    "COMPUTE_START",
    "COMPUTE_INPUT_END",
    "COMPUTE_OUTPUT_START",
    "COMPUTE_END",
    "REQUEST_END",
)


def ordered_stamps(trace: RequestTrace) -> list[tuple[str, int]]:
    """The trace's timestamps in Triton's order (those it has)."""
    return [(name, trace.stamps[name]) for name in _ORDER if name in trace.stamps]

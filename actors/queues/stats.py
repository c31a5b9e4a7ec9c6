"""Per-replica request time traces and their statistics (seed: monitoring statistics).

Per answered request (successful ones only), five durations in seconds:

* ``request_duration``: submit (``Request.t_submit``) -> computation done (``t_end``);
* ``read_preparation_duration``: submit -> its first rows packed into a batch;
* ``read_queue_duration``: packed -> the batch's main run started (``t_start``);
* ``computation_duration``: ``t_start`` -> ``t_end`` of the run that finished it;
* ``output_duration``: ``t_end`` -> the batch's outputs split back to their callers (the
  answer's way back to the queue and the routing; Triton's ``compute_output``).

Recording costs two list appends per request; the arithmetic happens in :meth:`snapshot`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, fields

import numpy as np

__all__ = ["QueueStats", "TimeTrace", "TraceCount", "TraceRecorder"]


@dataclass(frozen=True, slots=True)
class TimeTrace:
    """The five durations of one request, or a statistic of each (seconds)."""

    request_duration: float
    read_preparation_duration: float
    read_queue_duration: float
    computation_duration: float
    output_duration: float


@dataclass(frozen=True, slots=True)
class TraceCount:
    """How many requests each duration was recorded for."""

    request_duration: int
    read_preparation_duration: int
    read_queue_duration: int
    computation_duration: int
    output_duration: int


_NAMES = tuple(f.name for f in fields(TimeTrace))


class QueueStats:
    """A snapshot of one replica's statistics (the last ``capacity`` traces and a total)."""

    __slots__ = ("_columns", "_total")

    def __init__(self, columns: tuple[np.ndarray, ...], total: int) -> None:
        self._columns = columns
        self._total = total

    def time_trace(self) -> list[TimeTrace]:
        """The buffered traces, oldest first (the last one is the latest request's)."""
        return [TimeTrace(*map(float, row)) for row in zip(*self._columns, strict=True)]

    def percentile(self, quantile: float = 0.9) -> TimeTrace:
        """The ``quantile`` (0..1; 0.9 is p90) of each duration over the buffered traces.

        All zeros when nothing was recorded.

        Raises:
            ValueError: ``quantile`` is not within [0, 1].
        """
        if not 0.0 <= quantile <= 1.0:
            raise ValueError(f"quantile must be within [0, 1], got {quantile}")
        if self._columns[0].size == 0:
            return TimeTrace(0.0, 0.0, 0.0, 0.0, 0.0)
        return TimeTrace(*(float(np.quantile(c, quantile)) for c in self._columns))

    def mean(self) -> TimeTrace:
        """The mean of each duration over the buffered traces (all zeros when none)."""
        if self._columns[0].size == 0:
            return TimeTrace(0.0, 0.0, 0.0, 0.0, 0.0)
        return TimeTrace(*(float(c.mean()) for c in self._columns))

    def total_count(self) -> TraceCount:
        """Requests answered successfully since the queue started (not only buffered ones)."""
        return TraceCount(*(self._total,) * len(_NAMES))

    def as_dict(self, quantile: float = 0.9) -> dict[str, float]:
        """Percentile, mean and count under the seed's key names (values in seconds).

        Raises:
            ValueError: ``quantile`` is not within [0, 1].
        """
        out: dict[str, float] = {}
        pct, mean = self.percentile(quantile), self.mean()
        for name in _NAMES:
            stem = name.removesuffix("_duration")
            out[f"{stem}_monitoring_statistics_percentile"] = getattr(pct, name)
            out[f"{stem}_monitoring_statistics_mean"] = getattr(mean, name)
            out[f"{stem}_monitoring_statistics_count"] = float(self._total)
        return out


class TraceRecorder:
    """Collects traces per completed batch; keeps at least the last ``capacity`` (0: all)."""

    __slots__ = ("_buffered", "_capacity", "_chunks", "total")

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._chunks: deque[tuple[float, float, float, list[float], list[float]]] = deque()
        self._buffered = 0
        self.total = 0

    def add(
        self,
        t_start: float,
        t_end: float,
        t_out: float,
        submits: list[float],
        packed: list[float],
    ) -> None:
        """Record the requests a run answered: its start, end and the time its outputs
        reached their callers (``t_out``), and their submit and packing times."""
        n = len(submits)
        if n == 0:
            return
        self._chunks.append((t_start, t_end, t_out, submits, packed))
        self._buffered += n
        self.total += n
        cap = self._capacity
        if cap:
            chunks = self._chunks
            while self._buffered - len(chunks[0][3]) >= cap:
                self._buffered -= len(chunks.popleft()[3])

    def snapshot(self) -> QueueStats:
        """The statistics now (copies: later requests do not change it)."""
        cols: list[list[np.ndarray]] = [[] for _ in _NAMES]
        for t_start, t_end, t_out, submits, packed in self._chunks:
            sub = np.asarray(submits, dtype=np.float64)
            pack = np.asarray(packed, dtype=np.float64)
            cols[0].append(t_end - sub)
            cols[1].append(pack - sub)
            cols[2].append(t_start - pack)
            cols[3].append(np.full(sub.shape, t_end - t_start))
            cols[4].append(np.full(sub.shape, t_out - t_end))
        columns = tuple(np.concatenate(c) if c else np.empty(0, dtype=np.float64) for c in cols)
        if self._capacity and columns[0].size > self._capacity:
            columns = tuple(c[-self._capacity :] for c in columns)
        return QueueStats(columns, self.total)

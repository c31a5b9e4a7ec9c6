"""Statistics under the seed's names and units (microseconds), from a queue's snapshot."""

from __future__ import annotations

from actors.queues.stats import QueueStats, TimeTrace
from model_runtime.errors import InputValidationError

__all__ = ["StatisticsView"]

_PHASES = (
    ("request", "request_duration"),
    ("read_preparation", "read_preparation_duration"),
    ("read_queue", "read_queue_duration"),
    ("computation", "computation_duration"),
    ("output", "output_duration"),
)


class StatisticsView:
    """One replica's statistics as the seed's ``getTimeTrace`` / ``getMonitoring...`` maps."""

    __slots__ = ("_stats",)

    def __init__(self, stats: QueueStats) -> None:
        self._stats = stats

    def time_trace(self, cur: int = -1) -> dict[str, float]:
        """Durations of one answered request: ``request_duration_us`` etc. (empty: none yet).

        ``cur`` picks the request among the buffered ones (the seed's ``cur``, left undocumented
        there): -1, the default, is the last, -2 the one before, 0 the oldest still buffered.

        Raises:
            InputValidationError: ``cur`` is outside the buffered requests.
        """
        traces = self._stats.time_trace()
        if not traces:
            return {}
        if not -len(traces) <= cur < len(traces):
            raise InputValidationError(
                f"cur={cur}: {len(traces)} request traces are buffered "
                f"(cur in [{-len(traces)}, {len(traces) - 1}])"
            )
        trace = traces[cur]
        return {f"{field}_us": getattr(trace, field) * 1e6 for _, field in _PHASES}

    def percentile(self, quantile: float = 0.9) -> dict[str, float]:
        """``<phase>_monitoring_statistics_percentile_us`` for each phase.

        Raises:
            ValueError: ``quantile`` is not within [0, 1].
        """
        return self._per_phase(self._stats.percentile(quantile), "percentile_us")

    def mean(self) -> dict[str, float]:
        """``<phase>_monitoring_statistics_mean_us`` for each phase."""
        return self._per_phase(self._stats.mean(), "mean_us")

    def total_count(self) -> dict[str, float]:
        """``<phase>_monitoring_statistics_count`` for each phase."""
        counts = self._stats.total_count()
        return {
            f"{phase}_monitoring_statistics_count": float(getattr(counts, field))
            for phase, field in _PHASES
        }

    @staticmethod
    def _per_phase(values: TimeTrace, suffix: str) -> dict[str, float]:
        return {
            f"{phase}_monitoring_statistics_{suffix}": getattr(values, field) * 1e6
            for phase, field in _PHASES
        }

"""The values of python models' custom metrics (``pb_utils.MetricFamily``), held by the daemon.

Instances send their updates here; every instance of a model (and a restarted one) adds to the
same series, as Triton's server-side metrics do. The daemon renders :meth:`CustomMetrics.families`
on ``/metrics``.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CustomMetrics", "Family", "Series"]

Labels = tuple[tuple[str, str], ...]


@dataclass(slots=True)
class Series:
    """One labelled series: a value (COUNTER, GAUGE) or a histogram."""

    value: float = 0.0
    buckets: list[float] | None = None
    counts: list[int] = field(default_factory=list)  #: per bucket, not cumulative; +Inf last
    count: int = 0


@dataclass(slots=True)
class Family:
    name: str
    description: str
    kind: str
    series: dict[Labels, Series] = field(default_factory=dict)


def _labels(value: Any) -> Labels:
    if not isinstance(value, dict):
        raise ValueError("metric labels must be a dict of strings")
    return tuple(sorted((str(k), str(v)) for k, v in value.items()))


class CustomMetrics:
    """The families and series python models made. Every method raises ``ValueError`` with a
    text for the model when an update does not fit what is registered."""

    def __init__(self) -> None:
        self.families: dict[str, Family] = {}

    def family(self, name: str, description: str, kind: str) -> None:
        """Register a family (again: the same kind is fine)."""
        if not name or not name.replace("_", "a").replace(":", "a").isalnum():
            raise ValueError(f"metric family name {name!r} is not a valid metric name")
        known = self.families.get(name)
        if known is None:
            self.families[name] = Family(name, description, kind)
        elif known.kind != kind:
            raise ValueError(f"metric family {name!r} is registered as a {known.kind}")

    def _series(self, op: dict[str, Any]) -> tuple[Family, Series]:
        family = self.families.get(str(op.get("family")))
        if family is None:
            raise ValueError(f"no metric family {op.get('family')!r} is registered")
        key = _labels(op.get("labels", {}))
        series = family.series.get(key)
        if series is None:
            buckets = op.get("buckets")
            if family.kind == "HISTOGRAM":
                if not isinstance(buckets, list) or buckets != sorted(buckets):
                    raise ValueError("histogram buckets must be an ascending list")
                series = Series(
                    buckets=[float(b) for b in buckets], counts=[0] * (len(buckets) + 1)
                )
            else:
                series = Series()
            family.series[key] = series
        return family, series

    def apply(self, op: dict[str, Any]) -> None:
        """Apply ``metric`` (create a series), ``increment``, ``set`` or ``observe``."""
        family, series = self._series(op)
        kind = op.get("op")
        value = float(op.get("value", 0.0))
        if kind == "increment" and family.kind != "HISTOGRAM":
            if family.kind == "COUNTER" and value < 0:
                raise ValueError("a COUNTER cannot go down")
            series.value += value
        elif kind == "set" and family.kind == "GAUGE":
            series.value = value
        elif kind == "observe" and series.buckets is not None:
            series.counts[bisect.bisect_left(series.buckets, value)] += 1
            series.count += 1
            series.value += value
        elif kind != "metric":
            raise ValueError(f"{kind!r} does not apply to a {family.kind}")

    def value(self, family: str, labels: dict[str, str]) -> float:
        """A series' value (a histogram: its sum)."""
        _, series = self._series({"family": family, "labels": labels})
        return series.value

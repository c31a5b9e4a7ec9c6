"""Triton's ``Logger`` and custom metrics for ``model.py``.

Log lines and metric updates go to the daemon (which owns the values, so every instance of a
model adds to the same counter and a restart loses nothing); ``Metric.value()`` asks it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from model_runtime.python_backend.pb_bridge import TritonModelException, bridge

__all__ = ["Logger", "Metric", "MetricFamily"]


class Logger:
    """Triton's model logger: ``pb_utils.Logger.log_info("...")`` and friends."""

    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"
    VERBOSE = "VERBOSE"

    @staticmethod
    def log(message: str, level: str = "INFO") -> None:
        bridge().log(str(level), str(message))

    @staticmethod
    def log_info(message: str) -> None:
        bridge().log("INFO", str(message))

    @staticmethod
    def log_warn(message: str) -> None:
        bridge().log("WARNING", str(message))

    @staticmethod
    def log_error(message: str) -> None:
        bridge().log("ERROR", str(message))

    @staticmethod
    def log_verbose(message: str) -> None:
        bridge().log("VERBOSE", str(message))


class Metric:
    """One labelled series of a :class:`MetricFamily` (made by ``family.Metric(labels=...)``)."""

    def __init__(
        self,
        family: MetricFamily,
        labels: Mapping[str, str] | None = None,
        buckets: Sequence[float] | None = None,
    ) -> None:
        self._family = family
        self._labels = {str(k): str(v) for k, v in (labels or {}).items()}
        if family.kind == MetricFamily.HISTOGRAM:
            if buckets is None:
                raise TritonModelException("a HISTOGRAM metric needs buckets")
            self._buckets: list[float] | None = [float(b) for b in buckets]
        else:
            if buckets is not None:
                raise TritonModelException(f"a {family.kind} metric takes no buckets")
            self._buckets = None
        self._op("metric", buckets=self._buckets)

    def _op(self, op: str, **fields: Any) -> None:
        message = {"op": op, "family": self._family.name, "labels": self._labels, **fields}
        if op == "metric":
            bridge().call("metric", message)
        else:
            bridge().metric(message)

    def increment(self, value: float) -> None:
        """Raises: TritonModelException: a HISTOGRAM, or a COUNTER given a negative value."""
        if self._family.kind == MetricFamily.HISTOGRAM:
            raise TritonModelException("a HISTOGRAM metric is observed, not incremented")
        if self._family.kind == MetricFamily.COUNTER and value < 0:
            raise TritonModelException("a COUNTER cannot be incremented by a negative value")
        self._op("increment", value=float(value))

    def set(self, value: float) -> None:
        """Raises: TritonModelException: not a GAUGE."""
        if self._family.kind != MetricFamily.GAUGE:
            raise TritonModelException(f"a {self._family.kind} metric cannot be set")
        self._op("set", value=float(value))

    def observe(self, value: float) -> None:
        """Raises: TritonModelException: not a HISTOGRAM."""
        if self._family.kind != MetricFamily.HISTOGRAM:
            raise TritonModelException(f"a {self._family.kind} metric cannot observe")
        self._op("observe", value=float(value))

    def value(self) -> float:
        """The current value (a HISTOGRAM: its sum), as the daemon holds it."""
        args = {"family": self._family.name, "labels": self._labels}
        return float(bridge().call("metric_value", args))


class MetricFamily:
    """A named metric with a kind (``COUNTER``, ``GAUGE``, ``HISTOGRAM``) and a description.

    Raises:
        TritonModelException: an unknown kind, or a name registered with another kind.
    """

    COUNTER = "COUNTER"
    GAUGE = "GAUGE"
    HISTOGRAM = "HISTOGRAM"

    def __init__(self, name: str, description: str, kind: str) -> None:
        if kind not in (self.COUNTER, self.GAUGE, self.HISTOGRAM):
            raise TritonModelException(f"metric kind must be COUNTER, GAUGE or HISTOGRAM: {kind}")
        self.name = str(name)
        self.description = str(description)
        self.kind = kind
        bridge().call("family", {"name": self.name, "description": self.description, "kind": kind})

    def Metric(
        self, labels: Mapping[str, str] | None = None, buckets: Sequence[float] | None = None
    ) -> Metric:
        return Metric(self, labels, buckets)

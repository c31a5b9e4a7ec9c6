"""Python models' metrics in the daemon's Prometheus text: each model's custom metric families
(``pb_utils.MetricFamily``, :class:`~model_runtime.python_backend.metrics.CustomMetrics`) under
the names and labels the model gave them, as Triton exposes them (a COUNTER keeps its name, no
``_total``), and ``model_runtime_python_instance_restarts_total{model,version}``: the instance
processes restarted since the model version loaded.

A family that several models register is one family whose series are theirs together (Triton's
registry is the server's); its help text and kind are the first model's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from model_runtime.python_backend.metrics import CustomMetrics, Family

__all__ = ["RESTARTS", "python_models_text"]

RESTARTS = "model_runtime_python_instance_restarts_total"
_TYPES = {"COUNTER": "counter", "GAUGE": "gauge", "HISTOGRAM": "histogram"}


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)
    return f"{{{inner}}}" if inner else ""


def _number(value: float) -> str:
    return repr(float(value))


def _family_lines(name: str, families: list[Family]) -> list[str]:
    first = families[0]
    kind = _TYPES.get(first.kind, "untyped")
    help_text = first.description.replace("\\", "\\\\").replace("\n", "\\n")
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    for family in families:
        if family.kind != first.kind:
            continue  # another model's family of another kind: not mixed into this one
        for key, series in sorted(family.series.items()):
            if series.buckets is None:
                lines.append(f"{name}{_labels(key)} {_number(series.value)}")
                continue
            total = 0
            for bound, count in zip((*series.buckets, float("inf")), series.counts, strict=True):
                total += count
                le = "+Inf" if bound == float("inf") else _number(bound)
                lines.append(f"{name}_bucket{_labels((*key, ('le', le)))} {_number(total)}")
            lines.append(f"{name}_sum{_labels(key)} {_number(series.value)}")
            lines.append(f"{name}_count{_labels(key)} {_number(series.count)}")
    return lines


def python_models_text(runners: Iterable[tuple[str, str, Any]]) -> bytes:
    """The text exposition of python models' metrics; ``runners``: (model, version, runner)
    for each loaded version (a runner without ``metrics`` and ``restarts`` is skipped)."""
    families: dict[str, list[Family]] = {}
    restarts: list[tuple[str, str, int]] = []
    seen: set[int] = set()
    for model, version, runner in runners:
        metrics = getattr(runner, "metrics", None)
        if not isinstance(metrics, CustomMetrics):
            continue
        restarts.append((model, version, int(getattr(runner, "restarts", 0))))
        if id(metrics) in seen:
            continue
        seen.add(id(metrics))
        for name, family in metrics.families.items():
            families.setdefault(name, []).append(family)
    if not restarts:
        return b""
    lines = [
        f"# HELP {RESTARTS} Python model instance processes restarted since the model loaded",
        f"# TYPE {RESTARTS} counter",
    ]
    for model, version, count in sorted(restarts):
        lines.append(f"{RESTARTS}{_labels((('model', model), ('version', version)))} {count}.0")
    for name in sorted(families):
        lines += _family_lines(name, families[name])
    return ("\n".join(lines) + "\n").encode()

"""Reading one runner's facts for a scrape: its replicas' counters, statistics and memory, and
what it ran since the previous read (:class:`Mark`, the per-runner baseline that
``DaemonMetrics.read_runner`` turns into totals). Every function here is a fact for a
scrape: none raises."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from model_runtime.errors import ModelRuntimeError
from model_runtime.server.serving import replica_states

__all__ = [
    "Mark",
    "batch_size",
    "delta",
    "memory_of",
    "read_statistics",
    "replica_counters",
    "runs_by_size",
]

_STATS_TIMEOUT = 1.0


@dataclass(slots=True)
class Mark:
    """What one runner had counted at the last read (its replicas' runs and phase counts)."""

    runner: object
    runs: dict[int, int] = field(default_factory=dict)
    counts: dict[tuple[int, str], float] = field(default_factory=dict)
    #: (replica, executed batch size) -> runs
    sizes: dict[tuple[int, int], int] = field(default_factory=dict)


def runs_by_size(
    mark: Mark, replica: int, state: object, batch: int, executions: int
) -> dict[int, int]:
    """The ``executions`` new runs of ``replica`` by the batch size they ran at (its state's
    ``runs_by_size`` since the last read); runs it does not size go to ``batch``."""
    sizes = getattr(state, "runs_by_size", None)
    out: dict[int, int] = {}
    if isinstance(sizes, dict):
        for size, n in list(sizes.items()):
            added = n - mark.sizes.get((replica, size), 0)
            mark.sizes[(replica, size)] = n
            if added > 0:
                out[size] = added
    rest = executions - sum(out.values())
    if rest > 0:
        out[batch] = out.get(batch, 0) + rest
    return out


def batch_size(runner: object) -> int:
    """The batch size ``runner`` executes (its executable's; 0 when it does not say)."""
    try:
        size = runner.executable.metadata.batch_size  # type: ignore[attr-defined]
    except (AttributeError, ModelRuntimeError):
        return 0
    return size if isinstance(size, int) else 0


def delta(now: float, before: float) -> float:
    """The increase of a counter since ``before`` (a counter that went back restarted)."""
    return now - before if now >= before else now


def replica_counters(runner: Any, replica: int) -> tuple[int | None, dict[str, int]]:
    """Device id and counters (runs, resets, restarts, retries, poisoned; standby: 1 while it
    stands by) of one replica, when exposed."""
    states = replica_states(runner)
    if replica >= len(states):
        return None, {}
    state = states[replica]
    counters = {}
    for name in ("runs", "resets", "restarts", "retries", "poisoned", "standby"):
        value = getattr(state, name, None)
        if isinstance(value, int):
            counters[name] = value
    device = getattr(state, "device_id", None)
    return (device if isinstance(device, int) else None), counters


def memory_of(runner: object) -> dict[str, Any]:
    """``runner.memory()`` (see ``ModelRunner.memory``), or {} for a runner without it."""
    fn = getattr(runner, "memory", None)
    if not callable(fn):
        return {}
    try:
        return dict(fn())
    except Exception:  # a fact for a scrape: never its failure
        return {}


async def read_statistics(fn: Any, replica: int) -> dict[str, float]:
    """``await fn(replica)`` (a runner statistics method) as floats; empty when unavailable."""
    try:
        async with asyncio.timeout(_STATS_TIMEOUT):
            result: Mapping[str, float] = await fn(replica)
    except (ModelRuntimeError, TimeoutError):  # a replica stopping, or a stuck actor
        return {}
    return {str(k): float(v) for k, v in result.items()}

"""The statistics extension: ``GET /v2/models/{name}/stats`` in the KServe/Triton shape.

Success and failure counts and durations are the daemon's own (measured at the front end, per
model entry: they outlive reloads). Given the daemon's :class:`DaemonMetrics`, execution counts,
queue and compute durations and ``batch_stats`` are its Triton totals of the model version
(cumulative across reloads; read from the runner first, see :mod:`.metrics`); without it, the
runner's own per-replica monitoring statistics (seed key names, microseconds): total = mean x
count, summed over replicas, since that runner started. ``compute_output`` is the time to
split a batch's outputs back to its callers. Every successful request counts once in each of
``queue``, ``compute_input``, ``compute_infer`` and ``compute_output`` (perf_analyzer checks,
and finds the version it measures by the ``queue`` count that grew). An ensemble executes
nothing itself: each of its successful requests counts once in every phase, its whole time in
``compute_infer`` (its steps' own times are their models').
``cache_hit`` / ``cache_miss``: the response cache's lookups of the version and their time (a
miss: lookup and insertion); a hit counts as a success but not in ``inference_count`` or
``execution_count`` (the model did not run), as Triton counts it.
"""

from __future__ import annotations

from typing import Any

from model_runtime.server.ensemble import EnsembleRunner
from model_runtime.server.observability.metrics import TRITON_PHASES, DaemonMetrics, phase_of
from model_runtime.server.observability.runner_reads import read_statistics, replica_counters
from model_runtime.server.repository.entries import ModelEntry
from model_runtime.server.serving import innermost

__all__ = ["model_statistics"]

#: Protocol statistics field -> the runner's request phase.
_PHASES = {name.removesuffix("_duration_us"): phase for name, phase in TRITON_PHASES.items()}


async def model_statistics(
    entry: ModelEntry, metrics: DaemonMetrics | None = None
) -> dict[str, Any]:
    """One model version's statistics document (never raises: missing facts read as zero)."""
    st = entry.stats
    phases = {name: {"count": 0, "ns": 0} for name in _PHASES}
    replicas: list[dict[str, Any]] = []
    executions = 0
    batch_stats: list[dict[str, Any]] = []
    runner = entry.runner
    if runner is not None:
        for r, status in enumerate(runner.replica_status()):
            mean = _by_phase(await read_statistics(runner.get_monitoring_statistics_mean, r))
            count = _by_phase(
                await read_statistics(runner.get_monitoring_statistics_total_count, r)
            )
            device, counters = replica_counters(runner, r)
            executions += counters.get("runs", 0)
            for name, key in _PHASES.items():  # mean (µs) x count, summed over replicas
                n = int(count.get(key, 0))
                phases[name]["count"] += n
                phases[name]["ns"] += int(mean.get(key, 0.0) * n * 1000)
            replicas.append(
                {
                    "replica": r,
                    "state": status.value,
                    "device": device,
                    **counters,
                    "mean_us": mean,
                    "count": count,
                }
            )
    cache = {"cache_hit": {"count": 0, "ns": 0}, "cache_miss": {"count": 0, "ns": 0}}
    if metrics is not None:
        await metrics.read_runner(entry.name, entry.version, runner)
        totals = metrics.totals(entry.name, entry.version)
        executions = totals.exec_count
        cache = {
            "cache_hit": {"count": totals.cache_hits, "ns": int(totals.cache_hit_us * 1000)},
            "cache_miss": {"count": totals.cache_misses, "ns": int(totals.cache_miss_us * 1000)},
        }
        for name in _PHASES:
            field = f"{name}_duration_us"
            us = getattr(totals, field)
            phases[name] = {"count": totals.recorded.get(field, 0), "ns": int(us * 1000)}
        for size, b in sorted(totals.batches.items()):
            batch_stats.append(
                {
                    "batch_size": size,
                    "compute_input": {"count": b.count, "ns": int(b.compute_input_us * 1000)},
                    "compute_infer": {"count": b.count, "ns": int(b.compute_infer_us * 1000)},
                    "compute_output": {"count": b.count, "ns": int(b.compute_output_us * 1000)},
                }
            )
    if isinstance(innermost(runner), EnsembleRunner):
        for name in _PHASES:
            phases[name] = {"count": st.success_count, "ns": 0}
        phases["compute_infer"]["ns"] = st.success_ns
    return {
        "name": entry.name,
        "version": entry.version,
        "state": entry.state.value,
        "last_inference": st.last_inference_ms,
        "inference_count": st.inference_count,
        "execution_count": executions,
        "inference_stats": {
            "success": {"count": st.success_count, "ns": st.success_ns},
            "fail": {"count": st.fail_count, "ns": st.fail_ns},
            **phases,
            **cache,
        },
        "batch_stats": batch_stats,
        "replicas": replicas,
    }


def _by_phase(stats: dict[str, float]) -> dict[str, float]:
    return {phase_of(k): v for k, v in stats.items()}

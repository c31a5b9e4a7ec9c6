"""The statistics extension: ``GET /v2/models/{name}/stats`` in the KServe/Triton shape.

Success and failure counts and durations are the daemon's own (measured at the HTTP front
end). Queue and compute durations come from the runner's per-replica monitoring statistics
(seed key names, microseconds): total = mean x count, summed over replicas.
"""

from __future__ import annotations

from typing import Any

from model_runtime.server.metrics import phase_of, read_statistics, replica_counters
from model_runtime.server.repository import ModelEntry

__all__ = ["model_statistics"]

#: Protocol statistics field -> the runner's request phase.
_PHASES = {
    "queue": "read_queue",
    "compute_input": "read_preparation",
    "compute_infer": "computation",
}


async def model_statistics(entry: ModelEntry) -> dict[str, Any]:
    """One model's statistics document (never raises: missing runner facts read as zero)."""
    st = entry.stats
    phases = {name: {"count": 0, "ns": 0} for name in _PHASES}
    replicas: list[dict[str, Any]] = []
    executions = 0
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
    return {
        "name": entry.name,
        "version": "1",
        "state": entry.state.value,
        "last_inference": st.last_inference_ms,
        "inference_count": st.inference_count,
        "execution_count": executions,
        "inference_stats": {
            "success": {"count": st.success_count, "ns": st.success_ns},
            "fail": {"count": st.fail_count, "ns": st.fail_ns},
            **phases,
            "compute_output": {"count": 0, "ns": 0},
        },
        "replicas": replicas,
    }


def _by_phase(stats: dict[str, float]) -> dict[str, float]:
    return {phase_of(k): v for k, v in stats.items()}

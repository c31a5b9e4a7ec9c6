"""Statistics as the seed defines them, under the daemon's loop (uvloop) and pipelining: one
clock for every timestamp (no negative phase), queue time in the device's queue counted as
queue time (computation never overlaps), and ``get_time_trace``'s ``cur``."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest
import uvloop

from model_runtime.errors import InputValidationError
from model_runtime.runner import ModelRunner, ModelRunnerConfig
from tests.integration.runner_support import compile_to
from tests.models import make_mlp

pytestmark = pytest.mark.timeout(60)

PHASES = (
    "request_duration_us",
    "read_preparation_duration_us",
    "read_queue_duration_us",
    "computation_duration_us",
    "output_duration_us",
)


@pytest.fixture(scope="module")
def path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_to(
        make_mlp(sizes=(256, 512, 512, 10)), tmp_path_factory.mktemp("st"), batch_size=4
    )


def test_phases_are_consistent_and_computation_never_overlaps(path: Path) -> None:
    async def main() -> tuple[list[dict[str, float]], float, int]:
        config = ModelRunnerConfig(timeout=0.001, request_tracepoints_buffer_size=0)
        x = np.ones((4, 256), np.float32)  # one request = one whole batch
        async with ModelRunner(path, config) as runner:
            started = time.perf_counter()
            await asyncio.gather(*(runner.execute({"x": x}) for _ in range(300)))
            wall = time.perf_counter() - started
            n = int(
                (await runner.get_monitoring_statistics_total_count())[
                    "request_monitoring_statistics_count"
                ]
            )
            traces = [await runner.get_time_trace(0, cur) for cur in range(-n, 0)]
            with pytest.raises(InputValidationError, match="cur=300"):
                await runner.get_time_trace(0, n)
        return traces, wall, n

    traces, wall, n = uvloop.run(main())
    assert n == 300
    for t in traces:
        assert all(t[p] >= 0 for p in PHASES), t
        # submit -> computation done is the three phases before it; the output phase follows
        parts = sum(t[p] for p in PHASES[1:4])
        assert abs(t["request_duration_us"] - parts) < 1.0, t
    # The device runs one batch at a time: the batches' computations cannot add up to more
    # than the wall time (with the device's queue counted as computation they came to ~2x).
    busy = sum(t["computation_duration_us"] for t in traces) / 1e6
    assert busy <= wall * 1.02, (busy, wall)

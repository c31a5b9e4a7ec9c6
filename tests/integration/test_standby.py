"""Two cpu replicas on a host that has a core for only one of them beside the event loop: while
the model's batches are light, the second stands by (loaded, watched, serving nothing) and
takes over while the first is out of service; given the cores, or batches heavy enough that
the loop is idle most of the time, both serve."""

from __future__ import annotations

from pathlib import Path

import anyio
import numpy as np
import pytest

from actors.device.inventory import DeviceSpec
from actors.device.manager import DeviceManager
from model_runtime.runner import ModelRunner, ModelRunnerConfig
from tests.integration.runner_support import Reference, compile_to
from tests.models import make_mlp

pytestmark = pytest.mark.timeout(120)

SIZES = (32, 64, 10)


async def serve(
    path: Path, config: ModelRunnerConfig, ref: Reference, width: int = SIZES[0], rows: int = 4
) -> tuple[list[int], list[bool]]:
    """64 concurrent callers, 20 requests of 1 to ``rows`` rows each (1: the runner's common
    request, the same shape as the one before), every answer checked; the requests each
    replica served, and which replicas stand by."""
    manager = DeviceManager(inventory=[DeviceSpec(id=i, kind="cpu", threads=1) for i in (0, 1)])
    rng = np.random.default_rng(3)
    async with ModelRunner(path, config, device_manager=manager) as runner:

        async def caller(k: int) -> None:
            for i in range(20):
                x = rng.standard_normal((1 + (k + i) % rows, width)).astype(np.float32)
                out = await runner.execute({"x": x})
                want = ref({"x": x})["logits"]
                np.testing.assert_allclose(out["logits"], want, rtol=1e-4, atol=1e-5)

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for k in range(64):
                    tg.start_soon(caller, k)
        standby = [s.standby for s in runner.replica_states()]
        counts = [
            int(
                (await runner.get_monitoring_statistics_total_count(r))[
                    "request_monitoring_statistics_count"
                ]
            )
            for r in (0, 1)
        ]
    return counts, standby


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Reference]:
    model = make_mlp(sizes=SIZES, seed=11)
    return compile_to(model, tmp_path_factory.mktemp("standby"), batch_size=8), Reference(model)


async def test_on_two_cores_the_second_cpu_replica_stands_by(mlp: tuple[Path, Reference]) -> None:
    path, ref = mlp
    config = ModelRunnerConfig(replication_factor=2, batching_dim=0, host_cores=2)
    assert await serve(path, config, ref) == ([1280, 0], [False, True])


async def test_with_a_core_for_each_both_replicas_serve(mlp: tuple[Path, Reference]) -> None:
    path, ref = mlp
    config = ModelRunnerConfig(replication_factor=2, batching_dim=0, host_cores=3)
    counts, standby = await serve(path, config, ref)
    assert sum(counts) == 1280 and min(counts) > 0, counts
    assert standby == [False, False]


async def test_the_replica_standing_by_serves_while_the_other_is_out(
    mlp: tuple[Path, Reference],
) -> None:
    """Replica 0's device fails for good on its 5th run: replica 1 answers everything after,
    nobody gets an error."""
    path, ref = mlp
    config = ModelRunnerConfig(
        replication_factor=2, batching_dim=0, host_cores=2, fault_plan="fatal:at=5:replica=0"
    )
    counts, standby = await serve(path, config, ref)
    assert sum(counts) == 1280 and counts[1] > 0, counts
    assert standby == [False, True]


async def test_a_heavy_models_second_replica_serves_on_two_cores(tmp_path: Path) -> None:
    """A batch of this MLP runs for milliseconds, many times a hand-off to the device's thread:
    the loop is idle most of the time, and a second device doubles what the host computes."""
    model = make_mlp(sizes=(784, 2048, 2048, 10), seed=12)
    path = compile_to(model, tmp_path, batch_size=32)
    config = ModelRunnerConfig(replication_factor=2, batching_dim=0, host_cores=2)
    counts, standby = await serve(path, config, Reference(model), width=784, rows=1)
    assert standby == [False, True]  # past the cores: it would stand by for a light model
    assert sum(counts) == 1280 and min(counts) > 0, counts

"""Replicas of one runner share its event loop: a short run may hold the loop (run inline, in
the caller's task) only while no other replica's device is busy, since the loop it would
stall serves that replica's batches too."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import numpy as np
import pytest

from actors.device import inline
from actors.device.inventory import DeviceSpec
from actors.device.manager import DeviceManager
from model_runtime.runner import ModelRunner, ModelRunnerConfig
from tests.integration.runner_support import Reference, compile_to
from tests.models import make_mlp

pytestmark = pytest.mark.timeout(60)

SIZES = (32, 48, 10)


def rows(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, SIZES[0])).astype(np.float32)


@pytest.fixture
async def two_replicas(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[ModelRunner, Reference]]:
    """Two replicas of a bucketed MLP whose one-row runs go inline whatever this machine's
    speed (the rule, not the measured run time, is the point), each measured once."""
    monkeypatch.setattr(inline, "INLINE_BELOW", 1.0)
    model = make_mlp(sizes=SIZES, seed=5)
    path = compile_to(model, tmp_path, batch_size=8)
    manager = DeviceManager(inventory=[DeviceSpec(id=i, kind="cpu", threads=1) for i in (0, 1)])
    config = ModelRunnerConfig(replication_factor=2, batching_dim=0)
    async with ModelRunner(path, config, device_manager=manager) as runner:
        with anyio.fail_after(20):
            for r in (0, 1):
                await runner.execute({"x": rows(1, seed=r)}, replica_id=r)
        yield runner, Reference(model)


async def test_a_lone_request_runs_inline_only_while_the_other_replica_is_idle(
    two_replicas: tuple[ModelRunner, Reference],
) -> None:
    runner, ref = two_replicas
    replicas = runner._replicas
    assert replicas is not None
    x = rows(1, seed=7)
    # Both idle: answered before execute_async returns (run in the caller's task).
    await asyncio.sleep(0)
    alone = runner.execute_async({"x": x}, replica_id=1)
    assert isinstance(alone, asyncio.Future) and alone.done()
    np.testing.assert_allclose(alone.result()["logits"], ref({"x": x})["logits"], atol=1e-5)
    # Replica 0 runs a batch on its worker thread (8 rows never run inline) ...
    batch = rows(8, seed=8)
    busy = runner.execute_async({"x": batch}, replica_id=0)
    device = replicas.device_actors[0]
    assert device is not None
    for _ in range(100):  # loop turns: the session hands the sealed batch to the device
        if device.busy:
            break
        await asyncio.sleep(0)
    assert device.busy
    # ... so the lone request goes to replica 1's worker too: the loop is not held.
    queued = runner.execute_async({"x": x}, replica_id=1)
    assert isinstance(queued, asyncio.Future) and not queued.done()
    with anyio.fail_after(20):
        out, big = await queued, await busy
    np.testing.assert_allclose(out["logits"], ref({"x": x})["logits"], atol=1e-5)
    np.testing.assert_allclose(big["logits"], ref({"x": batch})["logits"], atol=1e-5)

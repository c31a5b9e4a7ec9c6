"""CPU devices shared inside one process (DESIGN.md §5, issue 15 item 4): with the default
inventory (one single-threaded cpu device per core, two on the development machine) four
models of one replica each, and one model of three replicas, start and serve; placement spreads
them least-loaded first; a reset of one model's replica leaves another model on the same device
alone. The real daemon does the same (4 models; ``--replicas 3``)."""

from __future__ import annotations

from collections.abc import Awaitable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from actors.device.inventory import default_inventory
from actors.device.manager import DeviceManager
from model_runtime.runner import ModelRunner, ModelRunnerConfig
from tests.integration.runner_support import Reference, compile_to
from tests.integration.test_daemon_support import Daemon, running
from tests.models import make_mlp

pytestmark = pytest.mark.timeout(90)

WIDTH = 16


@pytest.fixture(autouse=True)
def _default_inventory(monkeypatch: pytest.MonkeyPatch) -> None:
    """The inventory a user gets: no device configuration at all (the harness sets 4)."""
    monkeypatch.delenv("MODEL_RUNTIME_DEVICES", raising=False)
    monkeypatch.delenv("MODEL_RUNTIME_CONFIG", raising=False)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Path, Reference]]:
    tmp = tmp_path_factory.mktemp("shared")
    out = []
    for k in range(4):
        model = make_mlp(sizes=(WIDTH, 8, 3), seed=k)
        out.append((compile_to(model, tmp, name=f"m{k}", batch_size=4), Reference(model)))
    return out


def rows(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, WIDTH)).astype(np.float32)


async def within(aw: Awaitable[Any], seconds: float = 20.0) -> Any:
    with anyio.fail_after(seconds):
        return await aw


def spread(n: int) -> list[int]:
    """Device ids of ``n`` replicas placed least-loaded first on the default inventory."""
    return [i % len(default_inventory()) for i in range(n)]


async def check(runner: ModelRunner, ref: Reference, seed: int) -> None:
    x = rows(4, seed)  # one whole batch: it runs at once, no flush timeout
    same(await within(runner.execute({"x": x})), ref({"x": x}))


def same(out: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert out.keys() == expected.keys()
    for name, want in expected.items():
        np.testing.assert_allclose(out[name], want, rtol=1e-4, atol=1e-5)


async def test_four_models_of_one_replica_serve_on_the_default_inventory(
    models: list[tuple[Path, Reference]],
) -> None:
    assert len(default_inventory()) < 4 or pytest.skip("more cores than models: nothing shared")
    manager = DeviceManager()
    async with AsyncExitStack() as stack:
        runners = [
            await stack.enter_async_context(ModelRunner(path, ModelRunnerConfig(batching_dim=0)))
            for path, _ in models
        ]
        assert [r.replica_states()[0].device_id for r in runners] == spread(4)
        counts = [info.attachments for info in manager.list_devices()]
        assert counts == [spread(4).count(i) for i in range(len(counts))]
        async with anyio.create_task_group() as tg:
            for k, (runner, (_, ref)) in enumerate(zip(runners, models, strict=True)):
                for j in range(3):
                    tg.start_soon(check, runner, ref, 10 * k + j)
    assert [info.holder for info in manager.list_devices()] == [None] * len(counts)


async def test_one_model_of_three_replicas_serves_on_the_default_inventory(
    models: list[tuple[Path, Reference]],
) -> None:
    path, ref = models[0]
    config = ModelRunnerConfig(batching_dim=0, replication_factor=3)
    async with ModelRunner(path, config) as runner:
        assert [s.device_id for s in runner.replica_states()] == spread(3)
        for r in range(3):
            x = rows(4, r)
            same(await within(runner.execute({"x": x}, replica_id=r)), ref({"x": x}))
        assert [s.runs for s in runner.replica_states()] == [1, 1, 1]


async def test_a_reset_on_one_model_leaves_another_on_the_same_device_alone(
    models: list[tuple[Path, Reference]],
) -> None:
    (faulty_path, faulty_ref), (calm_path, calm_ref) = models[0], models[1]
    faulty_cfg = ModelRunnerConfig(
        batching_dim=0, replica_to_device={0: 0}, auto_reset=True, fault_plan="recoverable:at=2"
    )
    calm_cfg = ModelRunnerConfig(batching_dim=0, replica_to_device={0: 0})
    async with (
        ModelRunner(faulty_path, faulty_cfg) as faulty,
        ModelRunner(calm_path, calm_cfg) as calm,
    ):
        assert faulty.replica_states()[0].device_id == calm.replica_states()[0].device_id == 0
        assert DeviceManager().attachments(0) == 2
        for k in range(4):  # the faulty model's run 2 fails: its device resets, it retries
            await check(faulty, faulty_ref, k)
            await check(calm, calm_ref, 100 + k)
        f, c = faulty.replica_states()[0], calm.replica_states()[0]
        assert f.resets == 1 and f.runs >= 4
        assert (c.resets, c.restarts, c.retries, c.runs) == (0, 0, 0, 4)
        assert calm.is_ready and faulty.is_ready
        assert DeviceManager().attachments(0) == 2  # the reset kept its attachment


# -- the real daemon -------------------------------------------------------------------------


def serve(d: Daemon, names: list[str], per_model: int) -> None:
    x = rows(2, 0).ravel().tolist()
    doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, WIDTH], "data": x}]}
    for name in names:
        for _ in range(per_model):
            status, out = d.post(f"/v2/models/{name}/infer", doc)
            assert status == 200, out


def test_the_daemon_serves_four_models_on_the_default_inventory(
    tmp_path: Path, models: list[tuple[Path, Reference]]
) -> None:
    repo = tmp_path / "models"
    repo.mkdir()
    for path, _ in models:
        (repo / path.name).write_bytes(path.read_bytes())
    names = [p.stem for p, _ in models]
    with running(tmp_path, "--model-repository", str(repo)) as d:
        serve(d, names, 2)
        attached = [e for e in d.events() if e.get("event") == "device.attached"]
        assert sorted(e["device"] for e in attached) == sorted(spread(4))
        assert d.get("/v2/health/ready")[0] == 200
    assert d.proc.returncode == 0


def test_the_daemon_serves_three_replicas_on_the_default_inventory(
    tmp_path: Path, models: list[tuple[Path, Reference]]
) -> None:
    path = models[0][0]
    with running(tmp_path, f"m0={path}", "--replicas", "3") as d:
        serve(d, ["m0"], 6)
        attached = [e for e in d.events() if e.get("event") == "device.attached"]
        assert [e["device"] for e in attached] == spread(3)
    assert d.proc.returncode == 0

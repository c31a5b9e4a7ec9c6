"""The model repository over fake runners: per-model availability, reload beside the serving
version with an atomic swap, failed reloads that leave the old version serving, model control
modes, the poll, and readiness. (The real daemon: ``tests/integration/test_daemon_repository.py``.)

A fake model file holds one word: its version tag, or ``bad`` (the runner fails to start).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from pathlib import Path

import anyio
import numpy as np
import pytest

from actors.device.wait import DeviceWaitStrategy
from actors.session.state import ReplicaStatus
from model_runtime.errors import (
    InvalidExecutableError,
    ModelControlError,
    ModelLoadError,
    RunnerStoppedError,
)
from model_runtime.io import DataDesc
from model_runtime.runner_config import ModelRunnerConfig
from model_runtime.server.repository.entries import ControlMode, ModelState
from model_runtime.server.repository.repository import ModelRepository
from model_runtime.server.serving import RunnerLike

pytestmark = pytest.mark.timeout(10)


class Version:
    """A fake runner for one version of a model file: ``x + tag``; ``gate`` holds requests."""

    def __init__(
        self,
        path: Path,
        config: ModelRunnerConfig,
        log: list[str],
        start_gate: asyncio.Event | None = None,
    ) -> None:
        self.tag = path.read_text()
        self.start_gate = start_gate
        self.config = config
        self.log = log
        self.accepting = False
        self.inflight = 0
        self.gate: asyncio.Event | None = None
        self.idle = asyncio.Event()
        self.idle.set()

    async def start(self) -> None:
        await asyncio.sleep(0)  # starting takes time: requests arrive meanwhile
        if self.start_gate is not None:
            await self.start_gate.wait()
        if self.tag == "bad":
            self.log.append("start-failed bad")
            raise InvalidExecutableError("the file is truncated")
        self.accepting = True
        self.log.append(f"start {self.tag}")

    async def close(self) -> None:
        self.accepting = False
        await self.idle.wait()  # drain: what was taken finishes
        self.log.append(f"close {self.tag}")

    async def execute(
        self,
        inputs: Mapping[str, np.ndarray],
        outputs: Mapping[str, np.ndarray] | None = None,
        replica_id: int | None = None,
        timeout: float | None = None,
        priority: int = 0,
    ) -> dict[str, np.ndarray]:
        if not self.accepting:
            raise RunnerStoppedError(f"version {self.tag} is not running")
        self.inflight += 1
        self.idle.clear()
        try:
            if self.gate is not None:
                await self.gate.wait()
            return {"y": inputs["x"] + float(self.tag.removeprefix("v"))}
        finally:
            self.inflight -= 1
            if not self.inflight:
                self.idle.set()

    def get_execute_inputs(self) -> list[DataDesc]:
        return [DataDesc("x", 16, (4,), np.dtype(np.float32))]

    def get_execute_outputs(self) -> list[DataDesc]:
        return [DataDesc("y", 16, (4,), np.dtype(np.float32))]

    def replica_status(self) -> list[ReplicaStatus]:
        return [ReplicaStatus.READY if self.accepting else ReplicaStatus.STOPPED]

    @property
    def is_ready(self) -> bool:
        return self.accepting

    async def get_monitoring_statistics_total_count(self, replica_id: int = 0) -> dict[str, float]:
        return {}

    async def get_monitoring_statistics_mean(self, replica_id: int = 0) -> dict[str, float]:
        return {}


class Repo:
    """A repository directory of fake model files and the runners made for them."""

    def __init__(self, tmp_path: Path, mode: ControlMode = ControlMode.EXPLICIT) -> None:
        self.dir = tmp_path
        self.log: list[str] = []
        self.made: list[Version] = []
        self.start_gate: asyncio.Event | None = None
        self.repo = ModelRepository(
            ModelRunnerConfig(batching_dim=0),
            directory=tmp_path,
            runner_factory=self.factory,
            control_mode=mode,
        )

    def factory(self, path: Path, config: ModelRunnerConfig) -> RunnerLike:
        version = Version(path, config, self.log, self.start_gate)
        self.made.append(version)
        return version

    def write(self, name: str, tag: str) -> None:
        path = self.dir / f"{name}.mrx"
        before = path.stat().st_mtime_ns if path.exists() else 0
        path.write_text(tag)
        os.utime(path, ns=(before + 10**9, before + 10**9))  # a new version, whatever the clock

    async def infer(self, name: str) -> float:
        runner = self.repo.get(name).runner
        assert runner is not None
        out = await runner.execute({"x": np.zeros(4, np.float32)})
        return float(out["y"][0])


def states(repo: ModelRepository) -> dict[str, tuple[str, str]]:
    return {m["name"]: (m["state"], m["reason"]) for m in repo.index()}


async def test_a_model_that_fails_to_load_is_unavailable_and_the_others_serve(
    tmp_path: Path,
) -> None:
    r = Repo(tmp_path)
    r.write("good", "v1")
    r.write("broken", "bad")
    async with r.repo as repo:
        with pytest.raises(ModelLoadError, match="failed to load 'broken': the file is truncated"):
            await repo.load("broken")
        await repo.load("good")
        index = states(repo)
        assert index["broken"] == ("UNAVAILABLE", "failed to load 'broken': the file is truncated")
        assert index["good"] == ("READY", "")
        assert await r.infer("good") == 1.0
        assert repo.get("broken").load_failures == 1


async def test_a_reload_starts_the_new_version_before_the_old_one_closes(tmp_path: Path) -> None:
    """In-flight requests finish on the old version; requests during the reload are served
    by the old one, those after the swap by the new; none is refused."""
    r = Repo(tmp_path)
    r.write("m", "v1")
    async with r.repo as repo:
        await repo.load("m")
        old = r.made[0]
        old.gate = asyncio.Event()
        inflight = asyncio.ensure_future(r.infer("m"))
        await anyio.wait_all_tasks_blocked()
        assert old.inflight == 1
        held = repo.get("m").runner  # what a request handler holds while it reads its body
        assert held is not None
        r.write("m", "v2")
        r.start_gate = started = asyncio.Event()
        reload = asyncio.ensure_future(repo.load("m"))
        await anyio.wait_all_tasks_blocked()  # the new version is starting
        assert len(r.made) == 2 and repo.get("m").state is ModelState.READY
        before_swap = asyncio.ensure_future(r.infer("m"))  # taken by the old version
        await anyio.wait_all_tasks_blocked()
        assert old.inflight == 2
        started.set()
        await anyio.wait_all_tasks_blocked()
        assert r.log == ["start v1", "start v2"]  # swapped; the old one drains
        assert await r.infer("m") == 2.0  # after the swap: the new version
        late = await held.execute({"x": np.zeros(4, np.float32)})  # held across the swap
        assert float(late["y"][0]) == 2.0
        assert not reload.done()
        old.gate.set()
        assert await inflight == 1.0 and await before_swap == 1.0
        await reload
        assert r.log == ["start v1", "start v2", "close v1"]
        assert repo.get("m").loads == 2 and repo.get("m").reason == ""


async def test_a_failed_reload_leaves_the_old_version_serving(tmp_path: Path) -> None:
    r = Repo(tmp_path)
    r.write("m", "v1")
    async with r.repo as repo:
        await repo.load("m")
        r.write("m", "bad")
        with pytest.raises(ModelLoadError, match="failed to load 'm'"):
            await repo.load("m")
        state, reason = states(repo)["m"]
        assert state == "READY"
        assert "failed to load 'm'" in reason and "previous version is still serving" in reason
        assert await r.infer("m") == 1.0
        assert r.log == ["start v1", "start-failed bad"]
        r.write("m", "v3")
        await repo.load("m")
        assert await r.infer("m") == 3.0 and states(repo)["m"] == ("READY", "")


async def test_a_reload_waits_a_bounded_time_for_devices(tmp_path: Path) -> None:
    r = Repo(tmp_path)
    r.repo.reload_device_wait = 2.5
    r.write("m", "v1")
    async with r.repo as repo:
        await repo.load("m")
        await repo.load("m")
    first, second = (v.config.device_wait_config for v in r.made)
    assert first is None  # a first load: the configured strategy (default: no wait)
    assert second is not None
    assert second.strategy is DeviceWaitStrategy.WAIT_WITH_TIMEOUT and second.timeout == 2.5


@pytest.mark.parametrize("mode", [ControlMode.NONE, ControlMode.POLL])
async def test_the_repository_api_cannot_load_or_unload_outside_explicit_mode(
    tmp_path: Path, mode: ControlMode
) -> None:
    r = Repo(tmp_path, mode)
    r.write("m", "v1")
    async with r.repo as repo:
        await repo.load("m")  # the daemon's own loads are not the API's
        # Triton's words for both modes ("polling" covers its `none` mode too)
        with pytest.raises(
            ModelControlError,
            match=r"^explicit model load / unload is not allowed if polling is enabled$",
        ):
            await repo.client_load("m")
        with pytest.raises(ModelControlError):
            await repo.client_unload("m")
        assert await r.infer("m") == 1.0 and len(r.made) == 1


async def test_explicit_mode_loads_and_unloads_through_the_api(tmp_path: Path) -> None:
    r = Repo(tmp_path, ControlMode.EXPLICIT)
    r.write("m", "v1")
    async with r.repo as repo:
        await repo.client_load("m")
        assert await r.infer("m") == 1.0
        await repo.client_unload("m")
        assert states(repo)["m"] == ("UNAVAILABLE", "unloaded")


async def test_the_poll_follows_added_changed_and_removed_files(tmp_path: Path) -> None:
    r = Repo(tmp_path, ControlMode.POLL)
    async with r.repo as repo:
        await repo.poll()
        assert states(repo) == {}
        r.write("m", "v1")
        await repo.poll()
        assert states(repo)["m"] == ("READY", "") and await r.infer("m") == 1.0
        await repo.poll()
        assert len(r.made) == 1  # unchanged: not reloaded
        r.write("m", "v2")
        await repo.poll()
        assert await r.infer("m") == 2.0 and r.log[-1] == "close v1"
        r.write("m", "bad")
        await repo.poll()
        await repo.poll()  # a file that failed is not tried again until it changes
        assert len(r.made) == 3
        assert states(repo)["m"][0] == "READY" and await r.infer("m") == 2.0
        r.write("m", "v4")
        await repo.poll()
        assert await r.infer("m") == 4.0
        (tmp_path / "m.mrx").unlink()
        await repo.poll()
        assert states(repo) == {} and r.log[-1] == "close v4"


async def test_readiness_is_strict_by_default(tmp_path: Path) -> None:
    r = Repo(tmp_path)
    r.write("good", "v1")
    r.write("broken", "bad")
    async with r.repo as repo:
        repo.starting = True
        assert repo.not_ready_reason() == "the server is loading its models"
        await repo.load("good")
        with pytest.raises(ModelLoadError):
            await repo.load("broken")
        repo.starting = False
        reason = repo.not_ready_reason()
        assert reason is not None and "['broken']" in reason
        repo.strict_readiness = False
        assert repo.not_ready_reason() is None
        repo.strict_readiness = True
        await repo.unload("broken")  # not wanted any more: not waited for
        assert repo.not_ready_reason() is None


async def test_a_client_that_goes_away_does_not_cancel_its_load(tmp_path: Path) -> None:
    r = Repo(tmp_path)
    r.write("m", "v1")
    async with r.repo as repo:
        r.start_gate = started = asyncio.Event()
        asked = asyncio.ensure_future(repo.client_load("m"))
        await anyio.wait_all_tasks_blocked()  # the runner is starting
        asked.cancel()  # the HTTP client disconnected
        await anyio.wait_all_tasks_blocked()
        started.set()
        while repo.get("m").state is ModelState.LOADING:
            await anyio.wait_all_tasks_blocked()
        assert states(repo)["m"] == ("READY", "") and await r.infer("m") == 1.0
        assert asked.cancelled()

"""The daemon's start over fake runners: models load ``--model-load-thread-count`` at a time,
several repository directories serve as one, and auto-complete can be turned off."""

from __future__ import annotations

import asyncio
from pathlib import Path

import anyio
import pytest

from model_runtime.errors import ConfigurationError, ModelLoadError
from model_runtime.runner_config import ModelRunnerConfig
from model_runtime.server.daemon.serve import load_at_start
from model_runtime.server.repository.repository import ModelRepository
from tests.unit.test_repository import Repo, states

pytestmark = pytest.mark.timeout(10)


async def _until(made: list[object], count: int) -> None:
    """Until ``count`` runners were made and every task waits."""
    with anyio.fail_after(5):
        while len(made) < count:
            await anyio.wait_all_tasks_blocked()
        await anyio.wait_all_tasks_blocked()


async def test_models_load_model_load_thread_count_at_a_time(tmp_path: Path) -> None:
    r = Repo(tmp_path)
    for i in range(8):
        r.write(f"m{i}", "v1")
    r.write("broken", "bad")
    r.start_gate = asyncio.Event()  # every start waits here
    async with r.repo as repo:
        names = repo.scan()
        failed: list[str] = []
        loading = asyncio.ensure_future(load_at_start(repo, names, 4, failed))
        try:
            await _until(r.made, 4)
            started = len(r.made)
        finally:
            r.start_gate.set()
            await loading
        assert started == 4  # four load at once; the others wait for a free slot
        assert len(r.made) == 9
        assert failed == ["broken"]  # and the others load all the same
        ready = [name for name, (state, _) in states(repo).items() if state == "READY"]
        assert sorted(ready) == [f"m{i}" for i in range(8)]
        await repo.close_all()


def _repo(*directories: Path, auto_complete: bool = True) -> tuple[Repo, ModelRepository]:
    r = Repo(directories[0])
    r.repo = ModelRepository(
        ModelRunnerConfig(batching_dim=0),
        directory=directories[0],
        more_directories=directories[1:],
        runner_factory=r.factory,
        auto_complete=auto_complete,
    )
    return r, r.repo


async def test_several_repository_directories_serve_as_one(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "one.mrx").write_text("v1")
    (b / "two.mrx").write_text("v2")
    r, repo = _repo(a, b)
    async with repo:
        assert repo.scan() == ["one", "two"]
        await repo.load("two")
        assert await r.infer("two") == 2.0
        await repo.close_all()
    (b / "one.mrx").write_text("v3")  # Triton refuses a model found in two repositories
    r, repo = _repo(a, b)
    with pytest.raises(ConfigurationError, match="'one' is in more than one model repository"):
        repo.scan()


async def test_without_auto_complete_a_config_must_describe_the_model(tmp_path: Path) -> None:
    model = tmp_path / "m"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.mrx").write_text("v1")
    (model / "config.pbtxt").write_text("max_batch_size: 4\n")
    (tmp_path / "flat.mrx").write_text("v1")  # a flat model has no config to complete
    _, repo = _repo(tmp_path, auto_complete=False)
    async with repo:
        repo.scan()
        with pytest.raises(ModelLoadError, match="input and output: not given, and auto-complete"):
            await repo.load("m")
        await repo.load("flat")
        await repo.close_all()

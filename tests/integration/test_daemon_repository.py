"""The real daemon's model repository (a subprocess on loopback): per-model availability at
start, reloads under concurrent load (good, bad, and with no device free), readiness, and the
model control modes (none, explicit, poll).

Models here add a constant to their input (``y = x + c``), so an answer names the version that
computed it. The test harness gives the daemon four cpu devices (``tests/conftest.py``): a
reload loads the new version beside the serving one, on a device of its own.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from model_runtime.server.daemon.heap import GEN0_THRESHOLD
from tests.integration.runner_support import compile_to
from tests.integration.test_daemon_support import (
    Daemon,
    metric,
    running,
    start_daemon,
    stop_daemon,
    wait_for,
)

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]
ROW = [0.0, 0.0, 0.0, 0.0]

#: Triton's answer to a load or unload outside explicit mode.
POLLING = "explicit model load / unload is not allowed if polling is enabled"


def add_const(c: float, batch: int | str = "N") -> onnx.ModelProto:
    """``y = x + c``: x, y float32 [batch, 4]."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "c"], ["y"])],
        "add_const",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4])],
        [numpy_helper.from_array(np.full(4, c, np.float32), "c")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def mrx(tmp: Path, c: float) -> bytes:
    """The bytes of a compiled ``y = x + c`` executable."""
    out = tmp / f"build-{c}"
    out.mkdir(exist_ok=True)
    return compile_to(add_const(c), out, name="m", batch_size=8).read_bytes()


def put(path: Path, data: bytes) -> None:
    """Replace ``path`` as deployments do: write beside it, then rename over it."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def infer_doc(rows: int = 1) -> dict[str, Any]:
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": [rows, 4], "data": ROW * rows}]}


def index(d: Daemon) -> dict[str, tuple[str, str]]:
    status, out = d.post("/v2/repository/index")
    assert status == 200, out
    return {m["name"]: (m["state"], m["reason"]) for m in out}


def value(d: Daemon, model: str) -> float | tuple[int, Any]:
    """The constant of the version that answered, or (status, error) when it failed."""
    status, out = d.post(f"/v2/models/{model}/infer", infer_doc())
    return float(out["outputs"][0]["data"][0]) if status == 200 else (status, out)


@dataclass
class Answer:
    start: float
    end: float
    status: int
    value: float | str


@dataclass
class Load:
    """Concurrent clients sending requests to one model until stopped; every answer is kept."""

    url: str
    clients: int = 8
    answers: list[Answer] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    answered: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        connector = aiohttp.TCPConnector(limit=self.clients)
        async with aiohttp.ClientSession(connector=connector) as s:
            await asyncio.gather(*(self._client(s) for _ in range(self.clients)))

    async def _client(self, s: aiohttp.ClientSession) -> None:
        while not self.stop.is_set():
            t0 = time.monotonic()
            async with s.post(self.url, json=infer_doc()) as resp:
                out = await resp.json()
                status = resp.status
            got = out["outputs"][0]["data"][0] if status == 200 else out.get("error", "")
            self.answers.append(Answer(t0, time.monotonic(), status, got))
            self.answered.set()

    async def wait(self, more: int) -> None:
        want = len(self.answers) + more
        while len(self.answers) < want:
            self.answered.clear()
            await self.answered.wait()

    def failed(self) -> list[Answer]:
        return [a for a in self.answers if a.status != 200]


async def post(url: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.post(url) as resp:
        return resp.status, await resp.json()


async def reload_under_load(
    d: Daemon, model: str, before: int = 50
) -> tuple[Load, Any, float, float]:
    """Serve ``model`` under load, ask a reload, keep the load up a while after it answered.

    Returns the load, the reload's (status, body) and when the reload was asked and answered.
    """
    load = Load(d.url(f"/v2/models/{model}/infer"))
    task = asyncio.ensure_future(load.run())
    try:
        await asyncio.wait_for(load.wait(before), 30)
        t0 = time.monotonic()
        answer = await post(d.url(f"/v2/repository/models/{model}/load"))
        t1 = time.monotonic()
        await asyncio.wait_for(load.wait(before), 30)
    finally:
        load.stop.set()
        await task
    during = [a for a in load.answers if a.start < t1 and a.end > t0]
    print(  # the figures the report quotes (pytest -s)
        f"\n{model}: reload {answer[0]} in {t1 - t0:.2f} s; {len(load.answers)} requests, "
        f"{len(during)} overlapping the reload, {len(load.failed())} failed"
    )
    assert len(during) >= 8, "the reload did not happen under load"
    return load, answer, t0, t1


# -- per-model availability ---------------------------------------------------------------


def bad_repository(tmp_path: Path) -> Path:
    """Two good models, a truncated .mrx and a good model for which no device is left (two
    exclusive devices). (An .onnx whose batch is fixed is served at that batch: see
    test_triton_repository.py.)"""
    repo = tmp_path / "models"
    repo.mkdir()
    good = mrx(tmp_path, 1.0)
    (repo / "alpha.mrx").write_bytes(good)
    onnx.save_model(add_const(2.0), str(repo / "beta.onnx"))
    (repo / "corrupt.mrx").write_bytes(good[: len(good) // 2])
    (repo / "zeta.mrx").write_bytes(good)
    return repo


def test_bad_models_are_unavailable_with_reasons_and_the_good_ones_serve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Exclusive devices (cpu devices are shared by default): the third good model finds none.
    monkeypatch.setenv("MODEL_RUNTIME_DEVICES", "cpu:2x1:exclusive")
    repo = bad_repository(tmp_path)
    # One load at a time (models load 4 at once by default): which good model finds no device
    # depends on the order, here the names' order.
    d = start_daemon(
        tmp_path,
        "--model-repository",
        str(repo),
        "--model-load-thread-count=1",
        "--exit-on-error=false",  # bad models on purpose: the good ones serve (Triton's QA flag)
        wait_ready=False,
    )
    try:
        wait_for(lambda: any(e.get("event") == "daemon_ready" for e in d.events()), 60, "start")
        assert d.proc.poll() is None, "the daemon serves"
        assert value(d, "alpha") == 1.0 and value(d, "beta") == 2.0
        states = index(d)
        assert states["alpha"] == ("READY", "") and states["beta"] == ("READY", "")
        for name, why in [
            ("corrupt", "failed to load 'corrupt'"),
            ("zeta", "no free device"),
        ]:
            state, reason = states[name]
            assert state == "UNAVAILABLE" and why in reason, (name, reason)
            assert reason.startswith(f"failed to load '{name}': "), reason
            status, out = d.post(f"/v2/models/{name}/infer", infer_doc())
            assert status == 503 and "UNAVAILABLE" in out["error"]
            assert d.get(f"/v2/models/{name}/ready")[0] == 503
        # Strict readiness (the default): not ready while a model that should be loaded is not.
        status, out = d.get("/v2/health/ready")
        assert status == 503 and "['corrupt', 'zeta']" in out["error"]
        text = d.get("/metrics")[1]
        assert metric(text, 'model_runtime_model_loads_total{model="corrupt",outcome="failure"}')
        assert 'model_runtime_model_state{model="alpha",state="READY"} 1.0' in text
        ready = next(e for e in d.events() if e.get("event") == "daemon_ready")
        assert ready["loaded"] == ["alpha", "beta"]
        assert ready["unavailable"] == ["corrupt", "zeta"]
        # The startup heap is frozen once the models are loaded (the collector skips it).
        settled = next(e for e in d.events() if e.get("event") == "heap_settled")
        assert settled["frozen"] > 10_000 and settled["gen0_threshold"] == GEN0_THRESHOLD
    finally:
        stop_daemon(d)
    assert d.proc.returncode == 0


def test_without_strict_readiness_the_server_is_ready_when_it_can_serve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODEL_RUNTIME_DEVICES", "cpu:2x1")
    repo = bad_repository(tmp_path)
    # Triton's syntax for a boolean flag (its QA scripts write it so)
    args = ("--model-repository", str(repo), "--strict-readiness=false", "--exit-on-error=false")
    with running(tmp_path, *args) as d:
        assert d.get("/v2/health/ready") == (200, {"ready": True})
        assert value(d, "alpha") == 1.0
        assert index(d)["corrupt"][0] == "UNAVAILABLE"


# -- reloads under load ---------------------------------------------------------------------


def explicit(repo: Path, *models: str) -> tuple[str, ...]:
    loads = [a for m in models for a in ("--load-model", m)]
    return ("--model-repository", str(repo), "--model-control-mode", "explicit", *loads)


def version(tmp_path: Path, suffix: str, c: float) -> bytes:
    """Version ``c`` of the ``y = x + c`` model as a file of that suffix."""
    return mrx(tmp_path, c) if suffix == ".mrx" else add_const(c).SerializeToString()


@pytest.mark.parametrize("suffix", [".mrx", ".onnx"])  # .onnx: compiled by the reload
async def test_a_good_reload_under_load_fails_no_request(tmp_path: Path, suffix: str) -> None:
    repo = tmp_path / "models"
    repo.mkdir()
    put(repo / f"m{suffix}", version(tmp_path, suffix, 1.0))
    v2 = version(tmp_path, suffix, 2.0)
    with running(tmp_path, *explicit(repo, "m")) as d:
        put(repo / f"m{suffix}", v2)
        load, (status, out), t0, t1 = await reload_under_load(d, "m")
        assert status == 200, out
        assert load.failed() == []
        assert {a.value for a in load.answers if a.end < t0} == {1.0}
        assert {a.value for a in load.answers if a.start > t1} == {2.0}
        assert index(d)["m"] == ("READY", "")
        retired = [e for e in d.events() if e.get("event") == "model_version_retired"]
        assert [e["model"] for e in retired] == ["m"]


async def test_a_bad_reload_under_load_keeps_the_old_version_serving(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    repo.mkdir()
    good = mrx(tmp_path, 1.0)
    put(repo / "m.mrx", good)
    with running(tmp_path, *explicit(repo, "m")) as d:
        put(repo / "m.mrx", good[: len(good) // 2])  # replaced by a truncated file
        load, (status, out), _, _ = await reload_under_load(d, "m")
        assert status == 400 and out["error"].startswith("failed to load 'm': "), out
        assert load.failed() == []
        assert {a.value for a in load.answers} == {1.0}
        state, reason = index(d)["m"]
        assert state == "READY" and "failed to load 'm'" in reason and "still serving" in reason
        assert d.get("/v2/health/ready")[0] == 200
        put(repo / "m.mrx", mrx(tmp_path, 3.0))  # fixed: the next reload takes it
        assert d.post("/v2/repository/models/m/load")[0] == 200
        assert value(d, "m") == 3.0 and index(d)["m"] == ("READY", "")


async def test_a_reload_with_no_free_device_keeps_the_old_version_serving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One device: the new version has nowhere to load beside the old. The wait for a device
    is shortened from its default (10 s) only to keep the test short. The device is exclusive
    (a shared cpu device, the default, would take the new version beside the old)."""
    monkeypatch.setenv("MODEL_RUNTIME_DEVICES", "cpu:1x1:exclusive")
    repo = tmp_path / "models"
    repo.mkdir()
    put(repo / "m.mrx", mrx(tmp_path, 1.0))
    v2 = mrx(tmp_path, 2.0)
    with running(tmp_path, *explicit(repo, "m"), "--reload-device-wait", "0.5") as d:
        put(repo / "m.mrx", v2)
        load, (status, out), t0, t1 = await reload_under_load(d, "m")
        assert status == 503, out
        assert out["error"].startswith("failed to load 'm': no free device after waiting 0.5 s")
        assert "unload the model and load it again" in out["error"]
        assert t1 - t0 >= 0.5
        assert load.failed() == [] and {a.value for a in load.answers} == {1.0}
        assert index(d)["m"][0] == "READY"


async def test_concurrent_reloads_wait_for_the_device_the_other_frees(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three devices, two models: one device is spare. Two reloads at once: one takes the
    spare device, the other waits (boundedly) for the device the first one's old version
    frees as it retires. Both succeed."""
    monkeypatch.setenv("MODEL_RUNTIME_DEVICES", "cpu:3x1")
    repo = tmp_path / "models"
    repo.mkdir()
    for name in ("a", "b"):
        put(repo / f"{name}.mrx", mrx(tmp_path, 1.0))
    v2 = mrx(tmp_path, 2.0)
    with running(tmp_path, *explicit(repo, "a", "b")) as d:
        for name in ("a", "b"):
            put(repo / f"{name}.mrx", v2)
        answers = await asyncio.gather(
            post(d.url("/v2/repository/models/a/load")), post(d.url("/v2/repository/models/b/load"))
        )
        assert [s for s, _ in answers] == [200, 200], answers
        assert value(d, "a") == 2.0 and value(d, "b") == 2.0


# -- model control modes ----------------------------------------------------------------------


def two_models(tmp_path: Path) -> Path:
    repo = tmp_path / "models"
    repo.mkdir()
    put(repo / "one.mrx", mrx(tmp_path, 1.0))
    put(repo / "two.mrx", mrx(tmp_path, 2.0))
    return repo


def test_mode_none_loads_everything_and_refuses_the_repository_api(tmp_path: Path) -> None:
    repo = two_models(tmp_path)
    with running(tmp_path, "--model-repository", str(repo)) as d:
        assert index(d) == {"one": ("READY", ""), "two": ("READY", "")}
        for action in ("load", "unload"):
            status, out = d.post(f"/v2/repository/models/one/{action}")
            # Triton's answer: UNAVAILABLE (503), in its words
            assert (status, out) == (503, {"error": POLLING}), out
        assert value(d, "one") == 1.0 and index(d)["one"] == ("READY", "")


def test_mode_explicit_loads_what_it_is_told(tmp_path: Path) -> None:
    repo = two_models(tmp_path)
    with running(tmp_path, *explicit(repo, "one")) as d:
        assert index(d) == {"one": ("READY", ""), "two": ("UNAVAILABLE", "")}
        assert d.get("/v2/health/ready")[0] == 200  # "two" was not asked for
        assert value(d, "two") == (503, {"error": "model 'two' is UNAVAILABLE"})
        assert d.post("/v2/repository/models/two/load") == (200, {})
        assert value(d, "two") == 2.0
        assert d.post("/v2/repository/models/one/unload") == (200, {})
        assert index(d)["one"] == ("UNAVAILABLE", "unloaded")
        assert d.get("/v2/health/ready")[0] == 200
    with running(tmp_path, *explicit(repo, "*")) as d:
        assert index(d) == {"one": ("READY", ""), "two": ("READY", "")}


def test_load_model_names_an_unknown_model(tmp_path: Path) -> None:
    repo = two_models(tmp_path)
    with pytest.raises(AssertionError, match="exited 2"):
        start_daemon(tmp_path, *explicit(repo, "three"))


async def test_mode_poll_follows_added_changed_and_removed_files(tmp_path: Path) -> None:
    """The poll interval is shortened from its default (15 s) only to keep the test short."""
    repo = tmp_path / "models"
    repo.mkdir()
    put(repo / "m.mrx", mrx(tmp_path, 1.0))
    args = ("--model-repository", str(repo), "--model-control-mode", "poll")
    with running(tmp_path, *args, "--repository-poll-secs", "0.2") as d:
        assert index(d) == {"m": ("READY", "")}
        status, out = d.post("/v2/repository/models/m/load")
        assert (status, out) == (503, {"error": POLLING})
        put(repo / "new.mrx", mrx(tmp_path, 5.0))  # added
        wait_for(lambda: index(d).get("new") == ("READY", ""), 20, "the new model to load")
        assert value(d, "new") == 5.0
        load = Load(d.url("/v2/models/m/infer"))
        task = asyncio.ensure_future(load.run())
        try:
            await asyncio.wait_for(load.wait(30), 30)
            good = mrx(tmp_path, 2.0)
            put(repo / "m.mrx", good[:100])  # changed, to a broken file: the old one serves
            await asyncio.to_thread(
                wait_for, lambda: "failed to load 'm'" in index(d)["m"][1], 20, "the bad reload"
            )
            put(repo / "m.mrx", good)  # changed again, to a good file
            await asyncio.to_thread(wait_for, lambda: value(d, "m") == 2.0, 20, "the reload")
            await asyncio.wait_for(load.wait(30), 30)
        finally:
            load.stop.set()
            await task
        assert load.failed() == [] and {a.value for a in load.answers} <= {1.0, 2.0}
        assert index(d)["m"] == ("READY", "")
        (repo / "new.mrx").unlink()  # removed
        wait_for(lambda: "new" not in index(d), 20, "the removed model to leave the index")
        assert d.get("/v2/models/new/ready")[0] == 400  # unknown again (Triton's code)

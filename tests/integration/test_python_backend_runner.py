"""A python model as the daemon serves it (PythonModelRunner): the batcher, healing instance
processes under load, poison requests, decoupled streams and BLS to other runners. Real
processes, default settings unless a test says why not."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from actors.session.state import ReplicaStatus
from model_runtime import CompileOptions, ModelRunnerConfig, compile_model
from model_runtime.errors import (
    ExecutionTimeoutError,
    InputValidationError,
    ModelLoadError,
    PoisonRequestError,
    PythonModelError,
    RequestTimeoutError,
    RunnerStoppedError,
)
from model_runtime.python_backend.autocomplete import auto_complete_config
from model_runtime.python_backend.messages import BlsRequest, PyResponse
from model_runtime.python_backend.pool import PoolSettings
from model_runtime.python_backend.runner import PythonModelRunner, RequestContext, RunnerSettings
from tests.models import make_add_double
from tests.python_models import config, write_model

pytestmark = pytest.mark.timeout(90)


def _runner(tmp_path: Path, name: str, **kw: Any) -> PythonModelRunner:
    cfg_kw = {k: kw.pop(k) for k in ("max_batch_size", "instances") if k in kw}
    write_model(tmp_path, name)
    return PythonModelRunner(config(name, **cfg_kw), tmp_path / name, 1, **kw)


def _pair(a: float, rows: int | None = None) -> dict[str, np.ndarray]:
    shape = (4,) if rows is None else (rows, 4)
    return {"INPUT0": np.full(shape, a, np.float32), "INPUT1": np.ones(shape, np.float32)}


async def test_add_sub_through_the_runner(tmp_path: Path) -> None:
    runner = _runner(tmp_path, "add_sub")
    await runner.start()
    try:
        assert runner.is_ready
        assert [d.name for d in runner.get_execute_inputs()] == ["INPUT0", "INPUT1"]
        assert runner.get_execute_outputs()[0].shape == (4,)
        out = await runner.execute(_pair(2.0))
        np.testing.assert_array_equal(out["OUTPUT0"], np.full(4, 3.0))
        ctx = RequestContext(requested_outputs=["OUTPUT1"])
        out = await runner.execute(_pair(2.0), context=ctx)
        assert list(out) == ["OUTPUT1"]
        buffer = np.zeros(4, np.float32)
        await runner.execute(_pair(5.0), outputs={"OUTPUT0": buffer})
        np.testing.assert_array_equal(buffer, np.full(4, 6.0))
        counts = await runner.get_monitoring_statistics_total_count(0)
        assert counts["request_monitoring_statistics_count"] == 3
    finally:
        await runner.close()
    assert not runner.is_ready
    assert runner.replica_status() == [ReplicaStatus.STOPPED]
    with pytest.raises(RunnerStoppedError):
        await runner.execute(_pair(1.0))


async def test_submit_queues_at_once_and_its_future_gives_the_outputs(tmp_path: Path) -> None:
    runner = _runner(tmp_path, "add_sub")
    await runner.start()
    try:
        future = runner.submit(_pair(2.0), RequestContext(requested_outputs=["OUTPUT1"]))
        out = await future
        assert list(out) == ["OUTPUT1"]
        np.testing.assert_array_equal(out["OUTPUT1"], np.full(4, 1.0))
        with pytest.raises(InputValidationError, match="input 'INPUT1' is missing"):
            runner.submit({"INPUT0": np.ones(4, np.float32)})  # refused before it is queued
    finally:
        await runner.close()


async def test_then_follows_a_submitted_request_in_the_turn_its_answer_is_read(
    tmp_path: Path,
) -> None:
    # ``then`` sees the settled future before any of its done callbacks (a turn later) runs;
    # a request dropped by its caller never calls it.
    runner = _runner(tmp_path, "add_sub")
    await runner.start()
    try:
        seen: list[str] = []
        future = runner.submit(
            _pair(2.0), then=lambda f: seen.append(f"then {f.result()['OUTPUT0'][0]:g}")
        )
        future.add_done_callback(lambda f: seen.append("done callback"))
        await future
        assert seen == ["then 3", "done callback"]
        dropped = runner.submit(_pair(1.0), then=lambda f: seen.append("dropped"))
        dropped.cancel()
        await runner.execute(_pair(1.0))  # (the dropped one would have been answered by now)
        assert "dropped" not in seen
    finally:
        await runner.close()


async def test_a_submitted_request_past_its_timeout_is_dropped_and_the_model_told(
    tmp_path: Path,
) -> None:
    # The model waits (up to 20 s) until its request is cancelled: told at the timeout, it
    # ends, and the runner closes at once (nothing held, no drain to wait out).
    runner = _runner(tmp_path, "cancellable")
    await runner.start()
    try:
        told: list[BaseException | None] = []
        with pytest.raises(RequestTimeoutError, match=r"gave no answer within 0\.2 s"):
            await runner.submit(
                {"INPUT0": np.ones(1, np.float32)}, timeout=0.2,
                then=lambda f: told.append(f.exception()),
            )  # fmt: skip
        assert len(told) == 1 and isinstance(told[0], RequestTimeoutError)  # then, too
    finally:
        t0 = time.monotonic()
        await runner.close()
    assert time.monotonic() - t0 < 10


@pytest.mark.parametrize(
    ("inputs", "words"),
    [
        ({"INPUT0": np.ones(4, np.float32)}, "input 'INPUT1' is missing"),
        ({**_pair(1.0), "X": np.ones(1)}, "unexpected inference input 'X'"),
        ({"INPUT0": np.ones(4, np.float64), "INPUT1": np.ones(4, np.float32)}, "is 'FP64'"),
        ({"INPUT0": np.ones(5, np.float32), "INPUT1": np.ones(4, np.float32)}, "Expected [4]"),
    ],
)
async def test_inputs_that_do_not_fit_the_config_are_refused(
    tmp_path: Path, inputs: dict[str, np.ndarray], words: str
) -> None:
    runner = _runner(tmp_path, "add_sub")
    await runner.start()
    try:
        with pytest.raises(InputValidationError) as info:
            await runner.execute(inputs)
        assert words in str(info.value)
        await runner.execute(_pair(1.0))  # the model serves on
    finally:
        await runner.close()


async def test_the_batcher_hands_execute_up_to_max_batch_size_requests(tmp_path: Path) -> None:
    runner = _runner(tmp_path, "add_sub", max_batch_size=8)
    await runner.start()
    try:
        # The first request occupies the one instance; the next ten queue and leave in
        # batches of at most 8 (the model answers len(requests) as a parameter).
        sizes: list[int] = []

        async def one(i: int) -> None:
            async for response in runner.stream(_pair(float(i), rows=1)):
                assert response.error is None
                np.testing.assert_array_equal(response.outputs["OUTPUT0"], np.full((1, 4), i + 1))
                sizes.append(int(response.parameters["batch"]))

        await asyncio.gather(*(one(i) for i in range(11)))
        assert max(sizes) == 8 and sum(1 for s in sizes if s > 1) >= 8
    finally:
        await runner.close()


GATED = """
import os, time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.gate = os.path.join(args["model_repository"], "gate")
        self.waits = os.path.join(args["model_repository"], "waits")

    def execute(self, requests):
        x = pb_utils.get_input_tensor_by_name(requests[0], "INPUT0").as_numpy()
        deadline = time.monotonic() + 20
        if x.reshape(-1)[0] == 100:
            open(self.waits, "w").close()
        while x.reshape(-1)[0] == 100 and not os.path.exists(self.gate):
            assert time.monotonic() < deadline, "the test never opened the gate"
            time.sleep(0.002)
        return [pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor(
                "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())],
            parameters={"batch": len(requests)}) for r in requests]
"""


async def test_a_busy_instance_runs_the_batches_that_waited_in_one_execute(
    tmp_path: Path,
) -> None:
    # Triton's dynamic batcher hands a busy instance's next execute what queued meanwhile: here
    # three requests sent one by one (three frames) while the model's execute of a first one
    # waits at a gate; they run in executes of at most max_batch_size (2) requests.
    write_model(tmp_path, "gated", source=GATED)
    runner = PythonModelRunner(config("gated", max_batch_size=2), tmp_path / "gated", 1)
    await runner.start()
    instance = runner.pool.slots[0].instance
    assert instance is not None
    try:

        async def one(x: float) -> int:
            (response,) = [
                r async for r in runner.stream({"INPUT0": np.full((1, 1), x, np.float32)})
            ]
            assert response.error is None and response.outputs["OUTPUT0"][0, 0] == x
            return int(response.parameters["batch"])

        tasks = [asyncio.create_task(one(100.0))]
        deadline = time.monotonic() + 20
        while not (tmp_path / "gated" / "waits").exists():
            assert time.monotonic() < deadline, "the first request never reached the model"
            await asyncio.sleep(0.002)
        for held, x in enumerate([1.0, 2.0, 3.0], 2):
            tasks.append(asyncio.create_task(one(x)))
            while instance.held < held:  # noqa: ASYNC110 - sent at the end of a turn
                await asyncio.sleep(0)  # each request in a frame of its own
        (tmp_path / "gated" / "gate").touch()
        assert await asyncio.gather(*tasks) == [1, 2, 2, 1]
    finally:
        await runner.close()


async def test_sigkill_of_an_instance_under_load_loses_no_request(tmp_path: Path) -> None:
    runner = _runner(tmp_path, "add_sub", instances=2)
    await runner.start()
    failures: list[BaseException] = []
    answered = 0
    not_ready = 0
    stop = asyncio.Event()

    async def caller(i: int) -> None:
        nonlocal answered
        while not stop.is_set():
            try:
                out = await runner.execute(_pair(float(i)))
                np.testing.assert_array_equal(out["OUTPUT0"], np.full(4, i + 1.0))
                answered += 1
            except Exception as exc:  # counted: the test's claim is that there are none
                failures.append(exc)

    async def watch() -> None:
        nonlocal not_ready
        while not stop.is_set():
            not_ready += not runner.is_ready
            await asyncio.sleep(0.005)

    try:
        tasks = [asyncio.create_task(caller(i)) for i in range(8)] + [asyncio.create_task(watch())]
        await asyncio.sleep(0.5)
        victim = runner.pool.slots[0].instance
        assert victim is not None and victim.pid is not None
        changed = runner.replica_states()[0].changed  # what the daemon's readiness log awaits
        runs = runner.replica_states()[0].runs
        os.kill(victim.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        while runner.pool.slots[0].status is not ReplicaStatus.READY or (
            runner.pool.slots[0].instance is victim
        ):
            assert time.monotonic() - killed_at < 5.0, "no new instance within 5 s"
            await asyncio.sleep(0.01)
        served_before = (await runner.get_monitoring_statistics_total_count(0))[
            "request_monitoring_statistics_count"
        ]
        while (await runner.get_monitoring_statistics_total_count(0))[
            "request_monitoring_statistics_count"
        ] == served_before:
            assert time.monotonic() - killed_at < 5.0, "the new instance served nothing in 5 s"
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)
        stop.set()
        await asyncio.gather(*tasks)
    finally:
        stop.set()
        await runner.close()
    assert failures == []
    assert not_ready == 0
    assert answered > 50
    assert runner.restarts == 1
    assert changed.is_set()  # the instance's state changed (FAILED, then READY)
    assert runner.replica_states()[0].runs > runs  # its executes count on over the restart


@pytest.mark.parametrize("max_batch_size", [0, 8])
async def test_a_poison_request_alone_gets_an_error_after_two_kills(
    tmp_path: Path, max_batch_size: int
) -> None:
    # With batches, the poison request takes its batch's other requests down once; they are
    # then tried alone, and only the poison request kills again.
    runner = _runner(tmp_path, "add_sub", instances=2, max_batch_size=max_batch_size)
    rows = 1 if max_batch_size else None
    await runner.start()
    try:
        others = [asyncio.ensure_future(runner.execute(_pair(float(i), rows))) for i in range(20)]
        with pytest.raises(PoisonRequestError) as info:
            await runner.execute(_pair(-13.0, rows))
        assert "died twice" in str(info.value) and "exited with code 3" in str(info.value)
        for i, other in enumerate(others):
            out = (await other)["OUTPUT0"]
            np.testing.assert_array_equal(out.reshape(4), np.full(4, i + 1.0))
        assert runner.restarts == 2
        await runner.execute(_pair(1.0, rows))
    finally:
        await runner.close()


async def test_model_errors_are_that_requests_errors(tmp_path: Path) -> None:
    runner = _runner(tmp_path, "raises")
    await runner.start()
    try:
        with pytest.raises(PythonModelError, match="seven is refused") as info:
            await runner.execute({"INPUT0": np.array([7.0], np.float32)})
        assert info.value.code == "INVALID_ARG"
        out = await runner.execute({"INPUT0": np.array([1.0], np.float32)})
        np.testing.assert_array_equal(out["OUTPUT0"], [2.0])
    finally:
        await runner.close()


async def test_a_model_that_does_not_load_fails_start(tmp_path: Path) -> None:
    runner = _runner(tmp_path, "init_raises", instances=2)
    with pytest.raises(ModelLoadError, match="initialize: the weights are missing"):
        await runner.start()


async def test_a_decoupled_model_streams_through_the_runner(tmp_path: Path) -> None:
    runner = _runner(tmp_path, "repeat")
    await runner.start()
    try:
        got = [r async for r in runner.stream({"IN": np.array([3, 1, 2], np.int32)})]
        assert [int(r.outputs["OUT"][0]) for r in got if r.outputs] == [3, 1, 2]
        assert got[-1].final and not any(r.final for r in got[:-1])
        with pytest.raises(InputValidationError, match="is decoupled"):
            await runner.execute({"IN": np.array([1], np.int32)})
    finally:
        await runner.close()


async def test_bls_from_a_python_model_to_another_python_model(tmp_path: Path) -> None:
    target = _runner(tmp_path, "add_sub")

    async def infer(request: BlsRequest) -> PyResponse:
        assert request.model_name == "add_sub"
        outputs = await target.execute(
            request.inputs, context=RequestContext(requested_outputs=request.requested_outputs)
        )
        return PyResponse(outputs)

    caller = _runner(tmp_path, "bls", infer_hook=infer)
    await target.start()
    await caller.start()
    try:
        params = {"target": "add_sub", "async": True}
        out = await caller.execute(_pair(4.0), context=RequestContext(parameters=params))
        np.testing.assert_array_equal(out["OUTPUT0"], np.full(4, 5.0))
    finally:
        await caller.close()
        await target.close()


async def test_bls_from_a_python_model_to_an_onnx_model(tmp_path: Path) -> None:
    from model_runtime import ModelRunner

    path = compile_model(make_add_double(), tmp_path / "a.mrx", CompileOptions(batch_size=4))
    async with ModelRunner(path, ModelRunnerConfig(batching_dim=0, timeout=0.002)) as onnx:

        async def infer(request: BlsRequest) -> PyResponse:
            outputs = await onnx.execute(request.inputs)
            return PyResponse({k: v for k, v in outputs.items() if k in request.requested_outputs})

        caller = _runner(tmp_path, "bls_onnx", infer_hook=infer)
        await caller.start()
        try:
            outs = await asyncio.gather(
                *(caller.execute({"INPUT0": np.full(4, i, np.float32)}) for i in range(6))
            )
            for i, out in enumerate(outs):
                np.testing.assert_array_equal(out["OUTPUT0"], i + np.arange(1, 5))
        finally:
            await caller.close()


async def test_a_stalled_instance_is_killed_by_the_watchdog(tmp_path: Path) -> None:
    # A short watchdog (the default is a minute) so that the test does not wait for it.
    settings = RunnerSettings(pool=PoolSettings(watchdog_s=0.5))
    runner = _runner(tmp_path, "hangs", instances=2, settings=settings)
    await runner.start()
    try:
        with pytest.raises(PoisonRequestError, match="killed by the watchdog"):
            await runner.execute({"INPUT0": np.array([-1.0], np.float32)})
        out = await runner.execute({"INPUT0": np.array([2.0], np.float32)})
        np.testing.assert_array_equal(out["OUTPUT0"], [2.0])
        assert runner.restarts == 2 and runner.is_ready
    finally:
        await runner.close()


async def test_a_caller_timeout_is_its_own(tmp_path: Path) -> None:
    runner = _runner(tmp_path, "async")
    await runner.start()
    try:
        with pytest.raises(ExecutionTimeoutError):
            await runner.execute({"INPUT0": np.array([5.0], np.float32)}, timeout=0.2)
        out = await runner.execute({"INPUT0": np.array([0.0], np.float32)})
        assert out["PEAK"].dtype == np.int32
    finally:
        await runner.close()


async def test_auto_complete_config_in_a_short_lived_process(tmp_path: Path) -> None:
    write_model(tmp_path, "auto_complete")
    completed = await auto_complete_config(tmp_path / "auto_complete", 1, {})
    assert completed["name"] == "auto_complete" and completed["max_batch_size"] == 8
    assert [o["name"] for o in completed["output"]] == ["OUTPUT0"]


async def _unused(_: BlsRequest) -> AsyncIterator[PyResponse]:  # keeps the hook type honest
    yield PyResponse()


async def test_close_answers_what_outlives_the_drain(tmp_path: Path) -> None:
    # A short drain (the default is 30 s) so that the test does not wait for it.
    settings = RunnerSettings(drain_timeout_s=0.3)
    runner = _runner(tmp_path, "async", settings=settings)
    await runner.start()
    slow = asyncio.ensure_future(runner.execute({"INPUT0": np.array([30.0], np.float32)}))
    await asyncio.sleep(0.1)
    await asyncio.wait_for(runner.close(), 40)
    with pytest.raises(RunnerStoppedError, match="unloaded before this request completed"):
        await asyncio.wait_for(slow, 5)


async def test_model_ready_asks_the_models_is_ready(tmp_path: Path) -> None:
    runner = _runner(tmp_path, "lifecycle", instances=2)
    await runner.start()
    try:
        assert await runner.model_ready()
        (tmp_path / "lifecycle" / "not_ready").write_text("")
        assert not await runner.model_ready()
        assert runner.is_ready  # the processes serve; only the model says it is not ready
    finally:
        await runner.close()
    assert not await runner.model_ready()


@pytest.mark.parametrize(("max_batch_size", "instances", "held"), [(0, 1, 65), (32, 2, 288)])
async def test_capacity_is_what_the_instances_hold_when_busy(
    tmp_path: Path, max_batch_size: int, instances: int, held: int
) -> None:
    # The daemon's admission floor (DataPlane._capacity): a floor under a full batch per
    # instance would refuse 64 closed-loop clients of a model that batches 32 on a busy host.
    runner = _runner(tmp_path, "add_sub", max_batch_size=max_batch_size, instances=instances)
    # PIPELINE (4) full batches per instance, or PIPELINE_SINGLE (64) requests without
    # batching; and one batch filling
    assert runner.capacity == held


TAKES = """
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        x = pb_utils.get_input_tensor_by_name(requests[0], "INPUT0").as_numpy()
        end = time.perf_counter() + float(x.reshape(-1)[0])
        while time.perf_counter() < end:  # busy, as a model computing is
            pass
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)])]
"""


async def test_an_answer_does_not_wait_for_the_next_batch_to_run(tmp_path: Path) -> None:
    # The instance holds the end of a batch to send it with the next one's only when that
    # next one would end soon (quick executes: add_sub at c=64); a batch of 0.3 ms is not
    # quick, so its answer leaves before the next batch (1 s) runs, not after it.
    write_model(tmp_path, "takes", source=TAKES)
    runner = PythonModelRunner(config("takes"), tmp_path / "takes", 1)
    await runner.start()
    try:
        quick = runner.submit({"INPUT0": np.full(1, 0.0003, np.float32)})
        slow = runner.submit({"INPUT0": np.full(1, 1.0, np.float32)})
        done, _ = await asyncio.wait([quick, slow], return_when=asyncio.FIRST_COMPLETED)
        assert quick in done and not slow.done()
        assert float((await slow)["OUTPUT0"][0]) == 1.0
    finally:
        await runner.close()

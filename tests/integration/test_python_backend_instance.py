"""One python model instance in its own process, as the daemon drives it (real subprocesses,
real ``model.py`` files): Triton's life cycle and API, typed errors for what a model does wrong,
and a typed error that says how an instance died for what it held."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from model_runtime.errors import InstanceCrashedError, ModelLoadError
from model_runtime.python_backend.instance import InstanceProcess, InstanceSpec
from model_runtime.python_backend.messages import BlsRequest, PyRequest, PyResponse
from tests.python_models import config, write_model

pytestmark = pytest.mark.timeout(60)


def _spec(tmp_path: Path, name: str, **kw: Any) -> InstanceSpec:
    path = write_model(tmp_path, name)
    return InstanceSpec(name, 1, path, config(name), f"{name}_0_0", **kw)


def _add_sub(a: float, b: float = 1.0) -> PyRequest:
    x = np.full(4, a, np.float32)
    return PyRequest({"INPUT0": x, "INPUT1": np.full(4, b, np.float32)})


async def _started(spec: InstanceSpec) -> InstanceProcess:
    instance = InstanceProcess(spec)
    await instance.start()
    return instance


async def test_add_sub_answers_each_request_of_a_batch_in_order(tmp_path: Path) -> None:
    instance = await _started(_spec(tmp_path, "add_sub"))
    try:
        answers = await instance.execute([_add_sub(1.0), _add_sub(5.0, 2.0)])
        assert [a.error for a in answers] == [None, None]
        np.testing.assert_array_equal(answers[0].outputs["OUTPUT0"], np.full(4, 2.0))
        np.testing.assert_array_equal(answers[1].outputs["OUTPUT1"], np.full(4, 3.0))
        assert answers[0].outputs["OUTPUT0"].dtype == np.float32
        assert answers[1].parameters == {"batch": 2}
        only = PyRequest(_add_sub(1.0).inputs, requested_outputs=["OUTPUT1"])
        (answer,) = await instance.execute([only])
        assert list(answer.outputs) == ["OUTPUT1"]
    finally:
        await instance.stop()
    assert instance.process is not None and instance.process.returncode == 0


async def test_tensors_larger_than_the_ring_travel_inline(tmp_path: Path) -> None:
    instance = await _started(_spec(tmp_path, "add_sub", ring_bytes=4096))
    try:
        # 8 MB frames each way: several reads of the socket make one frame
        big = np.arange(4 * 250_000, dtype=np.float32).reshape(250_000, 4)
        for _ in range(3):  # the ring refills and wraps between the small ones
            small, large = await instance.execute(
                [_add_sub(2.0), PyRequest({"INPUT0": big, "INPUT1": big})]
            )
            np.testing.assert_array_equal(small.outputs["OUTPUT0"], np.full(4, 3.0))
            np.testing.assert_array_equal(large.outputs["OUTPUT0"], big * 2)
    finally:
        await instance.stop()


async def test_the_model_gets_triton_args_and_its_request_fields(tmp_path: Path) -> None:
    instance = await _started(_spec(tmp_path, "lifecycle"))
    try:
        words = np.array([b"a", "b\u00e9".encode()], dtype=object)
        (answer,) = await instance.execute(
            [PyRequest({"WORDS": words}, parameters={"what": "args"})]
        )
        args = json.loads(answer.outputs["TEXT"][0])
        assert json.loads(args["model_config"])["name"] == "lifecycle"
        assert args["model_name"] == "lifecycle" and args["model_version"] == "1"
        assert args["model_instance_kind"] == "CPU" and args["model_instance_device_id"] == "0"
        assert args["model_instance_name"] == "lifecycle_0_0"
        assert args["model_repository"] == str(tmp_path / "lifecycle")
        request = PyRequest(
            {"WORDS": words}, ["TEXT"], request_id="r-1", correlation_id=42, flags=1,
            parameters={"what": "fields"},
        )  # fmt: skip
        (answer,) = await instance.execute([request])
        fields = json.loads(answer.outputs["TEXT"][0])
        assert fields == {"id": "r-1", "corr": 42, "flags": 1, "outputs": ["TEXT"]}
        (answer,) = await instance.execute(
            [PyRequest({"WORDS": words}, parameters={"what": "strings"})]
        )
        assert answer.outputs["TEXT"][0] == "a|b\u00e9".encode()
    finally:
        await instance.stop()
    assert (tmp_path / "lifecycle" / "finalized").read_text() == "yes"


async def test_custom_metrics_are_held_by_the_daemon(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "lifecycle")
    instance = await _started(spec)
    words = np.array([b"x"], dtype=object)
    try:
        for _ in range(3):
            await instance.execute([PyRequest({"WORDS": words}, parameters={"what": "args"})])
        (answer,) = await instance.execute(
            [PyRequest({"WORDS": words}, parameters={"what": "metric"})]
        )
        assert answer.error is None, answer.error
        assert answer.outputs["TEXT"][0] == b"4.0"
        assert spec.metrics.value("requests_seen", {"model": "lifecycle"}) == 4.0
        assert spec.metrics.families["requests_seen"].kind == "COUNTER"
    finally:
        await instance.stop()


async def test_is_ready_asks_the_model(tmp_path: Path) -> None:
    instance = await _started(_spec(tmp_path, "lifecycle"))
    try:
        assert await instance.is_ready()
        (tmp_path / "lifecycle" / "not_ready").write_text("")
        assert not await instance.is_ready()
    finally:
        await instance.stop()


async def test_errors_of_the_model_are_that_requests_errors(tmp_path: Path) -> None:
    instance = await _started(_spec(tmp_path, "raises"))

    def x(v: float) -> PyRequest:
        return PyRequest({"INPUT0": np.array([v], np.float32)})

    try:
        failed = await instance.execute([x(-1.0), x(1.0)])
        for answer in failed:
            assert answer.error is not None and answer.error.code == "INTERNAL"
            assert "ValueError: negative input" in str(answer.error)
            assert "model.py, line" in str(answer.error)
        fine, refused, not_response, not_tensor = await instance.execute(
            [x(1.0), x(7.0), x(8.0), x(9.0)]
        )
        np.testing.assert_array_equal(fine.outputs["OUTPUT0"], [2.0])
        assert refused.error is not None and refused.error.code == "INVALID_ARG"
        assert str(refused.error) == "seven is refused"
        assert "returned a str for request 2" in str(not_response.error)
        assert "not a pb_utils.Tensor" in str(not_tensor.error)
    finally:
        await instance.stop()


async def test_the_wrong_count_fails_every_request_of_the_batch(tmp_path: Path) -> None:
    instance = await _started(_spec(tmp_path, "wrong_count"))
    try:
        answers = await instance.execute(
            [PyRequest({"INPUT0": np.ones(1, np.float32)}) for _ in range(2)]
        )
        assert [str(a.error) for a in answers] == [
            "execute returned 0 responses for 2 requests"
        ] * 2
    finally:
        await instance.stop()


@pytest.mark.parametrize(
    ("name", "words"),
    [
        (
            "broken_import",
            "import: ModuleNotFoundError: No module named 'a_module_that_does_not_exist'",
        ),
        ("init_raises", "initialize: the weights are missing"),
    ],
)
async def test_a_model_that_does_not_load_is_a_load_error(
    tmp_path: Path, name: str, words: str
) -> None:
    instance = InstanceProcess(_spec(tmp_path, name))
    with pytest.raises(ModelLoadError) as info:
        await instance.start()
    assert str(info.value).startswith(f"failed to load '{name}': {words}")
    assert instance.process is not None and instance.process.returncode == 0


async def test_an_instance_that_exits_fails_what_it_held_with_its_exit_code(
    tmp_path: Path,
) -> None:
    instance = await _started(_spec(tmp_path, "exits"))
    with pytest.raises(InstanceCrashedError) as info:
        await instance.execute([PyRequest({"INPUT0": np.ones(1, np.float32)})])
    assert "exited with code 3" in str(info.value) and info.value.returncode == 3
    with pytest.raises(InstanceCrashedError):
        instance.submit([PyRequest({"INPUT0": np.ones(1, np.float32)})])


async def test_a_killed_instance_fails_what_it_held_with_the_signal(tmp_path: Path) -> None:
    instance = await _started(_spec(tmp_path, "async"))
    pending = asyncio.ensure_future(
        instance.execute([PyRequest({"INPUT0": np.array([30.0], np.float32)})])
    )
    await asyncio.sleep(0.2)
    assert instance.pid is not None
    os.kill(instance.pid, signal.SIGKILL)
    with pytest.raises(InstanceCrashedError, match="killed by signal SIGKILL"):
        await pending


async def test_async_execute_runs_many_batches_at_once(tmp_path: Path) -> None:
    instance = await _started(_spec(tmp_path, "async"))
    try:
        calls = [
            instance.execute([PyRequest({"INPUT0": np.array([0.3], np.float32)})]) for _ in range(4)
        ]
        answers = await asyncio.gather(*calls)
        assert max(int(a[0].outputs["PEAK"][0]) for a in answers) == 4
    finally:
        await instance.stop()


async def test_a_decoupled_model_streams_from_its_own_threads(tmp_path: Path) -> None:
    instance = await _started(_spec(tmp_path, "repeat"))
    try:
        values = np.array([5, 6, 7], np.int32)
        got = [r async for r in instance.stream(PyRequest({"IN": values}))]
        assert [int(r.outputs["OUT"][0]) for r in got[:3]] == [5, 6, 7]
        assert [int(r.outputs["IDX"][0]) for r in got[:3]] == [0, 1, 2]
        assert [r.final for r in got] == [False, False, False, True]
        assert got[3].outputs == {}
        empty = [r async for r in instance.stream(PyRequest({"IN": np.zeros(0, np.int32)}))]
        assert len(empty) == 1 and empty[0].final
    finally:
        await instance.stop()


async def _add_hook(request: BlsRequest) -> PyResponse:
    if request.model_name != "adder":
        raise LookupError(f"no model {request.model_name!r}")
    total = request.inputs["INPUT0"] + request.inputs["INPUT1"]
    return PyResponse({"OUTPUT0": total})


@pytest.mark.parametrize(
    ("name", "use_async"), [("bls", False), ("bls", True), ("bls_sync", False)]
)
async def test_bls_calls_come_back_through_the_hook(
    tmp_path: Path, name: str, use_async: bool
) -> None:
    instance = await _started(_spec(tmp_path, name, hooks_infer=_add_hook))
    try:
        inputs = _add_sub(3.0, 4.0).inputs
        params = {"target": "adder", "async": use_async}
        (answer,) = await instance.execute([PyRequest(inputs, parameters=params)])
        np.testing.assert_array_equal(answer.outputs["OUTPUT0"], np.full(4, 7.0))
        params = {"target": "nothing", "async": use_async}
        (answer,) = await instance.execute([PyRequest(inputs, parameters=params)])
        assert answer.error is not None and "no model 'nothing'" in str(answer.error)
    finally:
        await instance.stop()


async def test_bls_of_a_decoupled_model_iterates_its_responses(tmp_path: Path) -> None:
    repeat = await _started(_spec(tmp_path, "repeat"))

    async def hook(request: BlsRequest) -> Any:
        assert request.decoupled and request.model_name == "repeat"
        async for response in repeat.stream(PyRequest(request.inputs)):
            yield response

    caller = await _started(_spec(tmp_path, "bls_decoupled", hooks_infer=hook))
    try:
        (answer,) = await caller.execute([PyRequest({"IN": np.array([1, 2, 3, 4], np.int32)})])
        assert answer.error is None, answer.error
        assert int(answer.outputs["SUM"][0]) == 10 and int(answer.outputs["COUNT"][0]) == 4
    finally:
        await caller.stop()
        await repeat.stop()


async def test_auto_complete_runs_the_models_own_function(tmp_path: Path) -> None:
    path = write_model(tmp_path, "auto_complete")
    bare = {"name": "auto_complete", "backend": "python", "input": [], "output": []}
    instance = InstanceProcess(InstanceSpec("auto_complete", 1, path, bare))
    completed = await instance.start(initialize=False, auto_complete=True)
    assert completed["max_batch_size"] == 8
    assert completed["input"] == [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}]
    assert completed["dynamic_batching"] == {}
    assert instance.process is not None and instance.process.returncode == 0


async def test_the_model_loading_api_reaches_the_control_hook(tmp_path: Path) -> None:
    asked: list[tuple[str, dict[str, Any]]] = []

    async def control(op: str, args: dict[str, Any]) -> Any:
        asked.append((op, args))
        return True

    instance = await _started(_spec(tmp_path, "lifecycle", hooks_control=control))
    try:
        words = np.array([b"x"], dtype=object)
        (answer,) = await instance.execute(
            [PyRequest({"WORDS": words}, parameters={"what": "ready"})]
        )
        assert answer.outputs["TEXT"][0] == b"True"
        assert asked == [("is_model_ready", {"model_name": "other", "model_version": "1"})]
    finally:
        await instance.stop()


@pytest.mark.parametrize("name", ["cancellable", "cancellable_async"])
async def test_a_cancelled_request_is_seen_by_the_model(tmp_path: Path, name: str) -> None:
    instance = await _started(_spec(tmp_path, name))
    try:
        (call,) = instance.submit([PyRequest({"INPUT0": np.ones(1, np.float32)})])
        await asyncio.sleep(0.1)
        instance.cancel([call])
        assert call.future is not None
        answer = await asyncio.wait_for(call.future, 10)
        assert answer.error is not None and answer.error.code == "CANCELLED"
    finally:
        await instance.stop()


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


async def test_cancels_that_cross_their_final_response_are_not_kept(tmp_path: Path) -> None:
    """A cancel can cross its request's final response on the wire; over a long run such
    cancels (a million here) must not pile up in the instance."""
    instance = await _started(_spec(tmp_path, "add_sub"))
    try:
        await instance.execute([_add_sub(1.0)])
        assert instance.pid is not None
        before = _rss_bytes(instance.pid)
        stale = 10**9  # keys never given to a request: finished long ago, as far as it knows
        for _ in range(20):
            instance.send({"t": "cancel", "k": list(range(stale, stale + 50_000))})
            stale += 50_000
        (answer,) = await instance.execute([_add_sub(2.0)])  # after every cancel frame
        assert answer.error is None
        grown = _rss_bytes(instance.pid) - before
        assert grown < 16 * 2**20, f"the instance grew {grown / 2**20:.0f} MiB"
    finally:
        await instance.stop()


def _interpreter_with_numpy() -> str | None:
    """The daemon's base interpreter (not its venv), if it has numpy: it lacks the daemon's
    own packages (structlog, ...), which the instance process must not need."""
    import subprocess
    import sys

    base = Path(sys.base_prefix) / "bin" / "python3"
    probe = subprocess.run([str(base), "-c", "import numpy"], capture_output=True, check=False)
    return str(base) if probe.returncode == 0 else None


async def test_an_instance_runs_in_another_interpreter(tmp_path: Path) -> None:
    python = _interpreter_with_numpy()
    if python is None:
        pytest.skip("the base interpreter has no numpy")
    instance = await _started(_spec(tmp_path, "add_sub", python=python))
    try:
        (answer,) = await instance.execute([_add_sub(1.0)])
        np.testing.assert_array_equal(answer.outputs["OUTPUT0"], np.full(4, 2.0))
    finally:
        await instance.stop()


async def test_an_interpreter_without_numpy_is_a_load_error_that_says_so(tmp_path: Path) -> None:
    import subprocess
    import sys

    venv = tmp_path / "bare"
    command = [sys.executable, "-m", "venv", "--without-pip", str(venv)]
    await asyncio.to_thread(subprocess.run, command, check=True)
    instance = InstanceProcess(_spec(tmp_path, "add_sub", python=str(venv / "bin" / "python")))
    with pytest.raises(ModelLoadError, match="cannot import numpy: No module named 'numpy'"):
        await instance.start()
    missing = InstanceProcess(_spec(tmp_path, "add_sub", python=str(tmp_path / "no-python")))
    with pytest.raises(ModelLoadError, match="cannot start python"):
        await missing.start()

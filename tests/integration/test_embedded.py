"""The embedded application runtime (seed 000): named engines, startup inputs, calls."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from model_runtime import embedded
from model_runtime.compiler import CompileOptions, compile_model
from model_runtime.embedded import (
    EngineConflictError,
    embedded_runtime_call,
    embedded_runtime_call_sync,
    embedded_runtime_start,
    embedded_runtime_start_sync,
    embedded_runtime_stop,
)
from model_runtime.errors import InputValidationError, RunnerStoppedError

pytestmark = pytest.mark.timeout(120)


def _scaler(op: str = "Mul") -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    out = helper.make_tensor_value_info("output", TensorProto.FLOAT, [4])
    factor = numpy_helper.from_array(np.ones(4, np.float32), "factor")
    graph = helper.make_graph(
        [helper.make_node(op, ["x", "factor"], ["output"])], f"scaler_{op}", [x], [out], [factor]
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


@pytest.fixture(scope="module")
def executables(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("embedded")
    opts = CompileOptions(batch_size=4, device_iterations=16, variables=("factor",))
    return {
        "mul": compile_model(_scaler("Mul"), tmp / "mul.mrx", opts),
        "add": compile_model(_scaler("Add"), tmp / "add.mrx", opts),
    }


@pytest.fixture(autouse=True)
def _private_devices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("MODEL_RUNTIME_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("MODEL_RUNTIME_DEVICES", "cpu:2x1")
    yield
    embedded_runtime_stop()


def _twos() -> list[np.ndarray]:
    return [np.full(4, 2.0, np.float32)]


async def test_seed_example_doubles_each_call(executables: dict[str, Path]) -> None:
    ctx = await embedded_runtime_start(executables["mul"], _twos(), "doubler")
    assert ctx.name == "doubler"
    assert [(d.name, d.shape, d.dtype) for d in ctx.signature] == [("x", (4,), np.float32)]
    assert [(d.name, d.shape) for d in ctx.output_types] == [("output", (4,))]
    for i in range(16):
        (out,) = await embedded_runtime_call([np.ones(4, np.float32) * i], ctx)
        np.testing.assert_array_equal(out, np.full(4, 2.0 * i))


async def test_concurrent_calls_share_a_run_and_get_their_own_rows(
    executables: dict[str, Path],
) -> None:
    ctx = await embedded_runtime_start(
        executables["mul"], {"factor": np.full(4, 3.0, np.float32)}, "tripler", timeout=5.0
    )
    # 16 concurrent calls fill one main run (16 device iterations) well before the 5 s flush.
    results = await asyncio.wait_for(
        asyncio.gather(
            *(embedded_runtime_call({"x": np.full(4, i, np.float32)}, ctx) for i in range(16))
        ),
        timeout=4.0,
    )
    for i, (out,) in enumerate(results):
        np.testing.assert_array_equal(out, np.full(4, 3.0 * i))


def test_engine_outlives_its_caller_and_serves_sync_threads(executables: dict[str, Path]) -> None:
    async def start() -> embedded.RuntimeContext:
        return await embedded_runtime_start(executables["mul"], _twos(), "long-lived")

    ctx = asyncio.run(start())  # that event loop is gone now; the engine is not
    outs: dict[int, np.ndarray] = {}

    def worker(i: int) -> None:
        (outs[i],) = embedded_runtime_call_sync([np.full(4, i, np.float32)], ctx, timeout=30)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(outs) == [0, 1, 2, 3]
    for i, out in outs.items():
        np.testing.assert_array_equal(out, np.full(4, 2.0 * i))


def test_same_name_reuses_the_engine_and_refuses_another_executable(
    executables: dict[str, Path],
) -> None:
    first = embedded_runtime_start_sync(executables["mul"], _twos(), "shared")
    engine = embedded._engines["shared"]
    again = embedded_runtime_start_sync(executables["mul"], _twos(), "shared")
    assert again == first and embedded._engines["shared"] is engine
    with pytest.raises(EngineConflictError, match=r"already runs another executable.*stop it"):
        embedded_runtime_start_sync(executables["add"], _twos(), "shared")
    (out,) = embedded_runtime_call_sync([np.ones(4, np.float32)], first)
    np.testing.assert_array_equal(out, np.full(4, 2.0))
    embedded_runtime_stop("shared")
    with pytest.raises(RunnerStoppedError, match="start it again"):
        embedded_runtime_call_sync([np.ones(4, np.float32)], first)


@pytest.mark.parametrize(
    ("startup", "message"),
    [
        ({"scale": np.ones(4, np.float32)}, r"unknown: \['scale'\].*missing: \['factor'\]"),
        ([], r"0 startup inputs given.*1 variables \['factor'\]"),
        ([np.ones(3, np.float32)], r"'factor' is float32\[3\], the variable is float32\[4\]"),
        ([np.ones(4, np.float64)], r"float64\[4\].*cast it with .astype\(np.float32\)"),
    ],
)
def test_bad_startup_inputs_are_refused(
    executables: dict[str, Path], startup: object, message: str
) -> None:
    with pytest.raises(InputValidationError, match=message):
        embedded_runtime_start_sync(executables["mul"], startup, "bad")  # type: ignore[arg-type]
    assert "bad" not in embedded._engines


def test_engines_and_blocking_runners_share_one_portal_and_one_tree(
    executables: dict[str, Path],
) -> None:
    """No hand-made loop threads: every synchronous entry point lives on the shared portal,
    under the one runtime root of its loop."""
    from model_runtime.blocking import BlockingModelRunner, run_in_portal, shared_portal
    from supervisor import Runtime

    ctx = embedded_runtime_start_sync(executables["mul"], _twos(), "portal-a")
    try:
        with BlockingModelRunner(executables["add"]) as blocking:
            engine = embedded._engines["portal-a"]

            async def roots() -> tuple[object, int]:
                root = Runtime.running()
                assert root is not None
                return root, len(root.models())

            _, models = run_in_portal(roots)
            assert models == 2, "the engine's model and the blocking runner's, in one tree"
            assert blocking.runner._loop is engine.runner._loop
            assert blocking.runner._loop is not None
            assert shared_portal() is shared_portal()
        embedded_runtime_call_sync(_twos(), ctx)
    finally:
        embedded_runtime_stop("portal-a")


def test_a_mutable_variable_passed_once_counts_across_calls(tmp_path: Path) -> None:
    """Seed 000's point of start/call: the variable given at start lives on the device and
    each call updates it; a call returns the model's outputs (not the variable's update)."""
    from tests.models import make_counter

    opts = CompileOptions(
        batch_size=2, variables=("count",), variable_updates={"count_next": "count"}
    )
    path = compile_model(make_counter(width=4), tmp_path / "counter.mrx", opts)
    ctx = embedded_runtime_start_sync(path, [np.array([10.0], np.float32)], "counter")
    assert [d.name for d in ctx.output_types] == ["y"]
    x = np.zeros((2, 4), np.float32)
    got = [embedded_runtime_call_sync([x], ctx)[0] for _ in range(3)]
    assert [float(g[0, 0]) for g in got] == [10.0, 11.0, 12.0]

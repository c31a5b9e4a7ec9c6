"""Custom ops end to end (seed 002): the rotate example, the expression op, the allow-list at
load, hashability for the cache, kernel errors at run time. Through the compiler, the runner
and the cpu backend."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from structlog.testing import capture_logs

import model_runtime.connection as mrc
from model_runtime import custom_ops
from model_runtime.compiler import CompileOptions, compile_model
from model_runtime.custom_ops import expression
from model_runtime.errors import (
    ApplicationRuntimeError,
    CompileError,
    CustomOpError,
    ModelRuntimeError,
)
from model_runtime.executable import CustomOpRef, Executable
from model_runtime.runner import ModelRunner, ModelRunnerConfig

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
ROTATE = "tests.custom_op_libs.rotate_op"
BROKEN = "tests.custom_op_libs.broken_ops"


@pytest.fixture(autouse=True)
def _allow(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(custom_ops.ALLOW_ENV, raising=False)
    custom_ops.set_allowed_libraries([ROTATE, BROKEN])
    yield
    custom_ops.set_allowed_libraries([])


def _model(
    nodes: list[onnx.NodeProto],
    ins: list[str],
    outs: list[str],
    domains: list[str],
    dims: list[int],
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "custom",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, dims) for n in ins],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, dims) for n in outs],
    )
    opsets = [helper.make_opsetid("", 17), *(helper.make_opsetid(d, 1) for d in domains)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def _rotate_model() -> onnx.ModelProto:
    node = helper.make_node("Rotate", ["x", "y", "angle"], ["rx", "ry"], domain=ROTATE)
    return _model([node], ["x", "y", "angle"], ["rx", "ry"], [ROTATE], [4])


def _cause(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    """``exc`` or the first of its causes that is a ``kind`` (the runner may wrap start errors)."""
    seen: BaseException | None = exc
    while seen is not None and not isinstance(seen, kind):
        seen = seen.__cause__ or seen.__context__
    return seen


async def _run_once(path: Path, inputs: dict[str, Any]) -> dict[str, np.ndarray]:
    async with ModelRunner(path, ModelRunnerConfig(timeout=0.01)) as runner:
        return await runner.execute(inputs)


def test_rotate_example_prints_the_seed_result() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "custom_op_rotate.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == "x: [-2.0, -3.0, 8.0, -1.0]"
    assert lines[1] == "y: [-2.0, 4.0, -6.0, -1.0]"
    assert lines[2] == "x * x + y * z: [-4.0, 4.0, 16.0, 32.0] numpy: [-4.0, 4.0, 16.0, 32.0]"


async def test_executable_records_the_library_and_runs_on_the_device(tmp_path: Path) -> None:
    path = compile_model(_rotate_model(), tmp_path / "rotate.mrx", CompileOptions(batch_size=4))
    (ref,) = Executable.load(path).metadata.custom_ops
    lib_hash = custom_ops.load_library(ROTATE, "test").hash
    assert ref == CustomOpRef(ROTATE, "Rotate", lib_hash, True)
    x, y = np.array([2, 4, 6, -1], np.float32), np.array([2, 3, 8, -1], np.float32)
    angle = np.array([np.pi, np.pi / 2, 3 * np.pi / 2, 0], np.float32)
    out = await _run_once(path, {"x": x, "y": y, "angle": angle})
    np.testing.assert_allclose(out["rx"], [-2, -3, 8, -1], atol=1e-5)
    np.testing.assert_allclose(out["ry"], [-2, 4, -6, -1], atol=1e-5)


def test_load_refuses_a_library_not_on_the_loading_process_allow_list(tmp_path: Path) -> None:
    path = compile_model(_rotate_model(), tmp_path / "rotate.mrx", CompileOptions(batch_size=4))
    script = f"""
import asyncio, sys
from model_runtime.runner import ModelRunner
from model_runtime.errors import CustomOpError
async def main():
    try:
        async with ModelRunner({str(path)!r}):
            print("LOADED")
    except Exception as exc:
        while exc is not None and not isinstance(exc, CustomOpError):
            exc = exc.__cause__ or exc.__context__
        print("REFUSED", exc)
    print("IMPORTED" if {ROTATE!r} in sys.modules else "NOT-IMPORTED")
asyncio.run(main())
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(custom_ops.ALLOW_ENV, None)
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert "REFUSED" in proc.stdout, proc.stdout + proc.stderr
    assert "not on the allow-list" in proc.stdout and "custom_op_libraries" in proc.stdout
    assert proc.stdout.strip().endswith("NOT-IMPORTED")
    env[custom_ops.ALLOW_ENV] = ROTATE
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert "LOADED" in proc.stdout, proc.stdout + proc.stderr


async def test_a_library_changed_since_compiling_is_refused_at_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib = tmp_path / "lib" / "my_scale_op.py"
    lib.parent.mkdir()
    lib.write_text((ROOT / "tests" / "custom_op_libs" / "rotate_op.py").read_text())
    monkeypatch.syspath_prepend(str(lib.parent))
    custom_ops.set_allowed_libraries(["my_scale_op"])
    node = helper.make_node("Rotate", ["x", "y", "angle"], ["rx", "ry"], domain="my_scale_op")
    model = _model([node], ["x", "y", "angle"], ["rx", "ry"], ["my_scale_op"], [4])
    path = compile_model(model, tmp_path / "m.mrx", CompileOptions(batch_size=4))
    lib.write_text(lib.read_text() + "\n# edited\n")
    with pytest.raises(ModelRuntimeError) as info:
        await _run_once(path, {n: np.ones(4, np.float32) for n in ("x", "y", "angle")})
    assert "changed since the executable was compiled" in str(_cause(info.value, CustomOpError))


async def test_expression_op_end_to_end_matches_numpy_over_blocks(tmp_path: Path) -> None:
    node = custom_ops.codelet_expression_op(lambda x, y, z: x * x + y * z, "a", "b", "c")
    dims = [2, expression.BLOCK // 2 + 5]  # two rows: more than one block per run
    model = _model([node], ["a", "b", "c"], [node.output[0]], [expression.LIBRARY], dims)
    path = compile_model(model, tmp_path / "expr.mrx", CompileOptions(batch_size=2))
    exe = Executable.load(path)
    assert [r.library for r in exe.metadata.custom_ops] == [expression.LIBRARY]
    payload = onnx.load_model_from_string(exe.program_payload(exe.metadata.program(1)))
    (kernel,) = [n for n in payload.graph.node if n.domain == "ai.onnx.contrib"]
    spec = json.loads(helper.get_attribute_value(kernel.attribute[0]))
    assert spec["attributes"]["expression"].startswith('{"args"')  # the tree, as data
    rng = np.random.default_rng(1)
    a, b, c = (rng.standard_normal(dims).astype(np.float32) for _ in range(3))
    out = await _run_once(path, {"a": a, "b": b, "c": c})
    np.testing.assert_allclose(out[node.output[0]], a * a + b * c, rtol=1e-6)


async def test_kernel_failure_is_an_application_error_not_a_crash(tmp_path: Path) -> None:
    node = helper.make_node("RaisesAtRun", ["x"], ["y"], domain=BROKEN)
    model = _model([node], ["x"], ["y"], [BROKEN], [4])
    path = compile_model(model, tmp_path / "r.mrx", CompileOptions(batch_size=4))
    async with ModelRunner(path, ModelRunnerConfig(timeout=0.01)) as runner:
        with pytest.raises(ApplicationRuntimeError, match="negative input") as info:
            await runner.execute({"x": -np.ones(4, np.float32)})
        assert isinstance(info.value.__cause__, CustomOpError)
        ok = await runner.execute({"x": np.ones(4, np.float32)})
        np.testing.assert_array_equal(ok["y"], np.full(4, 2.0))


def _unhashable_model() -> onnx.ModelProto:
    node = helper.make_node("Unhashable", ["x"], ["y"], domain=BROKEN)
    return _model([node], ["x"], ["y"], [BROKEN], [4])


@pytest.mark.parametrize("connection_type", ["ALWAYS", "ON_DEMAND"])
async def test_unhashable_op_runs_uncached_with_a_cache_path_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, connection_type: str
) -> None:
    # Seed 001 forbids caching / pre-compiling such an op, not running it: with the cache set
    # through MODEL_RUNTIME_FLAGS it compiles and runs, is not cached, and the log says why.
    cache = tmp_path / "cache"
    monkeypatch.setenv("MODEL_RUNTIME_FLAGS", f"--executable_cache_path={cache}")
    with capture_logs() as logs:
        out = await mrc.compile_and_run(
            _unhashable_model(),
            {"x": np.ones(4, np.float32)},
            CompileOptions(batch_size=4),
            connection_type=connection_type,
        )
    np.testing.assert_array_equal(out["y"], np.full(4, 2.0))
    assert not list(cache.glob("*.mrx"))
    (warning,) = [e for e in logs if e["event"] == "executable not cached"]
    assert warning["log_level"] == "warning" and warning["cache"] == str(cache)
    assert re.search(r"broken_ops:Unhashable.*not marked hashable.*cannot be cached",
                     str(warning["reason"]))  # fmt: skip
    assert any(e["event"] == "Compiled model 'custom' (not cached)" for e in logs)


def test_compile_model_with_a_cache_compiles_an_unhashable_op_to_the_output(
    tmp_path: Path,
) -> None:
    cached = CompileOptions(batch_size=4, executable_cache_path=str(tmp_path / "cache"))
    with capture_logs() as logs:
        path = compile_model(_unhashable_model(), tmp_path / "u.mrx", cached)
    assert path == tmp_path / "u.mrx" and Executable.load(path).metadata.batch_size == 4
    assert [e["event"] for e in logs] == ["executable not cached", "compiled executable"]
    assert logs[1]["cached"] is False
    assert not list((tmp_path / "cache").glob("*.mrx"))
    # Not read from a file and no output path: nowhere to put it, and the error says why.
    with pytest.raises(CompileError, match=r"give an output path \(the model uses custom op"):
        compile_model(_unhashable_model(), None, cached)


async def test_unhashable_op_refuses_pre_compile(tmp_path: Path) -> None:
    program = mrc.OnnxProgram(
        _unhashable_model(),
        CompileOptions(batch_size=4),
        connection_type="PRE_COMPILE",
        executable_cache_path=tmp_path / "cache",
    )
    with pytest.raises(CustomOpError, match=r"Unhashable.*cannot be pre-compiled.*is_hashable"):
        await program.start()
    assert program.executable is None
    assert not list((tmp_path / "cache").glob("*.mrx"))

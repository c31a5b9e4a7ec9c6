"""Runtime configuration and connection types, in process (the example runs as a subprocess in
tests/integration/test_examples_connection.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import model_runtime.connection as mrc
from model_runtime.compiler import CompileOptions
from model_runtime.errors import ConfigurationError, DeviceUnavailableError


@pytest.fixture(autouse=True)
def _restore() -> Iterator[None]:
    before = mrc.get_configuration()
    yield
    mrc._config = before


def _add_model() -> object:
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("a", "b", "out")]
    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["out"])], "add", vi[:2], vi[2:])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_connection_type_parses_names_and_refuses_unknown_ones() -> None:
    assert mrc.DeviceConnectionType.parse("on_demand") is mrc.DeviceConnectionType.ON_DEMAND
    with pytest.raises(
        ConfigurationError, match="use one of ALWAYS, ON_DEMAND, PRE_COMPILE, NEVER"
    ):
        mrc.configure(connection_type="SOMETIMES")
    assert mrc.get_configuration().connection_type is mrc.DeviceConnectionType.ALWAYS


def test_configure_keeps_fields_not_given(tmp_path: Path) -> None:
    mrc.configure(connection_type="NEVER")
    config = mrc.configure(executable_cache_path=tmp_path / "cache")
    assert config.connection_type is mrc.DeviceConnectionType.NEVER
    assert config.executable_cache_path == str(tmp_path / "cache")
    assert (tmp_path / "cache").is_dir()


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_cache_path_is_refused_with_advice(tmp_path: Path) -> None:
    locked = tmp_path / "ro"
    locked.mkdir(mode=0o500)
    pattern = r"not a writable directory.*executable_cache_path"
    with pytest.raises(ConfigurationError, match=pattern):
        mrc.configure(executable_cache_path=locked / "cache")


def test_cache_path_under_a_file_is_refused_with_advice(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigurationError, match=r"not a writable directory.*choose one"):
        mrc.configure(executable_cache_path=tmp_path / "file" / "cache")


async def test_never_compiles_and_refuses_to_execute() -> None:
    async with mrc.OnnxProgram(
        _add_model(), CompileOptions(batch_size=2), connection_type="NEVER"
    ) as program:
        assert program.path is not None and program.path.exists()
        with pytest.raises(
            DeviceUnavailableError, match=r"compilation only \(DeviceConnectionType.NEVER\)"
        ):
            await program.run({"a": np.ones(2, np.float32), "b": np.ones(2, np.float32)})


async def test_pre_compile_returns_zeros_per_request_rows(tmp_path: Path) -> None:
    mrc.configure(connection_type="PRE_COMPILE", executable_cache_path=tmp_path)
    async with mrc.OnnxProgram(_add_model(), CompileOptions(batch_size=2)) as program:
        assert program.path is not None and program.path.parent == tmp_path
        out = await program.run({"a": np.ones(4, np.float32), "b": np.ones(4, np.float32)})
    np.testing.assert_array_equal(out["out"], np.zeros(4, np.float32))


async def test_on_demand_attaches_only_when_executed() -> None:
    program = mrc.OnnxProgram(
        _add_model(), CompileOptions(batch_size=2), connection_type="ON_DEMAND"
    )
    async with program:
        assert program._runner is None  # compiled, nothing attached yet
        out = await program.run({"a": np.ones(2, np.float32), "b": np.full(2, 2, np.float32)})
        assert program._runner is not None
    np.testing.assert_array_equal(out["out"], np.full(2, 3.0))

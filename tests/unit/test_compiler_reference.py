"""run_reference: the reference runner validates what callers feed it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from model_runtime.compiler import (
    CompileOptions,
    compile_executable,
    random_inputs,
    run_reference,
)
from model_runtime.errors import InputValidationError
from model_runtime.executable import Executable
from tests.models import make_add_double, make_counter, make_string_identity


@pytest.fixture(scope="module")
def exe() -> Executable:
    return compile_executable(make_add_double(), CompileOptions(batch_size=2))


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ({}, r"missing inputs \['x'\]"),
        (
            {"x": np.zeros((2, 4), np.float32), "y": np.zeros(1)},
            r"unknown inputs \['y'\]",
        ),
        ({"x": np.zeros((3, 4), np.float32)}, r"must have shape \[2, 4\], got \[3, 4\]"),
        ({"x": np.zeros((2, 4), np.float64)}, "must be float32, got float64"),
        ({"x": [[0.0] * 4] * 2}, "must be a numpy array"),
    ],
)
def test_bad_inputs_are_refused(exe: Executable, inputs: dict[str, object], message: str) -> None:
    with pytest.raises(InputValidationError, match=message):
        run_reference(exe, inputs)  # type: ignore[arg-type]


def test_random_inputs_fit(exe: Executable) -> None:
    inputs = random_inputs(exe, seed=1)
    out = run_reference(exe, inputs)
    np.testing.assert_array_equal(out["double"], inputs["x"] * 2)


def test_unknown_or_misshapen_variable_is_refused() -> None:
    counter = compile_executable(
        make_counter(),
        CompileOptions(
            batch_size=2, variables=("count",), variable_updates={"count_next": "count"}
        ),
    )
    x = np.zeros((2, 4), np.float32)
    with pytest.raises(InputValidationError, match="unknown variables"):
        run_reference(counter, {"x": x}, {"other": np.zeros(1, np.float32)})
    with pytest.raises(InputValidationError, match=r"variable 'count' must have shape \[1\]"):
        run_reference(counter, {"x": x}, {"count": np.zeros(2, np.float32)})
    out = run_reference(counter, {"x": x}, {"count": np.array([5], np.float32)})
    np.testing.assert_array_equal(out["y"], np.full((2, 4), 5, np.float32))


def test_loaded_executable_runs_the_same(exe: Executable, tmp_path: Path) -> None:
    loaded = Executable.load(exe.save(tmp_path / "ad.mrx"))
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(
        run_reference(loaded, {"x": x})["sum"], run_reference(exe, {"x": x})["sum"]
    )


def test_string_inputs_may_be_the_runtimes_bytes_or_str() -> None:
    # onnxruntime's binding would take a bytes element as its repr ("b'abc'"), silently.
    exe = compile_executable(make_string_identity(), CompileOptions(batch_size=2))
    as_bytes = np.array([[b"abc"], ["d\u00e9f".encode()]], dtype=object)
    as_str = np.array([["abc"], ["d\u00e9f"]], dtype=object)
    for given in (as_bytes, as_str):
        assert run_reference(exe, {"INPUT0": given})["OUTPUT0"].tolist() == [["abc"], ["d\u00e9f"]]

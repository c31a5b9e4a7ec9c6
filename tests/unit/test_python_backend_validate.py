"""A python model's config, enforced in the daemon: inputs before they are queued (the common
case at a glance, every other case in words that say what is wrong), outputs before they are
answered."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from model_runtime.errors import InputValidationError, PythonModelError
from model_runtime.python_backend.config import PythonModelConfig
from model_runtime.python_backend.messages import PyResponse
from model_runtime.python_backend.validate import check_inputs, check_outputs


def _config(max_batch_size: int, dims: list[int]) -> PythonModelConfig:
    def tensor(name: str, kind: str) -> dict[str, Any]:
        return {"name": name, "data_type": kind, "dims": dims}

    return PythonModelConfig.from_dict(
        {
            "name": "m",
            "max_batch_size": max_batch_size,
            "input": [tensor("A", "TYPE_FP32"), tensor("B", "TYPE_INT64")],
            "output": [tensor("Y", "TYPE_FP32")],
        }
    )


@pytest.mark.parametrize(
    ("a", "b", "words"),
    [
        (np.ones((2, 3), np.float32), np.ones((2, 3), np.int64), None),
        (np.ones((9, 3), np.float32), np.ones((9, 3), np.int64), "a batch of 9 is not within 1..8"),
        (np.ones((2, 3), np.float32), np.ones((1, 3), np.int64), "differ in batch size"),
        (np.ones((2, 4), np.float32), np.ones((2, 4), np.int64), "Expected [3], got [4]"),
        (np.ones((2, 3), np.float64), np.ones((2, 3), np.int64), "data-type is 'FP64'"),
    ],
)
def test_inputs_of_a_batching_model(a: np.ndarray, b: np.ndarray, words: str | None) -> None:
    config = _config(8, [3])
    if words is None:
        check_inputs(config, {"A": a, "B": b})
        return
    with pytest.raises(InputValidationError) as info:
        check_inputs(config, {"A": a, "B": b})
    assert words in str(info.value)


def test_inputs_with_dims_of_any_size() -> None:
    config = _config(0, [-1, 2])
    check_inputs(config, {"A": np.ones((5, 2), np.float32), "B": np.ones((1, 2), np.int64)})
    with pytest.raises(InputValidationError, match="unexpected inference input 'C'"):
        check_inputs(config, {"A": np.ones((5, 2), np.float32), "C": np.ones((1, 2), np.int64)})


def test_an_output_of_another_data_type_fails_its_request() -> None:
    config = _config(8, [3])
    fine = PyResponse({"Y": np.ones(3, np.float32), "extra": np.ones(1, np.int8)})
    assert check_outputs(config, fine) is fine
    wrong = check_outputs(config, PyResponse({"Y": np.ones(3, np.float64)}))
    assert isinstance(wrong.error, PythonModelError)
    assert "output 'Y' as FP64, but its config says TYPE_FP32" in str(wrong.error)
    assert wrong.outputs == {}

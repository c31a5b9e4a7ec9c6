"""The generate extension's request and response JSON (model_runtime.server.inference.generate):
shapes completed from the model's, parameters beside inputs, Triton's texts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest

from model_runtime.errors import ProtocolError
from model_runtime.server.inference.generate import generate_request, generate_response
from model_runtime.server.repository.entries import ModelEntry
from model_runtime.server.tensors.request import TensorSpec
from model_runtime.server.triton import model_config_pb2 as pb


def _entry(*inputs: TensorSpec, optional: tuple[str, ...] = ()) -> ModelEntry:
    config = pb.ModelConfig(name="m")
    for spec in inputs:
        config.input.add(name=spec.name, optional=spec.name in optional)
    return ModelEntry(
        "m", Path("m"), inputs=inputs, outputs=(TensorSpec("OUT", "FP32", (-1,)),), served=config
    )


def _request(doc: object, entry: ModelEntry, *, python: bool = True) -> object:
    return generate_request(orjson.dumps(doc), entry, 1 << 20, python=python)


@pytest.mark.parametrize(
    ("shape", "values", "expected"),
    [
        ((1, -1), [1, 2, 3], (1, 3)),  # the innermost dynamic dimension takes the rest
        ((-1, 2), [1, 2, 3, 4], (2, 2)),  # fixed dimensions divide the count
        ((-1, -1), [1, 2], (1, 2)),  # other dynamic dimensions are 1
        ((1, 1), 7, (1, 1)),  # a scalar is one element
        ((-1,), [], (0,)),
    ],
)
def test_an_input_takes_the_models_shape(
    shape: tuple[int, ...], values: object, expected: tuple[int, ...]
) -> None:
    entry = _entry(TensorSpec("X", "INT32", shape))
    request = _request({"X": values}, entry)
    assert request.inputs["X"].shape == expected  # type: ignore[attr-defined]
    assert request.inputs["X"].dtype == np.int32  # type: ignore[attr-defined]


def test_a_count_the_shape_cannot_take_is_refused() -> None:
    entry = _entry(TensorSpec("X", "INT32", (-1, 2)))
    with pytest.raises(ProtocolError, match="can not convert input 'X' to tensor"):
        _request({"X": [1, 2, 3]}, entry)


def test_other_keys_are_parameters_and_id_is_the_request_id() -> None:
    entry = _entry(TensorSpec("X", "BYTES", (1,)))
    request = _request({"X": "hi", "id": "9", "k": 2, "parameters": {"t": 0.5}}, entry)
    assert request.id == "9"  # type: ignore[attr-defined]
    assert request.parameters == {"k": 2, "t": 0.5}  # type: ignore[attr-defined]
    assert request.inputs["X"].tolist() == [b"hi"]  # type: ignore[attr-defined]


def test_a_model_that_is_not_python_takes_custom_parameters_as_triton_does() -> None:
    """Triton hands a request's custom parameters to every model (an ONNX model ignores them);
    its own parameters are checked as for infer."""
    entry = _entry(TensorSpec("X", "FP32", (1,)))
    assert _request({"X": 1.0, "timeout": 5000}, entry, python=False).timeout == 0.005  # type: ignore[attr-defined]
    assert _request({"X": 1.0, "k": 2}, entry, python=False).parameters["k"] == 2  # type: ignore[attr-defined]
    with pytest.raises(ProtocolError, match="timeout"):
        _request({"X": 1.0, "timeout": -1}, entry, python=False)


def test_an_optional_input_may_be_left_out_and_the_count_is_tritons() -> None:
    entry = _entry(TensorSpec("A", "FP32", (1,)), TensorSpec("B", "FP32", (1,)), optional=("B",))
    assert list(_request({"A": 1.0}, entry).inputs) == ["A"]  # type: ignore[attr-defined]
    with pytest.raises(ProtocolError) as info:
        _request({"id": "3"}, entry)
    assert str(info.value) == (
        "[request id: 3] expected number of inputs between 1 and 2 but got 0 inputs for model "
        "'m'. Got input(s) [], but missing required input(s) ['A']. Please provide all "
        "required input(s)."
    )


def test_inputs_past_the_limit_are_refused_before_they_are_made() -> None:
    entry = _entry(TensorSpec("X", "INT64", (-1,)))
    with pytest.raises(ProtocolError, match="exceeds the maximum allowed input size of 64"):
        generate_request(orjson.dumps({"X": list(range(9))}), entry, 64, python=True)


def test_a_response_strips_one_element_and_keeps_lists() -> None:
    entry = _entry()
    body = generate_response(
        entry,
        "5",
        {"T": np.array([[b"x"]], dtype=object), "V": np.array([1.5, 2.0], np.float32)},
        {"p": True, "skip": object()},
    )
    assert orjson.loads(body) == {
        "id": "5",
        "model_name": "m",
        "model_version": "1",
        "p": True,
        "T": "x",
        "V": [1.5, 2.0],
    }

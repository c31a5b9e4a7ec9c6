"""Request validation (``model_runtime.io``): what it refuses, and that the message names the
input or output at fault. (That a refused request leaves the callers sharing its batch unharmed
is ``tests/integration/test_io_isolation.py``.)"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from model_runtime.errors import InputValidationError
from model_runtime.executable import Anchor, AnchorRole, AnchorType, TensorInfo
from model_runtime.io import RequestShape, request_shapes, validate_inputs, validate_outputs

pytestmark = pytest.mark.timeout(20)

B = 2
F32 = np.dtype(np.float32)


def anchor(
    name: str, shape: tuple[int, ...], batch_dim: int | None, output: bool = False
) -> Anchor:
    kind, role = (
        (AnchorType.OUTPUT, AnchorRole.USER_OUTPUT)
        if output
        else (AnchorType.INPUT, AnchorRole.USER_INPUT)
    )
    return Anchor(name, name, TensorInfo(shape, F32), kind, role, (1,), batch_dim=batch_dim)


def shapes(*anchors: Anchor, batching_dim: int | None = 0) -> tuple[RequestShape, ...]:
    return request_shapes(anchors, batching_dim, where="model 'm'")


def f32(*shape: int) -> np.ndarray:
    return np.zeros(shape, np.float32)


TWO_IN = shapes(anchor("a", (B, 3), 0), anchor("b", (B, 3), 0))


@pytest.mark.parametrize(("a", "b"), [(2, 1), (1, 3)])
def test_inputs_that_disagree_on_samples_are_refused_naming_both(a: int, b: int) -> None:
    with pytest.raises(InputValidationError) as raised:
        validate_inputs({"a": f32(a, 3), "b": f32(b, 3)}, TWO_IN, B, dynamic=True)
    assert str(raised.value) == (
        f"input 'b' has {b} samples but input 'a' has {a}: every input of a request must "
        "carry the same number of samples (along dimension 0)"
    )
    arrays, samples = validate_inputs({"a": f32(3, 3), "b": f32(3, 3)}, TWO_IN, B, dynamic=True)
    assert samples == 3 and set(arrays) == {"a", "b"}


def test_samples_are_counted_along_the_batching_dim() -> None:
    two = shapes(anchor("a", (3, B), 1), anchor("b", (3, B), 1), batching_dim=1)
    _, samples = validate_inputs({"a": f32(3, 5), "b": f32(3, 5)}, two, B, dynamic=True)
    assert samples == 5
    with pytest.raises(InputValidationError, match="input 'b' has 4 samples but input 'a' has 5"):
        validate_inputs({"a": f32(3, 5), "b": f32(3, 4)}, two, B, dynamic=True)


OUTS = shapes(anchor("y", (B, 3), 0, output=True), anchor("z", (B,), 0, output=True))


def test_a_read_only_output_buffer_is_refused_naming_it() -> None:
    frozen = f32(4)
    frozen.flags.writeable = False
    with pytest.raises(InputValidationError) as raised:
        validate_outputs({"y": f32(4, 3), "z": frozen}, OUTS, samples=4)
    assert str(raised.value) == "output buffer 'z' is read-only: results are written into it"
    validate_outputs({"y": f32(4, 3), "z": f32(4)}, OUTS, samples=4)


BAD_OUTPUTS: list[tuple[Any, str]] = [
    ({"y": f32(4, 3)}, "outputs must name exactly ['y', 'z'], got ['y']"),
    ({"y": f32(4, 3), "z": [0.0] * 4}, "output buffer 'z' must be a numpy array, got list"),
    ({"y": f32(3, 3), "z": f32(4)}, "'y' is float32[3, 3], expected float32[4, 3]"),
    ({"y": f32(4, 3), "z": np.zeros(4)}, "'z' is float64[4], expected float32[4]"),
    ([("y", f32(4, 3))], "outputs must be a mapping"),
]


@pytest.mark.parametrize(("outputs", "message"), BAD_OUTPUTS)
def test_unusable_output_buffers_are_refused_naming_them(outputs: Any, message: str) -> None:
    with pytest.raises(InputValidationError) as raised:
        validate_outputs(outputs, OUTS, samples=4)
    assert message in str(raised.value)


# An anchor without a batch dimension is unbatched, as the queue treats it
# (actors/queues/pool.py): given whole, in its own shape, and not counted as samples.
MIXED = shapes(anchor("x", (B, 3), 0), anchor("scale", (3,), None))


def test_unbatched_inputs_are_given_whole_and_are_not_samples() -> None:
    arrays, samples = validate_inputs({"x": f32(5, 3), "scale": f32(3)}, MIXED, B, dynamic=True)
    assert samples == 5 and arrays["scale"].shape == (3,)
    # Counted as samples, (5,) would disagree with x; packed whole, (2,) would not fit (3,).
    for bad in ((5,), (2,), (1, 3)):
        with pytest.raises(InputValidationError) as raised:
            validate_inputs({"x": f32(5, 3), "scale": f32(*bad)}, MIXED, B, dynamic=True)
        assert str(raised.value) == (
            f"input 'scale' has shape {list(bad)}, the model expects [3] "
            "(it has no batch dimension: give it whole)"
        )


def test_a_model_with_only_unbatched_inputs_takes_one_batch_per_request() -> None:
    only = shapes(anchor("scale", (3,), None), batching_dim=None)
    _, samples = validate_inputs({"scale": f32(3)}, only, B, dynamic=False)
    assert samples == B


def test_an_unbatched_output_buffer_has_the_outputs_own_shape() -> None:
    outs = shapes(anchor("y", (B, 3), 0, output=True), anchor("step", (1,), None, output=True))
    validate_outputs({"y": f32(5, 3), "step": f32(1)}, outs, samples=5)
    with pytest.raises(
        InputValidationError, match=r"'step' is float32\[5\], expected float32\[1\]"
    ):
        validate_outputs({"y": f32(5, 3), "step": f32(5)}, outs, samples=5)

"""Triton's raw binary requests (``Inference-Header-Content-Length: 0``): the shape deduced from
the model's one input, or Triton's refusal in its words."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from model_runtime.errors import ProtocolError
from model_runtime.server.tensors.raw import parse_raw_request
from model_runtime.server.tensors.request import TensorSpec

OUTPUTS = (TensorSpec("y", "FP32", (-1, 3)), TensorSpec("z", "INT64", (-1,)))


def _parse(spec: TensorSpec, body: bytes) -> np.ndarray:
    req = parse_raw_request(body, (spec,), OUTPUTS, model="m")
    assert [(o.name, o.binary) for o in req.outputs] == [("y", True), ("z", True)]
    return req.inputs[spec.name]


def test_a_batched_fixed_shape_gets_a_batch_of_one() -> None:
    x = np.arange(8, dtype=np.float32)
    got = _parse(TensorSpec("x", "FP32", (-1, 2, 4)), x.tobytes())
    assert got.shape == (1, 2, 4) and got.ravel().tolist() == x.tolist()


def test_the_one_variable_dimension_is_deduced_from_the_length() -> None:
    x = np.arange(12, dtype=np.int32)
    assert _parse(TensorSpec("x", "INT32", (-1, -1, 3)), x.tobytes()).shape == (1, 4, 3)
    # without a batch axis, the configured shape as it is
    spec = TensorSpec("x", "INT32", (2, -1), batched=False)
    assert _parse(spec, x.tobytes()).shape == (2, 6)
    assert _parse(spec, b"").shape == (2, 0)  # a zero-size tensor


def test_a_bytes_input_of_shape_one_takes_the_whole_body() -> None:
    got = _parse(TensorSpec("s", "BYTES", (-1, 1)), b"hello \x00 world")
    assert got.shape == (1, 1) and got[0, 0] == b"hello \x00 world"


@pytest.mark.parametrize(
    ("specs", "body", "message"),
    [
        ((TensorSpec("a", "FP32", (-1, 2)), TensorSpec("b", "FP32", (-1, 2))), b"",
         "[request id: <id_unknown>] Raw request must only have 1 input (found 1) to be "
         "deduced but got 2 inputs in 'm' model configuration"),
        ((TensorSpec("a", "FP32", (-1, -1, -1)),), b"",
         "[request id: <id_unknown>] The shape of the raw input 'a' can not be deduced because "
         "there are more than one variable-sized dimension"),
        ((TensorSpec("s", "BYTES", (-1, 2)),), b"ab",
         "[request id: <id_unknown>] For BYTE datatype raw input 's', the model must have "
         "input shape [1]"),
        ((TensorSpec("s", "BYTES", (-1, -1)),), b"ab",
         "[request id: <id_unknown>] For BYTE datatype raw input 's', the model must have "
         "input shape [1]"),
        ((TensorSpec("a", "FP32", (-1, 4)),), b"\0" * 12,
         "[request id: <id_unknown>] input byte size mismatch for input 'a' for model 'm'. "
         "Expected 16, got 12"),
        ((TensorSpec("a", "FP32", (-1, -1, 4)),), b"\0" * 20,  # 1 row of 4, 4 bytes over
         "[request id: <id_unknown>] input byte size mismatch for input 'a' for model 'm'. "
         "Expected 16, got 20"),
        ((TensorSpec("a", "BOOL", (-1, 2)),), b"\x01\x02",
         "input 'a': BOOL binary data must be bytes 0 or 1"),
    ],
)  # fmt: skip
def test_what_cannot_be_deduced_is_refused_in_tritons_words(
    specs: tuple[TensorSpec, ...], body: bytes, message: str
) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_raw_request(body, specs, OUTPUTS, model="m")
    assert str(info.value) == message


@settings(max_examples=200, deadline=None)
@given(
    dims=st.lists(st.one_of(st.just(-1), st.integers(0, 5)), min_size=0, max_size=4),
    batched=st.booleans(),
    body=st.binary(max_size=200),
    datatype=st.sampled_from(["FP32", "INT8", "FP64", "UINT16"]),
)
def test_any_body_is_an_exact_tensor_or_a_protocol_error(
    dims: list[int], batched: bool, body: bytes, datatype: str
) -> None:
    shape = ((-1,) if batched else ()) + tuple(dims)
    spec = TensorSpec("x", datatype, shape, batched=batched)
    try:
        got = _parse(spec, body)
    except ProtocolError:
        return
    assert got.tobytes() == body  # every byte, in order, nothing made up
    assert got.shape[: len(shape) - len(dims)] == ((1,) if batched else ())
    tail = got.shape[len(shape) - len(dims) :]
    assert all(d in (-1, n) for d, n in zip(dims, tail, strict=True)), (dims, got.shape)

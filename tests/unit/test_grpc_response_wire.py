"""The unary answer's bytes, written without protobuf, are the bytes protobuf writes for the
same ``ModelInferResponse`` (and parse back to it), for any names, ids, datatypes, shapes,
string outputs and classifications (hypothesis, differentially)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from model_runtime.server.grpc.codec import encode_model_infer_response
from model_runtime.server.grpc.response_wire import model_infer_response_bytes
from model_runtime.server.tensors.datatypes import DATATYPES
from model_runtime.server.tensors.request import InferRequest, RequestedOutput, TensorSpec
from model_runtime.server.triton import grpc_service_pb2 as pb

pytestmark = pytest.mark.timeout(60)

_TEXT = st.text(max_size=12)  # any code point but lone surrogates (not UTF-8)
_NUMERIC = sorted(DATATYPES)


@st.composite
def _output(draw: Any) -> tuple[str, str, np.ndarray, int]:
    """(datatype, the model's datatype, its value, class count) of one output."""
    shape = tuple(draw(st.lists(st.integers(0, 3), max_size=3)))
    kind = draw(st.sampled_from([*_NUMERIC, "BYTES", "classes"]))
    size = int(np.prod(shape, dtype=np.int64))
    if kind == "BYTES":
        items = draw(st.lists(st.binary(max_size=5), min_size=size, max_size=size))
        arr = np.empty(size, dtype=object)
        arr[:] = items
        return "BYTES", "BYTES", arr.reshape(shape), 0
    if kind == "classes":
        batch, classes = draw(st.integers(1, 3)), draw(st.integers(1, 4))
        values = draw(st.lists(st.floats(-9, 9), min_size=batch * classes, max_size=batch * 4))
        scores = np.array(values[: batch * classes], dtype=np.float32).reshape(batch, classes)
        return "FP32", "FP32", scores, draw(st.integers(1, classes))
    # the model's array may be of another dtype than its datatype says: it is cast
    source = draw(st.sampled_from([kind, "FP64", "INT64"]))
    values = draw(st.lists(st.integers(0, 1), min_size=size, max_size=size))
    return kind, kind, np.array(values, dtype=DATATYPES[source]).reshape(shape), 0


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    model=_TEXT,
    version=_TEXT,
    request_id=st.none() | _TEXT,
    outputs=st.dictionaries(_TEXT, _output(), max_size=4),
)
def test_the_bytes_are_protobufs(
    model: str,
    version: str,
    request_id: str | None,
    outputs: dict[str, tuple[str, str, np.ndarray, int]],
) -> None:
    names = list(outputs)
    request = InferRequest(
        request_id,
        {},
        tuple(RequestedOutput(n, True, outputs[n][3]) for n in names),
    )
    results = {n: outputs[n][2] for n in names}
    datatypes = {n: outputs[n][1] for n in names}
    specs = tuple(TensorSpec(n, outputs[n][1], (-1, -1)) for n in names)
    expected = encode_model_infer_response(model, version, request, results, datatypes, specs=specs)
    wire = model_infer_response_bytes(model, version, request, results, datatypes, specs=specs)
    assert wire == expected.SerializeToString()
    assert pb.ModelInferResponse.FromString(wire) == expected
    again = model_infer_response_bytes(model, version, request, results, datatypes, specs=specs)
    assert again == wire  # (the headers kept from the first give the same bytes)


def test_a_missing_output_is_a_key_error_as_protobufs_encoder_raises() -> None:
    request = InferRequest(None, {}, (RequestedOutput("y", True),))
    with pytest.raises(KeyError):
        model_infer_response_bytes("m", "1", request, {}, {"y": "FP32"})


def test_long_names_and_big_outputs_are_protobufs() -> None:
    """Lengths of two and three varint bytes (names, headers, raw contents)."""
    names = ("y" * 300, "é" * 70)
    request = InferRequest("i" * 200, {}, tuple(RequestedOutput(n, True) for n in names))
    results: dict[str, np.ndarray] = {
        names[0]: np.ones((40, 10)),
        names[1]: np.arange(20000, dtype=np.int32),
    }
    datatypes = {names[0]: "FP64", names[1]: "INT32"}
    expected = encode_model_infer_response("m" * 130, "1", request, results, datatypes)
    wire = model_infer_response_bytes("m" * 130, "1", request, results, datatypes)
    assert wire == expected.SerializeToString()


@settings(max_examples=40, deadline=None)
@given(model=_TEXT, request_id=st.none() | _TEXT, size=st.integers(0, 300))
def test_framed_is_grpcs_message_prefix_then_the_bytes(
    model: str, request_id: str | None, size: int
) -> None:
    request = InferRequest(request_id, {}, (RequestedOutput("y", True),))
    results = {"y": np.ones(size, np.float32)}
    wire = model_infer_response_bytes(model, "1", request, results, {"y": "FP32"})
    framed = model_infer_response_bytes(model, "1", request, results, {"y": "FP32"}, framed=True)
    assert framed == b"\0" + len(wire).to_bytes(4, "big") + wire

"""The gRPC codec: ``ModelInferRequest`` messages decode to typed arrays (raw and typed
contents), anything malformed is a ``ProtocolError`` that names the defect, declared shapes
are never trusted (hypothesis-fuzzed), and responses carry raw contents as tritonclient reads
them."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from model_runtime.errors import ProtocolError
from model_runtime.sequences import SequenceStep
from model_runtime.server.grpc.codec import (
    encode_model_infer_response,
    parse_model_infer_request,
)
from model_runtime.server.tensors.classification import bytes_to_binary
from model_runtime.server.tensors.datatypes import DATATYPES
from model_runtime.server.tensors.request import InferRequest, RequestedOutput, TensorSpec
from model_runtime.server.triton import grpc_service_pb2 as pb

pytestmark = pytest.mark.timeout(60)

INPUTS = (TensorSpec("pixels", "FP32", (-1, 4)), TensorSpec("mask", "BOOL", (-1, 2)))
OUTPUTS = (TensorSpec("logits", "FP32", (-1, 3)), TensorSpec("label", "INT64", (-1,)))


def _request(raw: bool = True, **fields: Any) -> Any:
    pixels = np.arange(8, dtype=np.float32).reshape(2, 4)
    mask = np.array([[True, False], [False, True]])
    req = pb.ModelInferRequest(model_name="m", **fields)
    for name, datatype, arr in (("pixels", "FP32", pixels), ("mask", "BOOL", mask)):
        tensor = req.inputs.add(name=name, datatype=datatype, shape=arr.shape)
        if raw:
            req.raw_input_contents.append(arr.tobytes())
        elif datatype == "FP32":
            tensor.contents.fp32_contents.extend(arr.ravel().tolist())
        else:
            tensor.contents.bool_contents.extend(arr.ravel().tolist())
    return req


def _parse(req: Any, inputs: tuple[TensorSpec, ...] = INPUTS) -> InferRequest:
    return parse_model_infer_request(req, inputs, OUTPUTS, model="m")


@pytest.mark.parametrize("raw", [True, False])
def test_raw_and_typed_contents_decode_to_the_same_arrays(raw: bool) -> None:
    req = _parse(_request(raw=raw))
    np.testing.assert_array_equal(
        req.inputs["pixels"], np.arange(8, dtype=np.float32).reshape(2, 4)
    )
    assert req.inputs["pixels"].dtype == np.float32
    np.testing.assert_array_equal(req.inputs["mask"], [[True, False], [False, True]])
    assert [o.name for o in req.outputs] == ["logits", "label"]
    assert req.id is None and req.timeout is None and req.priority == 0


def test_parameters_are_honoured_as_over_http() -> None:
    req = _request(id="r-1")
    req.parameters["timeout"].int64_param = 2500
    req.parameters["priority"].uint64_param = 2
    req.outputs.add(name="label").parameters["classification"].int64_param = 2
    # tritonclient's C++ gRPC client (perf_analyzer's) sends this on every request
    req.parameters["triton_enable_empty_final_response"].bool_param = True
    parsed = _parse(req)
    assert (parsed.id, parsed.timeout, parsed.priority) == ("r-1", 0.0025, 2)
    assert parsed.outputs == (RequestedOutput("label", True, 2),)
    assert parsed.sequence is None
    req.parameters["sequence_id"].string_param = "s-9"
    req.parameters["sequence_start"].bool_param = True
    assert _parse(req).sequence == SequenceStep("s-9", start=True)


@pytest.mark.parametrize(
    ("datatype", "field", "values", "dtype"),
    [
        ("INT8", "int_contents", [-128, 0, 127], np.int8),
        ("INT16", "int_contents", [-(2**15), 2**15 - 1], np.int16),
        ("INT32", "int_contents", [-(2**31), 2**31 - 1], np.int32),
        ("INT64", "int64_contents", [-(2**63), 2**63 - 1], np.int64),
        ("UINT8", "uint_contents", [0, 255], np.uint8),
        ("UINT16", "uint_contents", [0, 65535], np.uint16),
        ("UINT32", "uint_contents", [0, 2**32 - 1], np.uint32),
        ("UINT64", "uint64_contents", [0, 2**64 - 1], np.uint64),
        ("FP64", "fp64_contents", [0.1, -2.5], np.float64),
        ("BOOL", "bool_contents", [True, False], np.bool_),
    ],
)
def test_every_typed_contents_field_decodes_exactly(
    datatype: str, field: str, values: list[Any], dtype: Any
) -> None:
    req = pb.ModelInferRequest()
    tensor = req.inputs.add(name="x", datatype=datatype, shape=[len(values)])
    getattr(tensor.contents, field).extend(values)
    arr = _parse(req, (TensorSpec("x", datatype, (-1,)),)).inputs["x"]
    assert arr.dtype == np.dtype(dtype)
    assert arr.tolist() == values


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda r: r.inputs[0].shape.__setitem__(0, 3),
         "[request id: <id_unknown>] input byte size mismatch for input 'pixels' for model 'm'. "
         "Expected 48, got 32"),
        (lambda r: setattr(r.inputs[0], "datatype", "FP64"), "does not match the model's FP32"),
        (lambda r: setattr(r.inputs[0], "datatype", "FP8"), "unknown datatype 'FP8'"),
        (lambda r: setattr(r.inputs[0], "datatype", "BYTES"), "BYTES is not supported"),
        (lambda r: setattr(r.inputs[0], "name", "nope"), "unknown input 'nope'"),
        (lambda r: setattr(r.inputs[1], "name", "pixels"),
         "[request id: <id_unknown>] input 'pixels' already exists in request"),
        (lambda r: r.raw_input_contents.pop(), "raw_input_contents has 1 entries for 2 inputs"),
        (lambda r: r.raw_input_contents.__setitem__(1, b"\x02\x00\x00\x01"), "bytes 0 or 1"),
        (lambda r: r.inputs[0].contents.fp32_contents.append(1.0),
         "contents field must not be specified when using raw_input_contents for 'pixels' for "
         "model 'm'"),
        (lambda r: r.inputs[0].contents.SetInParent(),  # even empty, as Triton checks it
         "contents field must not be specified when using raw_input_contents for 'pixels'"),
        (lambda r: r.outputs.add(name="nope"), "unexpected inference output 'nope' for model 'm'"),
        (lambda r: r.inputs[0].parameters["shared_memory_region"].MergeFrom(
            pb.InferParameter(string_param="r")),
         "'shared_memory_byte_size' must be specified along with 'shared_memory_region'"),
        (lambda r: r.parameters["timeout"].MergeFrom(pb.InferParameter()), "has no value"),
        (lambda r: r.parameters["triton_bogus"].MergeFrom(pb.InferParameter(bool_param=True)),
         "parameter keys starting with 'triton_' are reserved for Triton usage. Only the "
         "following keys starting with 'triton_' are allowed: "
         "triton_enable_empty_final_response"),
        (lambda r: r.parameters["triton_enable_empty_final_response"].MergeFrom(
            pb.InferParameter(int64_param=1)),
         "invalid value type for 'triton_enable_empty_final_response' parameter, expected "
         "bool_param."),
        (lambda r: r.inputs[0].shape.extend([2**32, 2**32]),
         "invalid shape for input 'pixels': shape [2,4,4294967296,4294967296] causes total "
         "element count to exceed maximum size of 9223372036854775807"),
        (lambda r: r.inputs[0].shape.extend([2**29, 2**30]),  # 2**62 elements of 4 bytes
         "byte size overflow for input 'pixels': element count (4611686018427387904) * data "
         "type size (4) exceeds maximum allowed size (9223372036854775807)"),
        (lambda r: r.inputs[0].shape.extend([1] * 40), "dimensions (at most 32)"),
        (lambda r: r.inputs[0].shape.__setitem__(0, -1), "must hold integers in"),
        (lambda r: (r.ClearField("inputs"), r.ClearField("raw_input_contents")),
         "expected 2 inputs but got 0 inputs for model 'm'. Got input(s) [], but missing "
         "required input(s) ['pixels','mask']. Please provide all required input(s)."),
    ],
)  # fmt: skip
def test_malformed_requests_are_protocol_errors_that_say_why(mutate: Any, message: str) -> None:
    req = _request()
    mutate(req)
    with pytest.raises(ProtocolError, match=re.escape(message)):
        _parse(req)


def test_typed_contents_are_checked_against_shape_field_and_range() -> None:
    spec = (TensorSpec("x", "INT8", (-1,)),)
    req = pb.ModelInferRequest()
    tensor = req.inputs.add(name="x", datatype="INT8", shape=[2])
    tensor.contents.int_contents.extend([1, 300])
    with pytest.raises(ProtocolError, match=r"outside INT8's \[-128, 127\]"):
        _parse(req, spec)
    tensor.contents.ClearField("int_contents")
    tensor.contents.int64_contents.extend([1, 2])
    with pytest.raises(ProtocolError, match="goes in int_contents"):
        _parse(req, spec)
    tensor.contents.ClearField("int64_contents")
    tensor.contents.int_contents.extend([1])
    with pytest.raises(ProtocolError, match="needs 2 elements, int_contents has 1"):
        _parse(req, spec)
    tensor.contents.ClearField("int_contents")
    with pytest.raises(ProtocolError, match="no data"):
        _parse(req, spec)
    fp16 = pb.ModelInferRequest()
    fp16.inputs.add(name="h", datatype="FP16", shape=[1]).contents.fp32_contents.append(1.0)
    with pytest.raises(ProtocolError, match="FP16 has no typed contents field: send it raw"):
        _parse(fp16, (TensorSpec("h", "FP16", (-1,)),))


def test_the_response_carries_raw_contents_tritonclient_reads() -> None:
    parsed = InferRequest(
        id="r-9",
        inputs={},
        outputs=(RequestedOutput("logits", True), RequestedOutput("label", True, 2)),
    )
    logits = np.array([[0.1, 0.7, 0.2]], dtype=np.float32)
    results = {"logits": logits, "label": logits}
    resp = encode_model_infer_response(
        "m", "1", parsed, results, {"logits": "FP32", "label": "FP32"}, specs=OUTPUTS[:1]
    )
    assert (resp.model_name, resp.model_version, resp.id) == ("m", "1", "r-9")
    assert [(o.name, o.datatype, list(o.shape)) for o in resp.outputs] == [
        ("logits", "FP32", [1, 3]),
        ("label", "BYTES", [1, 2]),
    ]
    np.testing.assert_array_equal(
        np.frombuffer(resp.raw_output_contents[0], np.float32).reshape(1, 3), logits
    )
    classes = np.array([[b"0.700000:1", b"0.200000:2"]], dtype=object)
    assert resp.raw_output_contents[1] == bytes_to_binary(classes)


_TYPES = sorted(DATATYPES)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    datatype=st.sampled_from([*_TYPES, "BYTES", "", "fp32"]),
    shape=st.lists(st.integers(-(2**63), 2**63 - 1) | st.integers(0, 6), max_size=5),
    raw=st.lists(st.binary(max_size=64), max_size=3),
    ints=st.lists(st.integers(-(2**31), 2**31 - 1), max_size=8),
    floats=st.lists(st.floats(width=32), max_size=8),
    names=st.lists(st.sampled_from(["x", "y", "z"]), min_size=0, max_size=3),
)
def test_any_bytes_and_shapes_give_arrays_or_a_protocol_error(
    datatype: str,
    shape: list[int],
    raw: list[bytes],
    ints: list[int],
    floats: list[float],
    names: list[str],
) -> None:
    """Whatever a client declares, the decoder answers with arrays that match the declaration
    or a ProtocolError; it never allocates from a declared size, and never fails otherwise."""
    specs = (TensorSpec("x", "INT32", (-1,)), TensorSpec("y", "FP32", (-1, 2)))
    req = pb.ModelInferRequest()
    for name in names:
        tensor = req.inputs.add(name=name, datatype=datatype, shape=shape)
        tensor.contents.int_contents.extend(ints)
        tensor.contents.fp32_contents.extend(floats)
    req.raw_input_contents.extend(raw)
    try:
        parsed = parse_model_infer_request(req, specs, OUTPUTS, model="m")
    except ProtocolError as exc:
        assert str(exc)
        return
    for tensor in req.inputs:
        arr = parsed.inputs[tensor.name]
        assert arr.shape == tuple(tensor.shape)
        assert arr.dtype == DATATYPES[tensor.datatype]


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_any_wire_bytes_decode_to_arrays_or_a_protocol_error(data: bytes) -> None:
    """Bytes off the wire that protobuf accepts as a ModelInferRequest still decode safely."""
    try:
        req = pb.ModelInferRequest.FromString(data)
    except Exception:  # protobuf's DecodeError: grpcio answers these itself
        return
    try:
        parse_model_infer_request(req, INPUTS, OUTPUTS, model="m")
    except ProtocolError:
        pass


def test_custom_request_parameters_are_the_models() -> None:
    """Parameters other than the server's own reach the model (Triton's parameters
    extension); the server's own do not."""
    req = _request()
    req.parameters["bogus"].MergeFrom(pb.InferParameter(bool_param=True))
    req.parameters["temperature"].MergeFrom(pb.InferParameter(double_param=0.5))
    req.parameters["timeout"].MergeFrom(pb.InferParameter(int64_param=10**6))
    parsed = _parse(req)
    assert parsed.parameters == {"bogus": True, "temperature": 0.5}
    assert parsed.timeout == 1.0


def test_perf_analyzers_request_asks_nothing_of_the_server() -> None:
    """perf_analyzer's request: only Triton's own parameter, both outputs named; the answer
    is the defaults, and a model's parameter beside it still reaches the model."""
    req = _request()
    req.parameters["triton_enable_empty_final_response"].bool_param = True
    req.outputs.add(name="label")
    req.outputs.add(name="logits")
    parsed = _parse(req)
    assert (parsed.timeout, parsed.priority, parsed.sequence, parsed.parameters) == (
        None, 0, None, {},
    )  # fmt: skip
    assert parsed.outputs == (RequestedOutput("label", True), RequestedOutput("logits", True))
    req.parameters["temperature"].double_param = 0.5
    assert _parse(req).parameters == {"temperature": 0.5}


def test_each_model_gets_its_own_tensors() -> None:
    """Requests for models alternate; each is checked against its own model's inputs and
    outputs, never another's (of the same length, or equal)."""
    other_outputs = (TensorSpec("score", "FP32", (-1, 1)), TensorSpec("rank", "INT64", (-1,)))
    other_inputs = (INPUTS[0], TensorSpec("extra", "BOOL", (-1, 2)))
    named = _request()
    named.outputs.add(name="logits")
    for _ in range(3):
        for outs in (OUTPUTS, other_outputs, tuple(OUTPUTS)):
            parsed = parse_model_infer_request(_request(), INPUTS, outs, model="m")
            assert [o.name for o in parsed.outputs] == [s.name for s in outs]
        with pytest.raises(ProtocolError, match="unexpected inference output 'logits'"):
            parse_model_infer_request(named, INPUTS, other_outputs, model="m")
        assert [o.name for o in _parse(named).outputs] == ["logits"]
        with pytest.raises(ProtocolError, match="unknown input 'mask'"):
            parse_model_infer_request(_request(), other_inputs, OUTPUTS, model="m")
        assert _parse(_request()).inputs.keys() == {"pixels", "mask"}


def test_an_empty_shape_too_big_for_any_array_is_a_protocol_error() -> None:
    """Hypothesis found it: INT32 of shape [0, 2**61] holds no elements, but numpy can make no
    array of it ("array is too big"): a ProtocolError to that caller, not a ValueError."""
    specs = (TensorSpec("x", "INT32", (-1, -1)),)
    req = pb.ModelInferRequest()
    req.inputs.add(name="x", datatype="INT32", shape=[0, 2**61])
    with pytest.raises(ProtocolError, match=r"shape \[0,2305843009213693952\] holds no elements"):
        parse_model_infer_request(req, specs, OUTPUTS, model="m")
    req.inputs[0].shape[:] = [0, 2**60]  # 2**62 bytes: an empty array numpy can make
    assert parse_model_infer_request(req, specs, OUTPUTS, model="m").inputs["x"].shape == (
        0,
        2**60,
    )

"""Repeated ``ModelInferRequest`` messages decoded from a kept plan give what protobuf's parse
and the full checks give: the same request, or the same typed error (hypothesis,
differentially, over messages that repeat with new tensors and ids, for models that
alternate); any bytes raise protobuf's DecodeError or our typed errors, nothing else."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings, strategies as st

from model_runtime.errors import ModelRuntimeError
from model_runtime.server.grpc.codec import parse_model_infer_request
from model_runtime.server.grpc.request_plan import WireRequest, read_model_infer_request
from model_runtime.server.tensors.request import TensorSpec
from model_runtime.server.triton import grpc_service_pb2 as pb

pytestmark = pytest.mark.timeout(120)

MODELS = (
    (
        (TensorSpec("pixels", "FP32", (-1, 4)), TensorSpec("mask", "BOOL", (-1, 2))),
        (TensorSpec("logits", "FP32", (-1, 3)), TensorSpec("label", "INT64", (-1,))),
    ),
    ((TensorSpec("text", "BYTES", (-1,)),), (TensorSpec("logits", "FP32", (-1, 3)),)),
)
_NAMES = ("pixels", "mask", "text", "other")
_SIZES = {"FP32": 4, "BOOL": 1, "INT32": 4}
_PARAMETERS = st.sampled_from(
    [
        ("timeout", pb.InferParameter(int64_param=2500)),
        ("timeout", pb.InferParameter(string_param="soon")),
        ("priority", pb.InferParameter(uint64_param=2)),
        ("triton_enable_empty_final_response", pb.InferParameter(bool_param=True)),
        ("triton_other", pb.InferParameter(bool_param=True)),
        ("temperature", pb.InferParameter(double_param=0.5)),
        ("sequence_id", pb.InferParameter(string_param="s-1")),
        ("empty", pb.InferParameter()),
    ]
)


_RAW = b"\x3a"  # raw_input_contents: field 7, length-delimited


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


@st.composite
def _tensor_data(draw: Any, datatype: str, shape: list[int]) -> bytes:
    """Raw contents for an input: mostly of the size its shape asks, sometimes not."""
    count = int(np.prod(shape, dtype=np.int64))
    if draw(st.integers(0, 9)) == 0:
        return bytes(draw(st.binary(max_size=20)))
    if datatype == "BYTES":
        items = draw(st.lists(st.binary(max_size=3), min_size=count, max_size=count))
        return b"".join(len(i).to_bytes(4, "little") + i for i in items)
    if datatype == "BOOL":
        values = st.integers(0, 1) if draw(st.integers(0, 9)) else st.integers(0, 2)
        return bytes(draw(st.lists(values, min_size=count, max_size=count)))
    size = count * _SIZES[datatype]
    return bytes(draw(st.binary(min_size=size, max_size=size)))


@st.composite
def _messages(draw: Any) -> tuple[bytes, bytes, int]:
    """Two serialized requests alike but for their raw contents and ids, and the model whose
    inputs they were drawn for (or any model)."""
    req = pb.ModelInferRequest(model_name=draw(st.sampled_from(["m", ""])))
    for key, value in draw(st.lists(_PARAMETERS, max_size=2)) if draw(st.booleans()) else ():
        req.parameters[key].CopyFrom(value)
    kinds = []
    valid = draw(st.sampled_from([None, 0, 1, 1]))
    if valid is None:  # anything
        tensors = [
            (
                draw(st.sampled_from(_NAMES)),
                draw(st.sampled_from(["FP32", "BOOL", "INT32", "BYTES"])),
                draw(st.lists(st.integers(0, 3), max_size=2)),
            )
            for _ in range(draw(st.integers(0, 3)))
        ]
    else:  # what one of the models takes, in any batch
        batch = draw(st.integers(0, 2))
        tensors = [
            (s.name, s.datatype, [batch if d == -1 else d for d in s.shape])
            for s in draw(st.permutations(MODELS[valid][0]))
        ]
    for name, datatype, shape in tensors:
        item = req.inputs.add(name=name, datatype=datatype, shape=shape)
        extra = draw(st.integers(0, 19))
        if extra == 0:
            item.contents.fp32_contents.append(1.0)
        elif extra == 1:
            item.parameters["binary_data_size"].int64_param = 4
        elif extra == 2:
            item.parameters["shared_memory_region"].string_param = "r"
            item.parameters["shared_memory_byte_size"].int64_param = 4
        kinds.append((datatype, shape))
    for _ in range(draw(st.integers(0, 2))):
        out = req.outputs.add(name=draw(st.sampled_from(["logits", "label", "label", "nope"])))
        if draw(st.integers(0, 9)) == 0:
            out.parameters["classification"].int64_param = 2
    raw_count = draw(st.sampled_from([len(kinds)] * 4 + [max(0, len(kinds) - 1)]))
    messages = []
    for _ in range(2):
        one = pb.ModelInferRequest()
        one.CopyFrom(req)
        request_id = draw(st.sampled_from(["", "r-1", "r-2", "é"]))
        if request_id:
            one.id = request_id
        raws = [draw(_tensor_data(datatype, shape)) for datatype, shape in kinds[:raw_count]]
        fields = b"".join(_RAW + _varint(len(raw)) + raw for raw in raws)
        data = one.SerializeToString()
        form = draw(st.integers(0, 11))
        if form == 0:  # a second id field, after the first
            data = b"\x1a\x02r9" + data + fields
        elif form == 1:  # raw contents first (protobuf reads fields in any order)
            data = fields + data
        elif form == 2:  # a field this schema does not know
            data += b"\x4a\x01x" + fields
        elif form == 3 and raws:  # something after the raw contents
            data += fields + b"\x32\x07\x0a\x05label"  # (one more output)
        else:
            data += fields
        messages.append(data)
    return messages[0], messages[1], draw(st.integers(0, 1)) if valid is None else valid


def _outcome(parse: Any) -> Any:
    try:
        request = parse()
    except (DecodeError, ModelRuntimeError) as exc:
        return (type(exc), str(exc))
    return (
        request.id,
        {
            name: (
                arr.dtype,
                arr.shape,
                arr.tolist() if arr.dtype == object else arr.tobytes(),
                arr.flags.writeable,
            )
            for name, arr in request.inputs.items()
        },
        request.outputs,
        request.parameters,
        (request.timeout, request.priority, request.sequence, request.leases),
    )


def _reference(data: bytes, model: int) -> Any:
    inputs, outputs = MODELS[model]

    def parse() -> Any:
        message = pb.ModelInferRequest.FromString(data)
        return parse_model_infer_request(message, inputs, outputs, model="m")

    return _outcome(parse)


def _ours(data: bytes, model: int) -> Any:
    inputs, outputs = MODELS[model]

    def parse() -> Any:
        request = read_model_infer_request(memoryview(data))
        message = pb.ModelInferRequest.FromString(data)
        assert (request.model_name, request.model_version) == (
            message.model_name, message.model_version,
        )  # fmt: skip
        return parse_model_infer_request(request, inputs, outputs, model="m")

    return _outcome(parse)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pair=_messages(), models=st.lists(st.integers(0, 1), max_size=2))
def test_a_kept_plan_decodes_as_protobuf_and_the_checks_do(
    pair: tuple[bytes, bytes, int], models: list[int]
) -> None:
    first, second, drawn_for = pair
    for model in [drawn_for, *models]:
        for data in (first, second, first, second):
            assert _ours(data, model) == _reference(data, model)


def test_the_common_request_is_read_from_a_plan_once_seen() -> None:
    """The form plans are for (raw contents last) is read as such: a repeat gets the plan."""
    inputs = (TensorSpec("pixels", "FP32", (-1, 4)), TensorSpec("mask", "BOOL", (-1, 2)))
    outputs = (TensorSpec("logits", "FP32", (-1, 3)),)  # (a model of its own: no plan yet)
    req = pb.ModelInferRequest(model_name="once", id="a")
    req.inputs.add(name="pixels", datatype="FP32", shape=(1, 4))
    req.inputs.add(name="mask", datatype="BOOL", shape=(1, 2))
    req.raw_input_contents.extend([np.arange(4, dtype=np.float32).tobytes(), b"\x01\x00"])
    first = read_model_infer_request(req.SerializeToString())
    assert isinstance(first, WireRequest) and first.plan(inputs, outputs) is None
    parse_model_infer_request(first, inputs, outputs, model="m")
    req.id = "b"
    req.raw_input_contents[1] = b"\x00\x01"
    again = read_model_infer_request(req.SerializeToString())
    assert isinstance(again, WireRequest) and again.plan(inputs, outputs) is not None
    parsed = parse_model_infer_request(again, inputs, outputs, model="m")
    assert parsed.id == "b" and parsed.inputs["mask"].tolist() == [[False, True]]
    assert again.plan(*MODELS[1]) is None  # another model's: its own checks first


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200), st.integers(0, 1))
def test_any_bytes_raise_only_typed_errors(data: bytes, model: int) -> None:
    inputs, outputs = MODELS[model]
    for _ in range(2):
        try:
            request = read_model_infer_request(data)
        except DecodeError:
            return
        try:
            parse_model_infer_request(request, inputs, outputs, model="m")
        except ModelRuntimeError:
            pass


def test_a_field_after_the_raw_contents_is_no_repeat() -> None:
    """A message that is a seen one plus a field after its raw contents is parsed as itself:
    here one more requested output."""
    inputs = (TensorSpec("pixels", "FP32", (-1, 1)),)
    outputs = (TensorSpec("logits", "FP32", (-1, 1)), TensorSpec("label", "INT64", (-1,)))
    req = pb.ModelInferRequest(model_name="trailer")
    req.inputs.add(name="pixels", datatype="FP32", shape=(1, 1))
    req.outputs.add(name="logits")
    req.raw_input_contents.append(b"\0\0\0\0")
    data = req.SerializeToString()
    for message in (data, data, data + b"\x32\x07\x0a\x05label"):
        parsed = parse_model_infer_request(
            read_model_infer_request(message), inputs, outputs, model="m"
        )
        expected = pb.ModelInferRequest.FromString(message).outputs
        assert [o.name for o in parsed.outputs] == [o.name for o in expected]

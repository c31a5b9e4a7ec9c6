"""The protocol codec: JSON and binary requests decode right; anything malformed is a 400-class
``ProtocolError`` with a message; declared sizes are never trusted (hypothesis-fuzzed)."""

from __future__ import annotations

import json
import re
import tracemalloc
from typing import Any
from unittest.mock import patch

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from model_runtime.errors import ProtocolError
from model_runtime.sequences import SequenceStep
from model_runtime.server.tensors import jsonnumbers, jsontape
from model_runtime.server.tensors.classification import bytes_to_binary, classify
from model_runtime.server.tensors.codec import parse_infer_request
from model_runtime.server.tensors.datatypes import DATATYPES, datatype_of
from model_runtime.server.tensors.encode import encode_infer_response
from model_runtime.server.tensors.parameters import execute_priority, load_request_parameters
from model_runtime.server.tensors.request import InferRequest, RequestedOutput, TensorSpec

pytestmark = pytest.mark.timeout(60)

INPUTS = (TensorSpec("pixels", "FP32", (-1, 4)), TensorSpec("mask", "BOOL", (-1, 2)))
OUTPUTS = (TensorSpec("logits", "FP32", (-1, 3)), TensorSpec("label", "INT64", (-1,)))


def _doc(**overrides: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "inputs": [
            {"name": "pixels", "datatype": "FP32", "shape": [2, 4], "data": list(range(8))},
            {"name": "mask", "datatype": "BOOL", "shape": [2, 2], "data": [True, False] * 2},
        ]
    }
    doc.update(overrides)
    return doc


def _parse(doc: Any, binary: bytes = b"", header: bool = False) -> InferRequest:
    head = json.dumps(doc).encode()
    length = len(head) if header or binary else None
    return parse_infer_request(head + binary, length, INPUTS, OUTPUTS, model="m")


def test_flat_json_decodes_to_typed_arrays() -> None:
    req = _parse(_doc(id="r-1", parameters={"priority": 2, "timeout": 2500}))
    assert req.id == "r-1"
    assert (req.priority, req.timeout) == (2, 0.0025)
    np.testing.assert_array_equal(
        req.inputs["pixels"], np.arange(8, dtype=np.float32).reshape(2, 4)
    )
    assert req.inputs["pixels"].dtype == np.float32
    assert req.inputs["mask"].dtype == np.bool_
    assert [o.name for o in req.outputs] == ["logits", "label"]
    assert not any(o.binary for o in req.outputs)


def test_nested_json_equals_flat() -> None:
    doc = _doc()
    doc["inputs"][0]["data"] = [[0, 1, 2, 3], [4, 5, 6, 7]]
    doc["inputs"][1]["data"] = [[True, False], [True, False]]
    nested = _parse(doc)
    flat = _parse(_doc())
    for name in ("pixels", "mask"):
        np.testing.assert_array_equal(nested.inputs[name], flat.inputs[name])


def test_binary_inputs_are_views_of_the_body() -> None:
    pixels = np.arange(8, dtype="<f4").reshape(2, 4)
    mask = np.array([[1, 0], [0, 1]], dtype=np.uint8)
    doc = _doc()
    doc["inputs"][0] = {
        "name": "pixels",
        "datatype": "FP32",
        "shape": [2, 4],
        "parameters": {"binary_data_size": pixels.nbytes},
    }
    doc["inputs"][1] = {
        "name": "mask",
        "datatype": "BOOL",
        "shape": [2, 2],
        "parameters": {"binary_data_size": 4},
    }
    req = _parse(doc, pixels.tobytes() + mask.tobytes())
    np.testing.assert_array_equal(req.inputs["pixels"], pixels)
    np.testing.assert_array_equal(req.inputs["mask"], mask.astype(bool))
    assert not req.inputs["pixels"].flags.owndata


def test_output_selection_and_binary_flags() -> None:
    req = _parse(
        _doc(
            outputs=[{"name": "label", "parameters": {"binary_data": True}}],
            parameters={"binary_data_output": False},
        )
    )
    assert req.outputs == (RequestedOutput("label", True),)
    req = _parse(_doc(parameters={"binary_data_output": True}))
    assert all(o.binary for o in req.outputs)


def test_response_json_and_binary_round_trip() -> None:
    logits = np.arange(6, dtype=np.float32).reshape(2, 3)
    label = np.array([2, 1], dtype=np.int64)
    types = {"logits": "FP32", "label": "INT64"}
    req = InferRequest(
        "abc", {}, (RequestedOutput("logits", False), RequestedOutput("label", True))
    )
    body, length = encode_infer_response("m", "1", req, {"logits": logits, "label": label}, types)
    assert length is not None
    head = json.loads(body[:length])
    assert head["id"] == "abc" and head["model_name"] == "m"
    assert head["outputs"][0] == {
        "name": "logits",
        "datatype": "FP32",
        "shape": [2, 3],
        "data": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0],
    }
    assert head["outputs"][1]["parameters"] == {"binary_data_size": 16}
    np.testing.assert_array_equal(np.frombuffer(body[length:], "<i8"), label)
    body, length = encode_infer_response(
        "m",
        "1",
        InferRequest(None, {}, (RequestedOutput("logits", False),)),
        {"logits": logits},
        types,
    )
    assert length is None and "id" not in json.loads(body)


def test_datatype_names_map_both_ways() -> None:
    for name, dtype in DATATYPES.items():
        assert datatype_of(dtype) == name
        assert datatype_of(dtype.newbyteorder(">")) == name
    with pytest.raises(ValueError):
        datatype_of(np.dtype(np.complex64))


BAD_CASES: list[tuple[str, Any, str]] = [
    ("not an object", [1, 2], "JSON object"),
    ("no inputs", {"inputs": []}, "expected 2 inputs but got 0 inputs"),  # Triton's text
    ("unknown input", _doc(inputs=[{"name": "nope"}]), "unknown input 'nope'"),
    ("wrong datatype name", None, "unknown datatype 'FLOAT'"),
    ("mismatched datatype", None, "does not match the model's FP32"),
    ("BYTES", None, "BYTES is not supported"),
    ("short data", None, "needs 8 elements"),
    ("negative dim", None, "shape"),
    ("string data", None, "must be numbers"),
    ("missing input", None, "missing required input(s) ['mask']"),
    (
        "duplicate input",
        None,
        "[request id: <id_unknown>] input 'pixels' already exists in request",
    ),
    ("unknown output", _doc(outputs=[{"name": "zzz"}]), "unexpected inference output 'zzz'"),
    ("bad id", _doc(id=7), "'id' must be a string"),
    ("bad parameters", _doc(parameters=[1]), "'parameters' must be a JSON object"),
    ("no data", None, "no 'data'"),
    ("int out of range", None, "out of the"),
    ("float for bool", None, "true/false"),
]


def _bad_doc(case: str) -> Any:
    doc = _doc()
    p, m = doc["inputs"]
    match case:
        case "wrong datatype name":
            p["datatype"] = "FLOAT"
        case "mismatched datatype":
            p["datatype"] = "INT32"
        case "BYTES":
            p["datatype"] = "BYTES"
        case "short data":
            p["data"] = [1.0] * 7
        case "negative dim":
            p["shape"] = [-2, -4]
        case "string data":
            p["data"] = ["1"] * 8
        case "missing input":
            doc["inputs"] = [p]
        case "duplicate input":
            doc["inputs"] = [p, p, m]
        case "no data":
            del p["data"]
        case "int out of range":
            return None
        case "float for bool":
            m["data"] = [1.5] * 4
    return doc


@pytest.mark.parametrize(("case", "doc", "message"), BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_bad_requests_name_the_defect(case: str, doc: Any, message: str) -> None:
    doc = doc if doc is not None else _bad_doc(case)
    if doc is None:  # integer range: needs an integer model input
        specs = (TensorSpec("x", "UINT8", (-1,)),)
        body = json.dumps(
            {"inputs": [{"name": "x", "datatype": "UINT8", "shape": [1], "data": [300]}]}
        )
        with pytest.raises(ProtocolError, match="out of the UINT8 range"):
            parse_infer_request(body.encode(), None, specs, OUTPUTS)
        return
    with pytest.raises(ProtocolError) as info:
        _parse(doc)
    assert message in str(info.value)


def test_malformed_json_and_header_lengths() -> None:
    with pytest.raises(ProtocolError, match="not valid JSON"):
        parse_infer_request(b"{", None, INPUTS, OUTPUTS)
    with pytest.raises(ProtocolError, match="not valid JSON"):
        parse_infer_request(b"[" * 100_000, None, INPUTS, OUTPUTS)
    with pytest.raises(ProtocolError, match="Inference-Header-Content-Length"):
        parse_infer_request(b"{}", 5, INPUTS, OUTPUTS)


def _binary_doc(size: int, shape: list[int]) -> dict[str, Any]:
    return {
        "inputs": [
            {"name": "pixels", "datatype": "FP32", "shape": shape,
             "parameters": {"binary_data_size": size}},
            {"name": "mask", "datatype": "BOOL", "shape": [1, 2], "data": [True, True]},
        ]
    }  # fmt: skip


def test_binary_sizes_that_do_not_add_up() -> None:
    with pytest.raises(ProtocolError) as info:
        _parse(_binary_doc(15, [1, 4]), b"\0" * 15)
    assert str(info.value) == (  # Triton's words, which clients match on
        "[request id: <id_unknown>] input byte size mismatch for input 'pixels' for model 'm'. "
        "Expected 16, got 15"
    )
    with pytest.raises(ProtocolError, match="more than"):
        _parse(_binary_doc(16, [1, 4]), b"\0" * 8)
    with pytest.raises(ProtocolError, match="add up to 16 bytes, but 20"):
        _parse(_binary_doc(16, [1, 4]), b"\0" * 20)
    with pytest.raises(ProtocolError, match="add up to 0 bytes, but 3"):
        _parse(_doc(), b"abc")


def test_huge_declared_shape_allocates_nothing() -> None:
    huge = [2**30, 2**30]
    doc = _doc()
    doc["inputs"][0]["shape"] = huge
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError, match="needs"):
            _parse(doc)
        with pytest.raises(ProtocolError, match="input byte size mismatch"):
            _parse(_binary_doc(16, huge), b"\0" * 16)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    doc["inputs"][0]["shape"] = [1] * 40
    with pytest.raises(ProtocolError, match="dimensions"):
        _parse(doc)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=30,
)  # fmt: skip
INPUT_ENTRY = st.fixed_dictionaries(
    {"name": st.sampled_from(["pixels", "mask", "other"])},
    optional={
        "datatype": st.sampled_from([*DATATYPES, "BYTES", "FLOAT", 3]),
        "shape": st.lists(st.integers(-3, 2**62), max_size=4) | JSON_VALUES,
        "data": JSON_VALUES,
        "parameters": st.fixed_dictionaries(
            {}, optional={"binary_data_size": st.integers(-5, 2**62) | JSON_VALUES}
        ),
    },
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    inputs=st.lists(INPUT_ENTRY, max_size=3) | JSON_VALUES,
    extra=st.dictionaries(st.sampled_from(["id", "outputs", "parameters"]), JSON_VALUES),
    binary=st.binary(max_size=64),
    header_delta=st.none() | st.integers(-5, 5),
)
def test_fuzzed_requests_decode_or_raise_protocol_error(
    inputs: Any, extra: dict[str, Any], binary: bytes, header_delta: int | None
) -> None:
    head = json.dumps({"inputs": inputs, **extra}).encode()
    length = None if header_delta is None else len(head) + header_delta
    try:
        req = parse_infer_request(head + binary, length, INPUTS, OUTPUTS)
    except ProtocolError as exc:
        assert str(exc)
        return
    assert set(req.inputs) == {"pixels", "mask"}
    for spec in INPUTS:
        assert req.inputs[spec.name].dtype == DATATYPES[spec.datatype]


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_fuzzed_bytes_never_escape_as_other_errors(body: bytes) -> None:
    try:
        parse_infer_request(body, None, INPUTS, OUTPUTS)
    except ProtocolError:
        pass


INT_LIMITS = [
    ("UINT8", -1),
    ("UINT8", 256),
    ("INT8", -129),
    ("INT8", 128),
    ("UINT16", 65536),
    ("INT16", -32769),
    ("UINT32", -1),
    ("INT32", 2**31),
    ("UINT64", -1),
    ("UINT64", 2**64),
    ("INT64", 2**63),
    ("INT64", -(2**63) - 1),
]


def _int_request(datatype: str, data: list[Any]) -> bytes:
    doc = {"inputs": [{"name": "ids", "datatype": datatype, "shape": [len(data)], "data": data}]}
    return json.dumps(doc).encode()


@pytest.mark.parametrize(("datatype", "value"), INT_LIMITS, ids=[f"{d}={v}" for d, v in INT_LIMITS])
def test_json_integers_outside_the_datatype_are_refused_not_wrapped(
    datatype: str, value: int
) -> None:
    specs = (TensorSpec("ids", datatype, (-1,)),)
    info = np.iinfo(DATATYPES[datatype])
    with pytest.raises(ProtocolError) as raised:
        parse_infer_request(_int_request(datatype, [0, value, 1]), None, specs, OUTPUTS)
    assert str(raised.value) == (
        f"input 'ids': value {value} is out of the {datatype} range [{info.min}, {info.max}]"
    )
    # The limits themselves are values like any other, and arrive exactly.
    edges = [int(info.min), int(info.max)]
    req = parse_infer_request(_int_request(datatype, edges), None, specs, OUTPUTS)
    assert req.inputs["ids"].dtype == DATATYPES[datatype]
    assert [int(v) for v in req.inputs["ids"]] == edges


@pytest.mark.parametrize("datatype", ["INT64", "UINT64"])
def test_json_integers_past_int64_are_checked_exactly(datatype: str) -> None:
    # numpy makes float64, not an integer array, of [1, 2**63] and of [-1, 2**63]: the first
    # is a valid UINT64 tensor (exactly, not rounded), the second fits no datatype.
    specs = (TensorSpec("ids", datatype, (-1,)),)
    big = [1, 2**63, 2**64 - 1]
    if datatype == "UINT64":
        req = parse_infer_request(_int_request(datatype, big), None, specs, OUTPUTS)
        assert req.inputs["ids"].dtype == np.uint64
        assert [int(v) for v in req.inputs["ids"]] == big
    else:
        with pytest.raises(ProtocolError, match=f"value {2**64 - 1} is out of the INT64 range"):
            parse_infer_request(_int_request(datatype, big), None, specs, OUTPUTS)
    bad = -1 if datatype == "UINT64" else 2**63
    with pytest.raises(ProtocolError, match=f"input 'ids': value {bad} is out of the {datatype}"):
        parse_infer_request(_int_request(datatype, [-1, 2**63]), None, specs, OUTPUTS)
    with pytest.raises(ProtocolError, match=f"input 'ids': {datatype} data must be integers"):
        parse_infer_request(_int_request(datatype, [1, 2.5]), None, specs, OUTPUTS)


def test_an_output_requested_twice_is_refused() -> None:
    doc = _doc(outputs=[{"name": "label"}, {"name": "logits"}, {"name": "label"}])
    with pytest.raises(ProtocolError) as info:
        _parse(doc)
    assert str(info.value) == "[request id: <id_unknown>] output 'label' already exists in request"
    doc = _doc(
        outputs=[
            {"name": "label", "parameters": {"binary_data": True}},
            {"name": "label", "parameters": {"binary_data": False}},
        ]
    )
    with pytest.raises(ProtocolError, match=re.escape("output 'label' already exists")):
        _parse(doc)


def test_two_binary_outputs_follow_the_json_in_the_requested_order() -> None:
    logits = np.arange(6, dtype=np.float32).reshape(2, 3) / 4
    label = np.array([7, -3], dtype=np.int64)
    types = {"logits": "FP32", "label": "INT64"}
    results = {"logits": logits, "label": label}
    # Asked for in the reverse of the model's order: the wire follows the request.
    req = _parse(
        _doc(
            outputs=[{"name": "label"}, {"name": "logits"}],
            parameters={"binary_data_output": True},
        )
    )
    body, length = encode_infer_response("m", "1", req, results, types)
    assert length is not None
    head = json.loads(body[:length])
    assert [(o["name"], o["parameters"]) for o in head["outputs"]] == [
        ("label", {"binary_data_size": 16}),
        ("logits", {"binary_data_size": 24}),
    ]
    assert all("data" not in o for o in head["outputs"])
    assert len(body) == length + 16 + 24
    assert body[length : length + 16] == label.astype("<i8").tobytes()
    assert body[length + 16 :] == logits.astype("<f4").tobytes()
    # A client walking the chunks by their sizes, in JSON order, gets each tensor back.
    offset = length
    for entry in head["outputs"]:
        size = entry["parameters"]["binary_data_size"]
        got = np.frombuffer(body[offset : offset + size], DATATYPES[entry["datatype"]])
        np.testing.assert_array_equal(got.reshape(entry["shape"]), results[entry["name"]])
        offset += size
    # Mixed: a JSON output between two binary ones takes no bytes on the wire.
    req = InferRequest(
        None,
        {},
        (
            RequestedOutput("logits", True),
            RequestedOutput("label", False),
            RequestedOutput("extra", True),
        ),
    )
    extra = np.array([1, 2, 3], dtype=np.int64)
    body, length = encode_infer_response(
        "m", "1", req, {**results, "extra": extra}, {**types, "extra": "INT64"}
    )
    assert length is not None
    head = json.loads(body[:length])
    assert head["outputs"][1]["data"] == [7, -3]
    assert body[length:] == logits.astype("<f4").tobytes() + extra.tobytes()


# -- big JSON arrays: cut out of the document, converted slice by slice ---------------------------


def _big(data: Any, shape: list[int], datatype: str = "FP32") -> bytes:
    doc = {"inputs": [{"name": "x", "datatype": datatype, "shape": shape, "data": data}]}
    return json.dumps(doc, separators=(",", ":")).encode()


def _parse_big(body: bytes, datatype: str = "FP32", dims: int = 2) -> InferRequest:
    specs = (TensorSpec("x", datatype, (-1,) * dims),)
    return parse_infer_request(body, None, specs, OUTPUTS)


@pytest.mark.parametrize("nested", [False, True], ids=["flat", "nested"])
def test_a_big_json_tensor_costs_about_its_array_not_python_lists(nested: bool) -> None:
    rng = np.random.default_rng(1)
    x64 = rng.integers(0, 10, (25_000, 64)) / 10  # "0.3": the costliest text per number
    x = x64.astype(np.float32)
    body = _big(x64.tolist() if nested else x64.ravel().tolist(), [25_000, 64])
    assert len(body) > 6 << 20
    tracemalloc.start()
    try:
        req = _parse_big(body)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(req.inputs["x"], x)
    # The tensor (6.4 MB) and one slice's lists; a list of Python floats alone would be 51 MB.
    assert peak < x.nbytes + (8 << 20), peak


def test_big_arrays_decode_like_small_ones() -> None:
    rng = np.random.default_rng(2)
    for datatype, values in [
        ("FP64", rng.standard_normal(40_000)),
        ("INT64", rng.integers(-(2**62), 2**62, 40_000)),
        ("UINT8", rng.integers(0, 256, 40_000)),
        ("BOOL", rng.integers(0, 2, 40_000).astype(bool)),
    ]:
        body = _big(values.tolist(), [200, 200], datatype)
        got = _parse_big(body, datatype).inputs["x"]
        assert got.dtype == DATATYPES[datatype]
        np.testing.assert_array_equal(got.ravel(), values.astype(DATATYPES[datatype]))


BIG = ",".join(["1"] * 30_000)
BAD_BIG = [
    ("[" + BIG + ",1.2.3]", "not valid JSON"),
    ("[" + BIG + ",,1]", "not valid JSON"),
    ("[" + BIG + ",]", "not valid JSON"),
    ("[," + BIG + "]", "not valid JSON"),
    ("[" + BIG + ",01]", "not valid JSON"),
    ("[" + BIG + ",+1]", "not valid JSON"),
    ("[" + BIG + "]", "shape [40000] needs 40000 elements, 'data' has 30000"),
    ("[" + BIG + "," + BIG + "]", "'data' has more than the 40000 elements"),
    ("[" + BIG + "," + ",".join(["1"] * 9_999) + ",1.5]", "INT32 data must be integers"),
    ("[" + BIG + "," + ",".join(["1"] * 9_999) + ",2147483648]", "value 2147483648 is out"),
    ("[" + BIG + "," + ",".join(["1"] * 9_999) + ",36893488147419103232]",
     "value 36893488147419103232 is out of the INT32 range"),
    ("[" + BIG + "," + ",".join(["1"] * 9_999) + ",true]",
     "INT32 data must be integers, not true/false"),
]  # fmt: skip


@pytest.mark.parametrize(("data", "message"), BAD_BIG, ids=range(len(BAD_BIG)))
def test_big_arrays_refuse_what_small_ones_refuse(data: str, message: str) -> None:
    body = b'{"inputs":[{"name":"x","datatype":"INT32","shape":[40000],"data":%s}]}' % data.encode()
    with pytest.raises(ProtocolError, match=re.escape(message)):
        _parse_big(body, "INT32", dims=1)


def test_a_huge_claimed_shape_over_a_big_array_allocates_no_more_than_the_text_holds() -> None:
    body = _big([1] * 20_000, [2**40], "INT64")
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError, match="needs 1099511627776 elements, 'data' has 20000"):
            _parse_big(body, "INT64", dims=1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20


def test_data_inside_strings_is_not_cut() -> None:
    text = '\\"data\\":[' + ",".join(["5"] * 10_000) + "]"
    body = (
        b'{"id":"%s","inputs":[{"name":"x","datatype":"INT32","shape":[2],"data":[1,2]}]}'
        % text.encode()
    )
    req = _parse_big(body, "INT32", dims=1)
    assert req.id == text.replace("\\", "") and req.inputs["x"].tolist() == [1, 2]


FORGED = [
    '"\\u0000model-runtime:data:0"',
    '"\\u0000model-runtime:d\\u0061ta:0"',  # escaped past a scan of the raw bytes
    '"\\u0000model-runtime:data:x"',  # was a ValueError (int("x"))
    '"\\u0000model-runtime:data:-1"',  # was an IndexError
]


@pytest.mark.parametrize("forged", FORGED)
@pytest.mark.parametrize("big", [False, True], ids=["small", "big"])
def test_a_string_that_reads_as_a_cut_placeholder_is_a_string(big: bool, forged: str) -> None:
    # Were 500s (IndexError, ValueError), or, in a body with a cut array, that array's data
    # given to the other input: the decoder took the client's string for an array it had cut.
    pixels = ",".join(["0.5"] * (4 * 2_000 if big else 8))
    rows = 2_000 if big else 2
    body = (
        f'{{"inputs":[{{"name":"pixels","datatype":"FP32","shape":[{rows},4],"data":[{pixels}]}},'
        f'{{"name":"mask","datatype":"BOOL","shape":[{rows},2],"data":{forged}}}]}}'
    ).encode()
    for load in (jsontape.load, lambda _: None):  # through the tape, and the plain way
        with (
            patch.object(jsontape, "load", load),
            pytest.raises(ProtocolError, match="'data' must be a list"),
        ):
            parse_infer_request(bytearray(body), None, INPUTS, OUTPUTS)


def test_mixed_nesting_is_read_in_row_major_order_as_triton_does() -> None:
    specs = (TensorSpec("x", "INT32", (-1,)),)
    for data in ("[1,[2,3]]", "[[1],2,[[3]]]", "[1,[2],[]]"):
        body = b'{"inputs":[{"name":"x","datatype":"INT32","shape":[3],"data":%s}]}' % (
            data.encode()
        )
        fast = _outcome(body, specs)
        with patch.object(jsontape, "load", return_value=None):
            assert fast == _outcome(body, specs)
        if data != "[1,[2],[]]":
            assert fast == {"x": ("<i4", (3,), np.array([1, 2, 3], "<i4").tobytes())}


@pytest.mark.parametrize("junk", ["{}", '"a"'])
def test_json_outside_the_tensors_is_bounded(junk: str) -> None:
    """Past 4 MiB, JSON outside big 'data' arrays is read only while it holds at most 2**20
    values: each is a Python object once parsed, some 20x its text."""
    many = "[" + ",".join([junk] * (3 << 20)) + "]"
    body = b'{"outputs":%s,"inputs":[]}' % many.encode()
    with pytest.raises(ProtocolError, match=r"outside big 'data' arrays .* more than 1048576 "):
        parse_infer_request(body, None, INPUTS, OUTPUTS)


STRINGS = (TensorSpec("text", "BYTES", (-1,)),)


@pytest.mark.parametrize("text", ["A" * (6 << 20), ',[{:\\"' * (1 << 20)])
def test_a_large_string_in_json_is_read_whatever_it_holds(text: str) -> None:
    """Triton's L0_http test_large_string_in_json: a string costs its bytes once parsed, so
    JSON past 4 MiB outside 'data' arrays of numbers is read when it is a few big strings
    (commas, brackets and escaped quotes inside them are no values), and blanks are free."""
    doc = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": [text, "b"]}]}
    body = json.dumps(doc).encode()
    assert len(body) > jsonnumbers.MAX_SKELETON_BYTES
    got = parse_infer_request(body, None, STRINGS, OUTPUTS).inputs["text"]
    assert got.tolist() == [text.encode(), b"b"]
    padded = body[:-1] + b" " * (5 << 20) + b"}"
    assert parse_infer_request(padded, None, STRINGS, OUTPUTS).inputs["text"][1] == b"b"


def test_fp32_json_output_reads_as_the_float64_it_equals() -> None:
    third = np.array([1 / 3, 0.1], np.float32)
    req = InferRequest(None, {}, (RequestedOutput("logits", False),))
    body, _ = encode_infer_response("m", "1", req, {"logits": third}, {"logits": "FP32"})
    assert json.loads(body)["outputs"][0]["data"] == third.tolist()  # as Triton writes them


# -- parameters ----------------------------------------------------------------------------------


def test_priority_levels_map_onto_execute_highest_first() -> None:
    order = [execute_priority(p) for p in (1, 2, 3, 1000)]
    assert order == sorted(order, reverse=True) and order[-1] > execute_priority(0) == 0
    configured = [execute_priority(p, levels=5, default_level=3) for p in (1, 2, 3, 4, 5)]
    assert configured == [2, 1, 0, -1, -2]
    assert execute_priority(6, levels=5, default_level=3) == 0  # Triton: the default level


def test_values_that_mean_no_sequence_are_no_sequence() -> None:
    params = {"sequence_id": 0, "sequence_start": False, "sequence_end": False}
    req = _parse(_doc(parameters=params))
    assert req.priority == 0 and req.timeout is None and req.sequence is None
    # A sequence is the request's step; whether its model takes one is the server's to say.
    step = _parse(_doc(parameters={"sequence_id": "s-1", "sequence_end": True})).sequence
    assert step == SequenceStep("s-1", start=False, end=True)


# -- classification ------------------------------------------------------------------------------


def test_classification_orders_by_value_then_index() -> None:
    scores = np.array([[1, 5, 10, 4], [7, 7, 0, 7]], np.int32)
    top = classify(scores, 3, batched=True)
    assert top.tolist() == [[b"10:2", b"5:1", b"4:3"], [b"7:0", b"7:1", b"7:3"]]
    labelled = classify(np.array([0.25, 0.75], np.float32), 5, batched=False, labels=["a", "b"])
    # count past the classes: all; values as Triton writes them (C++ std::to_string)
    assert labelled.tolist() == [b"0.750000:1:b", b"0.250000:0:a"]
    assert bytes_to_binary(labelled) == (
        b"\x0c\x00\x00\x000.750000:1:b\x0c\x00\x00\x000.250000:0:a"
    )
    for refused in (np.array([True]), np.array([1], np.float16), np.array([b"x"], object)):
        with pytest.raises(ProtocolError, match="class result not available for output due to"):
            classify(refused, 1, batched=False)


def test_true_and_false_are_not_numbers() -> None:
    specs = (TensorSpec("ids", "INT32", (-1,)),)
    with pytest.raises(ProtocolError, match="INT32 data must be integers, not true/false"):
        parse_infer_request(_int_request("INT32", [1, True]), None, specs, OUTPUTS)
    with pytest.raises(ProtocolError, match="FP32 data must be numbers, not true/false"):
        _parse(_doc(inputs=[{"name": "pixels", "datatype": "FP32", "shape": [2],
                             "data": [1.5, False]}]))  # fmt: skip


@pytest.mark.parametrize("where", ["end", "middle"])
def test_an_empty_slot_where_a_slice_ends_is_refused(where: str) -> None:
    half = jsonnumbers.CHUNK_BYTES // 2
    # The first comma past the slice size is the empty slot's: the next slice starts empty.
    text = "1," * (half - 1) + "1" * 100 + ("," if where == "end" else ",,1")
    count = half + (0 if where == "end" else 1)
    body = b'{"inputs":[{"name":"x","datatype":"FP64","shape":[%d],"data":[%s]}]}' % (
        count,
        text.encode(),
    )
    with pytest.raises(ProtocolError, match="not valid JSON"):
        _parse_big(body, "FP64", dims=1)


def test_a_load_takes_a_config_override_and_refuses_files() -> None:
    assert load_request_parameters(b"", "m") is None
    assert load_request_parameters(b'{"parameters": {}}', "m") is None
    body = b'{"parameters": {"config": "{\\"max_batch_size\\": 8}"}}'
    assert load_request_parameters(body, "m") == '{"max_batch_size": 8}'
    with pytest.raises(ProtocolError, match="'config' must be a ModelConfig as a JSON string"):
        load_request_parameters(b'{"parameters": {"config": {"max_batch_size": 8}}}', "m")
    with pytest.raises(ProtocolError, match=re.escape("'file:1/model.onnx'")):
        load_request_parameters(b'{"parameters": {"file:1/model.onnx": "AAAA"}}', "m")


# -- the simdjson path (model_runtime.server.tensors.jsontape) decodes exactly as the plain one ----

SMALL_INTS = st.integers(-300, 300).map(str)
# Past 2**53 a double is not exact: 2**60 + 2**36 + 1 is another float32 by way of a double.
BIG_INTS = st.one_of(
    st.integers(2**53, 2**63),
    st.sampled_from([2**60 + 2**36 + 1, -(2**60) - 2**36 - 1, 2**53 + 1]),
).map(str)
NUMBER_TEXT = st.one_of(
    SMALL_INTS,
    BIG_INTS,
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.floats(-1e6, 1e6).map(lambda f: f"{f:.3e}"),
    st.sampled_from(["-0", "-0.0", "0", "1", "1E5", "1e400", "true", "false", "null", '"1.5"']),
)


def _arrays(element: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """Nested arrays of ``element``: rows, or rows and numbers side by side (Triton reads any
    nesting, row-major)."""
    return st.recursive(
        st.lists(element, max_size=6).map(lambda xs: "[" + ",".join(xs) + "]"),
        lambda rows: st.lists(rows | element, max_size=3).map(lambda xs: "[" + ",".join(xs) + "]"),
        max_leaves=4,
    )


# Arrays of one kind of number (what decodes) or of any mix (what mostly does not). The three
# recursive strategies are built once: made per draw (``sampled_from(...).flatmap``, the same
# choices) each was built and validated again, 2/3 of the test's CPU, and under load the test
# ran past its 60 s timeout, whose interruption mid-draw hypothesis reports as
# FlakyStrategyDefinition.
DATA_TEXT = st.one_of(_arrays(SMALL_INTS), _arrays(BIG_INTS), _arrays(NUMBER_TEXT))


@st.composite
def tape_documents(draw: st.DrawFn) -> tuple[bytes, tuple[TensorSpec, ...]]:
    """A request and the inputs of its model: one or two, of any fixed-size datatype."""
    fields = []
    datatypes = draw(
        st.lists(st.sampled_from(list(DATATYPES)), min_size=1, max_size=2, unique=True)
    )
    for datatype in datatypes:
        data = draw(DATA_TEXT)
        count = data.count(",") + 1 if any(c.isalnum() for c in data) else 0
        shape = draw(st.sampled_from([count, count + 1, max(count - 1, 0)]))
        entry = [
            f'"name": "x_{datatype.lower()}"',
            f'"datatype": "{datatype}"',
            f'"shape": [{shape}]',
            f'"data": {data}',
        ]
        if draw(st.booleans()):
            entry.append(f'"data": {draw(DATA_TEXT)}')  # a repeated key: the last counts
        if draw(st.integers(0, 9)) == 0:  # a key simdjson looks up by what precedes a NUL
            entry.append(draw(st.sampled_from(['"\\u0000": 1', '"data\\u0000x": [1]'])))
        fields.append("{" + ", ".join(draw(st.permutations(entry))) + "}")
    specs = tuple(TensorSpec(f"x_{d.lower()}", d, (-1,)) for d in datatypes)
    return ('{"inputs": [' + ", ".join(fields) + "]}").encode(), specs


def _outcome(body: bytes, specs: tuple[TensorSpec, ...]) -> Any:
    try:
        req = parse_infer_request(bytearray(body), None, specs, OUTPUTS, model="m")
    except ProtocolError as exc:
        return str(exc)
    return {name: (a.dtype.str, a.shape, a.tobytes()) for name, a in req.inputs.items()}


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tape_documents())
def test_the_tape_path_decodes_and_refuses_exactly_as_the_plain_one(
    request: tuple[bytes, tuple[TensorSpec, ...]],
) -> None:
    fast = _outcome(*request)
    with patch.object(jsontape, "load", return_value=None):
        plain = _outcome(*request)
    assert fast == plain


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    inputs=st.lists(INPUT_ENTRY, max_size=3) | JSON_VALUES,
    extra=st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=3),
    ascii_only=st.booleans(),
)
def test_any_request_decodes_the_same_through_the_tape(
    inputs: Any, extra: dict[str, Any], ascii_only: bool
) -> None:
    body = json.dumps({"inputs": inputs, **extra}, ensure_ascii=ascii_only).encode()
    fast = _outcome(body, INPUTS)
    with patch.object(jsontape, "load", return_value=None):
        assert fast == _outcome(body, INPUTS)


@pytest.mark.parametrize("datatype", ["FP32", "FP16"])
def test_integers_past_2_53_round_to_the_datatype_as_the_plain_path_does(datatype: str) -> None:
    # Through a double first, 2**60 + 2**36 + 1 would round to another float32 neighbour.
    n = 2**60 + 2**36 + 1
    doc = {"inputs": [{"name": "x", "datatype": datatype, "shape": [3], "data": [n, -n, 1]}]}
    specs = (TensorSpec("x", datatype, (-1,)),)
    fast = _outcome(json.dumps(doc).encode(), specs)
    with patch.object(jsontape, "load", return_value=None):
        assert fast == _outcome(json.dumps(doc).encode(), specs)


def test_numeric_data_is_read_from_the_tape_not_as_python_numbers() -> None:
    body = json.dumps(_doc()).encode()
    doc = jsontape.load(body)
    assert doc is not None
    pixels, mask = doc["inputs"]
    assert isinstance(pixels["data"], jsontape.Numbers)  # FP32: one buffer of doubles
    assert mask["data"] == [True, False] * 2  # BOOL: a list, as orjson reads it
    assert jsontape.load(b'{"inputs": [], "inputs": []}') is None  # orjson keeps the last
    assert jsontape.load(b" " * jsontape.MAX_TAPE_BYTES + b"{}") is None
    assert jsontape.load(b"\xef\xbb\xbf" + body) is None  # a BOM: orjson refuses it
    many = {f"k{i}": 0 for i in range(17)}  # a key is found by a walk over them all
    assert jsontape.load(json.dumps({**_doc(), **many}).encode()) is None
    assert jsontape.load(json.dumps({**_doc(), **dict(list(many.items())[:12])}).encode())


def test_classification_of_an_unbatched_output_whose_first_dimension_is_dynamic() -> None:
    # max_batch_size 0 with dims [ -1 ]: the leading -1 is no batch, so the top classes are
    # of the whole tensor, not of each "row".
    scores = np.array([0.1, 0.7, 0.2], np.float32)
    request = InferRequest(None, {}, (RequestedOutput("p", False, class_count=1),))
    unbatched = TensorSpec("p", "FP32", (-1,), batched=False)
    body, _ = encode_infer_response(
        "m", "1", request, {"p": scores}, {"p": "FP32"}, specs=[unbatched]
    )
    (out,) = json.loads(body)["outputs"]
    assert out["shape"] == [1] and out["data"][0].endswith(":1")


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ([2**32, 2**32], "invalid shape for input 'pixels': shape [4294967296,4294967296] causes "
         "total element count to exceed maximum size of 9223372036854775807"),
        ([2**31, 2**31], "byte size overflow for input 'pixels': element count "
         "(4611686018427387904) * data type size (4) exceeds maximum allowed size "
         "(9223372036854775807)"),
    ],
)  # fmt: skip
def test_element_count_and_byte_size_overflow_are_tritons_400s(
    shape: list[int], message: str
) -> None:
    doc = _doc()
    doc["inputs"][0]["shape"] = shape
    for body in (doc, _binary_doc(16, shape)):
        with pytest.raises(ProtocolError) as info:
            _parse(body, b"\0" * 16 if body is not doc else b"")
        assert str(info.value) == message


def _nested(depth: int, leaf: Any = 1.0) -> Any:
    data: Any = leaf
    for _ in range(depth):
        data = [data]
    return data


@pytest.mark.parametrize("big", [False, True], ids=["tape", "plain"])
@pytest.mark.parametrize("kind", ["FP32", "BOOL"])
def test_data_nested_past_tritons_depth_is_refused_in_its_words(big: bool, kind: str) -> None:
    """Triton reads 'data' nested at most 100 deep (the array itself at depth 0): a value at
    depth 99 is read, one at 100 is a 400 "JSON nesting depth exceeds maximum allowed limit
    (100)", on every path the decoder takes (simdjson's, orjson's, the big-body slicer)."""
    leaf: Any = 1.0 if kind == "FP32" else True
    specs = (TensorSpec("x", kind, (-1,)),)
    pad = {"id": "x" * (2 << 20)} if big else {}  # past the tape's size: the plain path

    def body(depth: int) -> bytes:
        item = {"name": "x", "datatype": kind, "shape": [1], "data": _nested(depth, leaf)}
        return json.dumps({**pad, "inputs": [item]}).encode()

    got = parse_infer_request(body(99), None, specs, OUTPUTS).inputs["x"]
    assert got.tolist() == [leaf]
    for depth in (100, 120):
        with pytest.raises(ProtocolError) as info:
            parse_infer_request(body(depth), None, specs, OUTPUTS)
        assert str(info.value) == "JSON nesting depth exceeds maximum allowed limit (100)"


def test_reserved_parameters_are_refused_over_http_in_tritons_words() -> None:
    for name in ("triton_enable_empty_final_response", "triton_anything"):
        with pytest.raises(ProtocolError) as info:
            _parse(_doc(parameters={name: True}))
        assert str(info.value) == (
            "parameter keys starting with 'triton_' are reserved for Triton usage and should "
            "not be specified."
        )


# -- a binary request's header decoded once (codec._PLANS) ----------------------------------------


def _all_binary(pixels: np.ndarray, mask: np.ndarray, **extra: Any) -> tuple[bytes, int]:
    """A request whose inputs are all binary: its body and JSON header's length."""
    pixels, mask = pixels.astype("<f4"), mask.astype(np.uint8)
    doc: dict[str, Any] = {
        "inputs": [
            {"name": "pixels", "datatype": "FP32", "shape": list(pixels.shape),
             "parameters": {"binary_data_size": pixels.nbytes}},
            {"name": "mask", "datatype": "BOOL", "shape": list(mask.shape),
             "parameters": {"binary_data_size": mask.nbytes}},
        ],
        **extra,
    }  # fmt: skip
    head = json.dumps(doc).encode()
    return head + pixels.tobytes() + mask.tobytes(), len(head)


def test_requests_with_the_same_header_get_their_own_tensors_and_settings() -> None:
    rng = np.random.default_rng(0)
    mask = np.array([[1, 0], [0, 1]], dtype=np.uint8)
    answers = []
    for _ in range(3):
        pixels = rng.standard_normal((2, 4)).astype(np.float32)
        body, length = _all_binary(pixels, mask, id="r", parameters={"priority": 2, "k": "v"})
        req = parse_infer_request(body, length, INPUTS, OUTPUTS, model="m")
        np.testing.assert_array_equal(req.inputs["pixels"], pixels)
        np.testing.assert_array_equal(req.inputs["mask"], mask.astype(bool))
        assert (req.id, req.priority, req.parameters) == ("r", 2, {"k": "v"})
        req.parameters["k"] = "changed by a model"  # never seen by the next request
        answers.append(req)
    assert answers[0].inputs["pixels"] is not answers[1].inputs["pixels"]


def test_requests_of_headers_that_alternate_each_get_their_own_settings() -> None:
    """Two clients of one model whose headers differ (an id, a priority) take turns: each
    request is decoded by its own header's plan, never by the one used just before."""
    mask = np.array([[1, 0], [0, 1]], dtype=np.uint8)
    for i in range(3):
        for rid, priority in (("a", 1), ("b", 2)):
            pixels = np.full((2, 4), i, dtype=np.float32)
            body, length = _all_binary(pixels, mask, id=rid, parameters={"priority": priority})
            req = parse_infer_request(body, length, INPUTS, OUTPUTS, model="m")
            assert (req.id, req.priority) == (rid, priority)
            np.testing.assert_array_equal(req.inputs["pixels"], pixels)
    for i in range(3):  # JSON requests likewise (their framing: the text outside the data)
        for rid in ("a", "bb"):
            assert _decoded(_json_body(f"{i},1", "3,4", extra=f',"id":"{rid}"'))[0] == rid


def test_a_header_seen_before_still_checks_the_data_that_differs() -> None:
    mask = np.array([[1, 0], [0, 1]], dtype=np.uint8)
    body, length = _all_binary(np.zeros((2, 4)), mask)
    parse_infer_request(body, length, INPUTS, OUTPUTS, model="m")
    bad = body[:-1] + b"\x07"  # the same header, a BOOL byte that is not 0 or 1
    with pytest.raises(ProtocolError, match="BOOL binary data must be bytes 0 or 1"):
        parse_infer_request(bad, length, INPUTS, OUTPUTS, model="m")
    with pytest.raises(ProtocolError, match="add up to 36 bytes, but 37"):
        parse_infer_request(body + b"\0", length, INPUTS, OUTPUTS, model="m")


def test_a_header_seen_before_is_decoded_again_for_a_reloaded_model() -> None:
    mask = np.array([[1, 0], [0, 1]], dtype=np.uint8)
    body, length = _all_binary(np.zeros((2, 4)), mask)
    parse_infer_request(body, length, INPUTS, OUTPUTS, model="m")
    reloaded = (TensorSpec("pixels", "FP16", (-1, 4)), INPUTS[1])  # the same name, new tensors
    with pytest.raises(ProtocolError, match="does not match the model's FP16"):
        parse_infer_request(body, length, reloaded, OUTPUTS, model="m")


# -- a JSON request's framing decoded once (tensors/plans.py) -------------------------------------

NUMERIC = (TensorSpec("x", "FP32", (-1, 2)), TensorSpec("n", "INT8", (-1, 2)))


def _json_body(x: str, n: str, shape: str = "[1,2]", extra: str = "") -> bytes:
    return (
        f'{{"inputs":[{{"name":"x","datatype":"FP32","shape":{shape},"data":[{x}]}},'
        f'{{"name":"n","datatype":"INT8","shape":{shape},"data":[{n}]}}]{extra}}}'
    ).encode()


def _decoded(body: bytes, specs: tuple[TensorSpec, ...] = NUMERIC) -> Any:
    try:
        req = parse_infer_request(body, None, specs, OUTPUTS, model="m")
    except ProtocolError as exc:
        return ("refused", str(exc))
    return (req.id, req.parameters, {k: (v.dtype, v.tolist()) for k, v in req.inputs.items()})


@pytest.mark.parametrize(
    ("x", "n"),
    [
        ("0.5,-2", "3,4"),  # other values: read as the first request's were
        ("1e3,  7", "-128,127"),
        ("1,2,3", "1,2"),  # more values than the shape holds
        ("1", "1,2"),  # fewer
        ("1,2", "1,300"),  # out of INT8's range
        ("1,true", "1,2"),  # not a number
        ('1,"2"', "1,2"),
        ("1,2", "1,2.5"),
        ("1,", "1,2"),  # not JSON
        ("9007199254740993,1", "1,2"),  # past 2**53: the plain decoder rounds it
    ],
)
def test_a_json_request_framed_as_one_before_decodes_as_if_new(x: str, n: str) -> None:
    from model_runtime.server.tensors import plans

    plans.forget()
    fresh = _decoded(_json_body(x, n))
    _decoded(_json_body("1,2", "3,4"))  # the same framing, decoded whole: planned
    assert plans._PLANS
    assert _decoded(_json_body(x, n)) == fresh


def test_json_requests_with_the_same_framing_keep_their_own_ids_and_parameters() -> None:
    extra = ',"id":"a","parameters":{"k":"v","data":[1]}'  # a model's parameter named data
    first = parse_infer_request(_json_body("1,2", "3,4", extra=extra), None, NUMERIC, OUTPUTS)
    first.parameters["k"] = "changed by a model"
    again = parse_infer_request(_json_body("5,6", "7,8", extra=extra), None, NUMERIC, OUTPUTS)
    assert again.id == "a" and again.parameters == {"k": "v", "data": [1]}
    assert again.inputs["x"].tolist() == [[5, 6]] and again.inputs["n"].tolist() == [[7, 8]]


def test_a_json_framing_seen_before_is_decoded_again_for_a_reloaded_model() -> None:
    _decoded(_json_body("1,2", "3,4"))
    reloaded = (NUMERIC[0], TensorSpec("n", "INT16", (-1, 2)))
    assert _decoded(_json_body("1,2", "3,4"), reloaded)[0] == "refused"


def test_framing_past_the_plans_limit_is_never_kept() -> None:
    from model_runtime.server.tensors import plans

    plans.forget()
    long_id = ',"id":"%s"' % ("i" * plans.MAX_KEY_BYTES)
    for _ in range(2):
        assert _decoded(_json_body("1,2", "3,4", extra=long_id))[0] == "i" * plans.MAX_KEY_BYTES
    assert not plans._PLANS
    _decoded(_json_body("1,2", "3,4"))
    assert plans._PLANS  # a short one is


@pytest.mark.parametrize("datatype", ["FP32", "FP16", "FP64", "INT8", "INT64", "UINT16", "BOOL"])
@pytest.mark.parametrize("binary", [False, True])
@pytest.mark.parametrize("rid", [None, 'req "7"'])
def test_kept_frames_write_what_the_whole_document_writes(
    datatype: str, binary: bool, rid: str | None
) -> None:
    """A response made from its kept frame is byte for byte the document made whole, the
    second time as the first, for any values (NaN too) and a non-contiguous array."""
    from model_runtime.server.tensors import encode

    dtype = DATATYPES[datatype]
    arrays = [
        np.arange(6).reshape(2, 3).astype(dtype),
        np.arange(12).reshape(3, 4).astype(dtype).T,  # not contiguous
        np.zeros((0, 3), dtype=dtype),
        np.array(1, dtype=dtype),
    ]
    if np.dtype(dtype).kind == "f":
        arrays.append(np.array([[1.5, np.nan, -np.inf]], dtype=dtype))
        arrays.append(np.array([3e38, 3e38, -0.0], dtype=dtype))  # a sum past the largest
    for arr in arrays:
        other = np.arange(4, dtype=np.int32).reshape(2, 2)
        outputs = (RequestedOutput("y", binary), RequestedOutput("z", not binary))
        req = InferRequest(rid, {}, outputs, {}, None, 0)
        results = {"y": arr, "z": other}
        types = {"y": datatype, "z": "INT32"}
        with patch.object(encode, "_framed", return_value=None):
            whole = encode_infer_response("m", "2", req, results, types)
        assert encode_infer_response("m", "2", req, results, types) == whole
        assert encode_infer_response("m", "2", req, results, types) == whole


@pytest.mark.parametrize("datatype", ["FP32", "FP16", "FP64", "INT8", "INT64", "BOOL"])
@pytest.mark.parametrize("binary", [False, True])
@pytest.mark.parametrize("rid", [None, 'req "7"'])
@pytest.mark.parametrize("count", [0, 1, 2])
def test_a_repeated_request_writes_what_the_whole_document_writes(
    datatype: str, binary: bool, rid: str | None, count: int
) -> None:
    """A client repeating its request (its frame kept as the last one, with the header of its
    binary data) gets byte for byte the document made whole, every time, for any number of
    outputs, any values (NaN too), a non-contiguous array, binary data past the size copied
    whole and an array of another dtype."""
    from model_runtime.server.tensors import encode

    dtype = DATATYPES[datatype]
    arrays = [
        np.arange(6).reshape(2, 3).astype(dtype),
        np.arange(12).reshape(3, 4).astype(dtype).T,  # not contiguous
        np.arange(1200).reshape(1, 1200).astype(dtype),  # past _COPY_BELOW when 4+ bytes
        np.arange(6).reshape(2, 3).astype(np.float64),  # not the datatype's dtype
    ]
    if np.dtype(dtype).kind == "f":
        arrays.append(np.array([[1.5, np.nan, -np.inf]], dtype=dtype))
    for arr in arrays:
        names = ["y", "z"][:count]
        outputs = tuple(RequestedOutput(name, binary) for name in names)
        req = InferRequest(rid, {}, outputs, {}, None, 0)
        results = {"y": arr, "z": arr[..., :1]}
        types = {"y": datatype, "z": datatype}
        with patch.object(encode, "_framed", return_value=None):
            whole = encode_infer_response("m", "2", req, results, types)
        for _ in range(3):  # made, then kept as the last frame
            assert encode_infer_response("m", "2", req, results, types) == whole


def test_a_repeated_request_is_framed_for_its_own_shape_model_and_datatypes() -> None:
    """The same requested outputs (a planned request's are shared) answered for another
    shape, model, version or datatypes get that one's document, not the last one's frame."""
    from model_runtime.server.tensors import encode

    outputs = (RequestedOutput("y", False),)
    req = InferRequest(None, {}, outputs, {}, None, 0)
    fp32, int32 = {"y": "FP32"}, {"y": "INT32"}
    cases = [
        ("m", "1", np.ones((1, 3), np.float32), fp32),
        ("m", "1", np.ones((2, 3), np.float32), fp32),
        ("n", "1", np.ones((2, 3), np.float32), fp32),
        ("n", "2", np.ones((2, 3), np.float32), fp32),
        ("n", "2", np.ones((2, 3), np.int32), int32),
        ("n", "2", np.ones((2, 3), np.float32), fp32),
    ]
    for _ in range(2):
        for model, version, arr, types in cases:
            with patch.object(encode, "_framed", return_value=None):
                whole = encode_infer_response(model, version, req, {"y": arr}, types)
            assert encode_infer_response(model, version, req, {"y": arr}, types) == whole


@pytest.mark.parametrize("datatype", ["FP32", "FP16", "FP64", "INT8", "INT64", "UINT16", "BOOL"])
def test_a_binary_request_read_through_its_plan_is_the_one_decoded_whole(datatype: str) -> None:
    """Binary inputs of a header seen before (its plan) are the same arrays, views of the
    body (writable over a bytearray, as decoded whole), of each input's own place in it."""
    from model_runtime.server.tensors import plans

    plans.forget()
    specs = (TensorSpec("a", datatype, (-1, 3)), TensorSpec("b", datatype, (-1, 3)))
    dtype = DATATYPES[datatype]
    values = [np.array([[1, 0, 1], [0, 1, 1]]), np.array([[0, 0, 1], [1, 1, 0]])]
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": name,
                    "datatype": datatype,
                    "shape": [2, 3],
                    "parameters": {"binary_data_size": 6 * dtype.itemsize},
                }
                for name in ("a", "b")
            ]
        }
    ).encode()

    def decoded(k: int) -> dict[str, np.ndarray]:
        data = b"".join((v + k).astype(dtype).tobytes() for v in values)
        if datatype == "BOOL":
            data = b"".join(v.astype(dtype).tobytes() for v in values)
        body = bytearray(head + data)
        req = parse_infer_request(body, len(head), specs, OUTPUTS, model="m")
        for name in ("a", "b"):
            arr = req.inputs[name]
            assert arr.flags.writeable and not arr.flags.owndata
        at = len(head)
        body[at : at + dtype.itemsize] = bytes(dtype.itemsize)  # a view: its first element
        assert not req.inputs["a"].flat[0]
        return req.inputs

    whole = decoded(1)
    assert plans._PLANS  # kept: the next of this header is read through its plan
    planned = decoded(2)
    for name, value in zip(("a", "b"), values, strict=True):
        assert planned[name].dtype == whole[name].dtype == dtype
        assert planned[name].shape == whole[name].shape == (2, 3)
        expected = value.astype(dtype) if datatype == "BOOL" else (value + 2).astype(dtype)
        if name == "a":
            expected.flat[0] = 0
        np.testing.assert_array_equal(planned[name], expected)


@pytest.mark.parametrize(
    ("datatype", "shape", "refused"),
    [
        ("INT32", [0, 2**61], True),  # 2**61 * 4 bytes: past int64
        ("INT8", [0, 2**61, 4], True),
        ("INT8", [0, 2**61], False),  # 2**61 bytes: an empty array numpy can make
        ("BYTES", [2**62, 0], True),  # a BYTES element is an object (8 bytes)
    ],
)
def test_an_empty_shape_too_big_for_any_array_is_a_protocol_error(
    datatype: str, shape: list[int], refused: bool
) -> None:
    """No elements, but dimensions no array can have (numpy: "array is too big"): the caller
    gets a ProtocolError naming the input and its shape, JSON and binary alike."""
    specs = (TensorSpec("x", datatype, (-1,) * len(shape)),)
    for body, length in (
        (json.dumps({"inputs": [{"name": "x", "datatype": datatype, "shape": shape, "data": []}]}),
         None),
        (json.dumps({"inputs": [{"name": "x", "datatype": datatype, "shape": shape,
                                 "parameters": {"binary_data_size": 0}}]}), -1),
    ):  # fmt: skip
        data = body.encode()
        if not refused:
            parsed = parse_infer_request(data, len(data) if length else None, specs, OUTPUTS)
            assert parsed.inputs["x"].shape == tuple(shape)
            continue
        with pytest.raises(
            ProtocolError, match=r"invalid shape for input 'x': shape \[.*\] holds no elements"
        ):
            parse_infer_request(data, len(data) if length else None, specs, OUTPUTS)

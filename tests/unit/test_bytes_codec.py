"""BYTES tensors on the wire and at the Python API: the binary form (a 4-byte little-endian
length, then the bytes, per element), fuzzed; JSON strings; ``bytes``/``str`` arrays."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from model_runtime.errors import InputValidationError, ProtocolError
from model_runtime.io import as_bytes_array
from model_runtime.server.tensors.binary import bytes_from_binary
from model_runtime.server.tensors.classification import bytes_to_binary
from model_runtime.server.tensors.codec import parse_infer_request
from model_runtime.server.tensors.request import TensorSpec

SPECS = (TensorSpec("s", "BYTES", (-1,)),)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.integers(min_value=0, max_value=2**40))
def test_any_bytes_decode_or_raise_protocol_error(data: bytes, count: int) -> None:
    try:
        out = bytes_from_binary("s", data, count)
    except ProtocolError:
        return
    assert out.shape == (count,) and out.dtype == object
    assert bytes_to_binary(out) == data  # what was decoded is exactly what was sent


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(max_size=20), max_size=10))
def test_round_trip(values: list[bytes]) -> None:
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    assert bytes_from_binary("s", bytes_to_binary(arr), len(values)).tolist() == values


@pytest.mark.parametrize(
    ("data", "count", "what"),
    [
        (b"\x05\x00\x00\x00abc", 1, "claims 5 bytes"),
        (b"\x01\x00\x00\x00ab", 1, "incomplete string length indicator"),  # Triton's
        (b"\x00\x00", 1, "expecting 4 bytes but only 2 bytes available"),
        (b"", 10**12, "expected 1000000000000 string elements"),  # allocates nothing
    ],
)
def test_binary_defects_are_named(data: bytes, count: int, what: str) -> None:
    with pytest.raises(ProtocolError, match=what):
        bytes_from_binary("s", data, count)


def _request(inputs: list[dict[str, object]], binary: bytes = b"") -> tuple[bytes, int | None]:
    header = json.dumps({"inputs": inputs}).encode()
    return header + binary, (len(header) if binary else None)


def test_http_json_strings_and_binary() -> None:
    body, n = _request([{"name": "s", "datatype": "BYTES", "shape": [2], "data": ["é", ""]}])
    assert parse_infer_request(body, n, SPECS, ()).inputs["s"].tolist() == ["é".encode(), b""]
    raw = b"\x02\x00\x00\x00hi"
    body, n = _request(
        [{"name": "s", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 6}}],
        raw,
    )
    assert parse_infer_request(body, n, SPECS, ()).inputs["s"].tolist() == [b"hi"]
    body, n = _request([{"name": "s", "datatype": "BYTES", "shape": [1], "data": [1]}])
    with pytest.raises(ProtocolError, match="must be strings"):
        parse_infer_request(body, n, SPECS, ())
    numbers = (TensorSpec("s", "FP32", (-1,)),)
    body, n = _request([{"name": "s", "datatype": "BYTES", "shape": [1], "data": ["a"]}])
    with pytest.raises(ProtocolError, match="no BYTES input"):
        parse_infer_request(body, n, numbers, ())


def test_python_api_takes_bytes_and_str() -> None:
    assert as_bytes_array(["a", b"b"], "s").tolist() == [b"a", b"b"]
    assert as_bytes_array(np.array(["é"]), "s").tolist() == ["é".encode()]
    assert as_bytes_array(np.array([b"x"]), "s").tolist() == [b"x"]
    same = np.array([b"x", b"y"], dtype=object)
    assert as_bytes_array(same, "s") is same  # already bytes: no copy
    with pytest.raises(InputValidationError, match="element 1 is int"):
        as_bytes_array(np.array([b"x", 3], dtype=object), "s")
    with pytest.raises(InputValidationError, match="not valid UTF-8"):
        as_bytes_array(np.array([b"\xff"], dtype=object), "s")
    with pytest.raises(InputValidationError, match="expects bytes"):
        as_bytes_array(np.zeros(2, np.float32), "s")

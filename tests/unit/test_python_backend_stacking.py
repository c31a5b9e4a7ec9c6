"""Requests and responses of one frame stacked into one tensor per name: each request and each
response still gets exactly its own tensors, what does not agree travels on its own, and a
frame whose stacked rows lie fails only the requests that point into them."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from model_runtime.errors import PythonModelError
from model_runtime.python_backend import pb_utils
from model_runtime.python_backend.arena import ChildArena, ParentArena
from model_runtime.python_backend.held import Call, Held
from model_runtime.python_backend.stacking import check_rows, row_of, stackable, stacked
from model_runtime.python_backend.stub_responses import encode_responses
from model_runtime.python_backend.wire import Encoder, WireError, decode_tensors

_FINAL = 1


@pytest.fixture
def arenas() -> Iterator[tuple[ParentArena, ChildArena]]:
    parent = ParentArena(1 << 16)
    child = ChildArena(os.dup(parent.fd), 1 << 16)
    yield parent, child
    parent.close()


def _pairs(*arrays: np.ndarray) -> list[tuple[str, np.ndarray]]:
    return [(f"t{i}", a) for i, a in enumerate(arrays)]


def test_only_numeric_tensors_of_one_signature_stack() -> None:
    a = _pairs(np.ones((1, 3), np.float32), np.zeros(2, np.int64))
    b = _pairs(np.full((1, 3), 2, np.float32), np.ones(2, np.int64))
    assert stackable([a, b])
    assert not stackable([a])  # one request: nothing to gain
    assert not stackable([a, _pairs(np.ones((2, 3), np.float32), np.zeros(2, np.int64))])
    assert not stackable([a, _pairs(np.ones((1, 3), np.float64), np.zeros(2, np.int64))])
    assert not stackable([a, list(reversed(b))])  # names in another order
    assert not stackable([a, a[:1]])
    words = np.array([b"x"], dtype=object)
    assert not stackable([_pairs(words), _pairs(words)])  # BYTES travel serialized, alone
    together = stacked([a, b])
    assert [name for name, _ in together] == ["t0", "t1"]
    check_rows(together, 2)
    for row, request in enumerate((a, b)):
        for (_, array), (_, mine) in zip(together, request, strict=True):
            got = row_of(array, row)
            assert got.shape == mine.shape
            np.testing.assert_array_equal(got, mine)
    with pytest.raises(WireError, match="does not hold 3 rows"):
        check_rows(together, 3)
    scalar = stacked([_pairs(np.array(1.5)), _pairs(np.array(2.5))])[0][1]
    assert row_of(scalar, 1).shape == () and float(row_of(scalar, 1)) == 2.5


def _response(*arrays: np.ndarray, params: dict[str, Any] | None = None) -> Any:
    tensors = [pb_utils.Tensor(name, a) for name, a in _pairs(*arrays)]
    return pb_utils.InferenceResponse(tensors, parameters=params)


async def _deliver(
    arenas: tuple[ParentArena, ChildArena], responses: list[Any], tamper: Any = None
) -> tuple[dict[str, Any], list[Any]]:
    """Encode ``responses`` as the instance does, decode them as the daemon does: the
    header, and what each request's caller gets (its outputs, or its error)."""
    parent, child = arenas
    enc = Encoder(child, inline_max=0)
    keys = list(range(1, len(responses) + 1))
    items, together = encode_responses(
        enc, [(k, r, _FINAL) for k, r in zip(keys, responses, strict=True)], {}
    )
    header: dict[str, Any] = {"t": "resp", "items": items, "done": [7]}
    if together is not None:
        header["S"] = together
    segments = enc.finish(header, child.sender.head)
    header = json.loads(bytes(segments[1]))
    if tamper is not None:
        tamper(header)
    payload = memoryview(b"".join(bytes(s) for s in segments[2:]))
    held = Held()
    calls = [Call(k, 7, False) for k in keys]
    held.add(7, calls)
    held.responses(header, payload, lambda d, p: dict(decode_tensors(d, p, parent)))
    answers = []
    for call in calls:
        assert call.future is not None and call.future.done()
        got = call.future.result()
        answers.append(got.error if got.error is not None else got.outputs)
    return header, answers


async def test_equal_responses_cross_as_one_tensor_per_output_each_its_own_row(
    arenas: tuple[ParentArena, ChildArena],
) -> None:
    outs = [(np.full((1, 10), i, np.float32), np.arange(3) + i) for i in range(5)]
    responses = [_response(*o) for o in outs]
    responses[2] = _response(*outs[2], params={"n": 2})
    header, answers = await _deliver(arenas, responses)
    assert [len(d) for d in header["S"]] == [6, 6]  # one descriptor per output, for all
    assert [item["s"] for item in header["items"]] == [0, 1, 2, 3, 4]
    assert header["items"][2]["p"] == json.dumps({"n": 2})
    for (a, b), got in zip(outs, answers, strict=True):
        assert got["t0"].shape == (1, 10) and got["t1"].shape == (3,)
        np.testing.assert_array_equal(got["t0"], a)
        np.testing.assert_array_equal(got["t1"], b)


async def test_responses_that_differ_travel_alone_and_errors_keep_their_place(
    arenas: tuple[ParentArena, ChildArena],
) -> None:
    one, two = np.ones((1, 4), np.float32), np.full((2, 4), 2, np.float32)
    failed = pb_utils.InferenceResponse(error=pb_utils.TritonError("no"))
    header, answers = await _deliver(arenas, [_response(one), _response(two), failed])
    assert "S" not in header and all("s" not in item for item in header["items"])
    np.testing.assert_array_equal(answers[1]["t0"], two)
    assert isinstance(answers[2], PythonModelError) and "no" in str(answers[2])
    three = np.full((1, 4), 3, np.float32)
    header, answers = await _deliver(arenas, [_response(one), failed, _response(three)])
    assert [item.get("s") for item in header["items"]] == [0, None, 1]
    np.testing.assert_array_equal(answers[0]["t0"], one)
    assert isinstance(answers[1], PythonModelError)
    np.testing.assert_array_equal(answers[2]["t0"], three)


async def test_a_row_that_lies_fails_its_request_only(
    arenas: tuple[ParentArena, ChildArena],
) -> None:
    outs = [np.full(4, i, np.float32) for i in range(3)]

    def lie(header: dict[str, Any]) -> None:
        header["items"][1]["s"] = 3  # past the 3 rows sent

    _, answers = await _deliver(arenas, [_response(o) for o in outs], lie)
    assert isinstance(answers[1], PythonModelError)
    assert "broken" in str(answers[1]) and "row 3" in str(answers[1])
    np.testing.assert_array_equal(answers[0]["t0"], outs[0])
    np.testing.assert_array_equal(answers[2]["t0"], outs[2])

    def unequal(header: dict[str, Any]) -> None:
        header["items"][0]["s"] = "0"

    _, answers = await _deliver(arenas, [_response(o) for o in outs], unequal)
    assert isinstance(answers[0], PythonModelError)
    np.testing.assert_array_equal(answers[1]["t0"], outs[1])

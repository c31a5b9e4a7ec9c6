"""The instance wire's shared memory and frames: tensors by reference, inline when the ring is
full, and nothing a child writes there can crash or fool the daemon."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from model_runtime.python_backend.arena import HEADER, ArenaError, ChildArena, ParentArena, Ring
from model_runtime.python_backend.dtypes import deserialize_bytes, serialize_bytes
from model_runtime.python_backend.wire import Encoder, WireError, decode_tensors, parse_header


@pytest.fixture
def arenas() -> tuple[ParentArena, ChildArena]:
    parent = ParentArena(4096)
    child = ChildArena(os.dup(parent.fd), 4096)
    yield parent, child
    parent.close()


def _roundtrip(
    sender: ParentArena | ChildArena, receiver: ParentArena | ChildArena, arrays: dict
) -> dict:
    enc = Encoder(sender, inline_max=0)  # every tensor through the ring
    descs = enc.tensors(arrays.items())
    segments = enc.finish({"t": "x"}, sender.sender.head)
    payload = b"".join(bytes(s) for s in segments[2:])
    out = dict(decode_tensors(descs, payload, receiver))
    receiver.consumed(sender.sender.head)
    return out


def test_tensors_cross_both_ways_through_the_rings(arenas: tuple[ParentArena, ChildArena]) -> None:
    parent, child = arenas
    arrays = {
        "f": np.arange(12, dtype=np.float32).reshape(3, 4),
        "b": np.array([[b"ab", b""], [b"\x00z", "\u00e9".encode()]], dtype=object),
        "t": np.array([True, False]),
        "e": np.zeros((0, 3), np.int64),
        "strided": np.arange(20, dtype=np.int16)[::2],
    }
    for sender, receiver in ((parent, child), (child, parent)):
        for _ in range(50):  # far past the ring's size: space is reused once consumed
            out = _roundtrip(sender, receiver, arrays)
            for name, array in arrays.items():
                np.testing.assert_array_equal(out[name], array)
                assert out[name].dtype == array.dtype
            assert out["f"].flags.writeable


def test_small_tensors_travel_in_the_frame_large_ones_in_the_ring(
    arenas: tuple[ParentArena, ChildArena],
) -> None:
    parent, child = arenas
    enc = Encoder(parent, inline_max=1024)
    small, large = np.ones(256, np.float32), np.arange(512, dtype=np.float32)
    descs = enc.tensors([("small", small), ("large", large)])
    assert [d[3] for d in descs] == [1, 0]  # 1024 bytes in the frame, 2048 in the ring
    payload = b"".join(bytes(s) for s in enc.finish({"t": "x"}, parent.sender.head)[2:])
    out = dict(decode_tensors(descs, payload, child))
    np.testing.assert_array_equal(out["small"], small)
    np.testing.assert_array_equal(out["large"], large)


def test_a_tensor_that_does_not_fit_goes_inline() -> None:
    ring = Ring(HEADER, 1024, lambda: 0)
    assert ring.alloc(2048) is None  # larger than the ring
    assert ring.alloc(1000) == HEADER
    assert ring.alloc(64) is None  # full until the receiver consumes


def test_the_ring_wraps_to_its_start_instead_of_splitting_a_tensor() -> None:
    consumed = [0]
    ring = Ring(HEADER, 1024, lambda: consumed[0])
    assert ring.alloc(640) == HEADER
    consumed[0] = ring.head
    assert ring.alloc(512) == HEADER  # 384 left at the end: skipped, not split
    assert ring.alloc(512) is None


def test_a_child_that_truncates_the_memory_gets_an_error_not_a_crash(
    arenas: tuple[ParentArena, ChildArena],
) -> None:
    parent, child = arenas
    enc = Encoder(child, inline_max=0)
    descs = enc.tensors([("x", np.ones(64, np.float32))])
    os.ftruncate(parent.fd, 0)  # what a broken child could do; a mapping would SIGBUS here
    with pytest.raises(WireError, match="ends early"):
        decode_tensors(descs, b"", parent)


@pytest.mark.parametrize(
    ("desc", "words"),
    [
        (["x", "FP32", [4], 0, 0, 16], "outside the instance's ring"),
        (["x", "FP32", [4], 0, HEADER + 4096 + 4090, 16], "outside the instance's ring"),
        (["x", "FP32", [5], 1, 0, 16], "do not hold shape"),
        (["x", "FP32", [4], 1, 8, 16], "runs past the frame's payload"),
        (["x", "COMPLEX", [4], 1, 0, 16], "not one a python model can use"),
        (["x", "FP32", [-4], 1, 0, 16], "non-negative integers"),
        (["x", "BYTES", [2], 1, 0, 16], "BYTES"),
        (["x", "FP32", [4], 7, 0, 16], "unknown place"),
        ("x", "6 fields"),
    ],
)
def test_a_descriptor_that_lies_is_refused(
    arenas: tuple[ParentArena, ChildArena], desc: object, words: str
) -> None:
    parent, _ = arenas
    with pytest.raises(WireError, match=words):
        decode_tensors([desc], bytes(16), parent)


def test_bytes_serialize_as_triton_does() -> None:
    array = np.array([b"a", "bc", 7], dtype=object)
    data = serialize_bytes(array)
    assert data == b"\x01\x00\x00\x00a\x02\x00\x00\x00bc\x01\x00\x00\x007"
    assert deserialize_bytes(data, (3,)).tolist() == [b"a", b"bc", b"7"]


def test_the_parent_reads_only_inside_the_childs_ring(
    arenas: tuple[ParentArena, ChildArena],
) -> None:
    parent, _ = arenas
    with pytest.raises(ArenaError):
        parent.read(HEADER, 8)  # its own ring, not the child's


def test_what_an_instance_may_merge_into_one_execute() -> None:
    # the rows of an exec batch count against max_batch_size; a batch sent alone (requests
    # that were in a crash) or one with a sequence's request is never merged with others
    from model_runtime.python_backend import pb_utils
    from model_runtime.python_backend.stub_batches import mergeable_rows

    three = [pb_utils.Tensor("X", np.zeros((3, 2), np.float32))]
    assert mergeable_rows({"b": 1, "r": [{"k": 2, "T": three}, {"k": 3, "T": three}]}) == 6
    assert mergeable_rows({"b": 1, "r": [{"k": 2, "T": []}]}) == 1
    assert mergeable_rows({"b": 1, "a": 1, "r": [{"k": 2, "T": three}]}) is None
    assert mergeable_rows({"b": 1, "r": [{"k": 2, "T": three, "c": 7}]}) is None


def test_a_busy_instance_fills_an_execute_request_by_request() -> None:
    # As Triton's dynamic batcher: the batches that wait fill one execute up to max_batch_size
    # rows; a batch that fits only in part gives its leading requests and waits with the rest
    # (its end comes once they ran); one sent alone stops the merge
    import collections

    from model_runtime.python_backend import pb_utils
    from model_runtime.python_backend.stub_batches import merge

    def batch(b: int, *keys: int, **extra: int) -> dict[str, Any]:
        one = [pb_utils.Tensor("X", np.zeros((1, 2), np.float32))]
        return {"t": "exec", "b": b, "r": [{"k": k, "T": one} for k in keys], **extra}

    head = batch(1, 10, 11)
    waiting = collections.deque([batch(2, 20), batch(3, 30, 31, 32), batch(4, 40)])
    merge(head, waiting, 5)
    assert [item["k"] for item in head["r"]] == [10, 11, 20, 30, 31]
    assert head["bs"] == [1, 2]  # batch 3 ends with its last request, in the next execute
    assert [(b["b"], [item["k"] for item in b["r"]]) for b in waiting] == [(3, [32]), (4, [40])]
    nxt = waiting.popleft()
    merge(nxt, waiting, 5)
    assert [item["k"] for item in nxt["r"]] == [32, 40] and nxt["bs"] == [3, 4]
    alone = collections.deque([batch(6, 60, a=1)])
    head = batch(5, 50)
    merge(head, alone, 5)
    assert [item["k"] for item in head["r"]] == [50] and len(alone) == 1


class _NoRing:
    def put(self, data: memoryview) -> int | None:
        return None


def _header_of(segments: list[Any]) -> dict[str, Any]:
    hlen = int.from_bytes(bytes(segments[0])[:4], "little")
    return parse_header(bytes(segments[1])[:hlen])


@pytest.mark.parametrize("fast", [False, True])
def test_headers_cross_as_json_whatever_writes_them(fast: bool) -> None:
    """Request and response frames are written by orjson, the others by the json module: the
    same header comes out, what orjson cannot write (a lone surrogate) included."""
    error = ["INTERNAL", "bad \ud800 text"]
    header = {"t": "resp", "items": [{"k": 1, "e": error}], "c": 2**64 - 1}
    out = _header_of(Encoder(_NoRing()).finish(dict(header), 7, fast=fast))
    assert out == {**header, "h": 7}


def test_a_header_orjson_will_not_read_is_read_by_the_json_module() -> None:
    """NaN (a metric's value, written by the json module) and integers over 64 bits."""
    out = parse_header(b'{"t":"metric","v":NaN,"big":%d}' % 2**70)
    assert out["t"] == "metric" and out["v"] != out["v"] and out["big"] == 2**70
    with pytest.raises(WireError, match="not JSON"):
        parse_header(b'{"t": ')


def test_an_interpreter_without_orjson_writes_and_reads_the_same_headers() -> None:
    """An instance in a model's own environment may lack orjson: the json module does it all."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['orjson'] = None\n"
        "from model_runtime.python_backend import wire\n"
        "assert wire._fast_loads is wire.json.loads\n"
        "h = {'t': 'exec', 'B': [{'b': 1, 'r': [{'k': 2, 'rq': 'id'}]}], 'h': 3}\n"
        "assert wire.parse_header(wire._fast_dumps(h)) == h\n"
        "assert wire.parse_header(b'{\"t\":\"metric\",\"v\":NaN}')['t'] == 'metric'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr

"""The response cache's rules without a daemon: what makes two requests equal, the least
recently used answer goes first past the size, an answer larger than the cache is not kept,
a retiring model version's answers are dropped, and what is stored is a read-only copy."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from model_runtime.server.inference.cache import (
    ENTRY_OVERHEAD,
    TENSOR_OVERHEAD,
    CachedOutputs,
    ResponseCache,
    request_key,
)
from model_runtime.server.tensors.request import InferRequest, RequestedOutput

RUNNER = object()


def req(x: Any, dtype: str = "float32", **parameters: Any) -> InferRequest:
    return InferRequest(None, {"x": np.asarray(x, dtype=dtype)}, (), parameters)


def key(
    request: InferRequest, model: str = "m", version: str = "1", runner: object = RUNNER
) -> bytes:
    return request_key(model, version, runner, request)


def test_equal_requests_have_one_key_and_any_difference_another() -> None:
    base = key(req([[1.0, 2.0]]))
    assert key(req([[1.0, 2.0]])) == base
    # Scheduling and encoding parameters do not change the outputs.
    assert key(req([[1.0, 2.0]], timeout=5, priority=1, binary_data_output=True)) == base
    others = [
        key(req([[1.0, 3.0]])),  # bytes
        key(req([[1.0], [2.0]])),  # shape, same bytes
        key(req([[1, 2]], "int32")),  # datatype
        key(req([[1.0, 2.0]], tag="a")),  # a custom parameter
        key(req([[1.0, 2.0]]), model="n"),
        key(req([[1.0, 2.0]]), version="2"),
        key(req([[1.0, 2.0]]), runner=object()),  # a reload's new runner
        key(
            InferRequest(
                None, {"x": np.asarray([[1.0, 2.0]], np.float32)}, (RequestedOutput("y", True),)
            )
        ),
    ]
    assert base not in others and len(set(others)) == len(others)
    words = np.array([b"ab", b"c"], dtype=object)
    split = np.array([b"a", b"bc"], dtype=object)
    assert key(InferRequest(None, {"x": words}, ())) != key(InferRequest(None, {"x": split}, ()))


def _size(nbytes: int) -> int:
    return ENTRY_OVERHEAD + TENSOR_OVERHEAD + len("y") + nbytes


def test_past_its_size_the_least_recently_used_answer_goes() -> None:
    cache = ResponseCache(3 * _size(16))
    outputs = {k: {"y": np.full(4, i, np.float32)} for i, k in enumerate([b"a", b"b", b"c", b"d"])}
    for k in (b"a", b"b", b"c"):
        assert cache.put(k, "m", "1", outputs[k])
    assert cache.get(b"a") is not None  # a is now the most recently used
    assert cache.put(b"d", "m", "1", outputs[b"d"])
    assert cache.get(b"b") is None and cache.evictions == 1
    assert [cache.get(k) is not None for k in (b"a", b"c", b"d")] == [True, True, True]
    assert cache.used == 3 * _size(16) and len(cache) == 3


def test_an_answer_larger_than_the_cache_is_not_kept() -> None:
    cache = ResponseCache(_size(16))
    assert cache.put(b"a", "m", "1", {"y": np.zeros(4, np.float32)})
    assert not cache.put(b"b", "m", "1", {"y": np.zeros(5, np.float32)})
    assert cache.insert_failures == 1 and cache.get(b"a") is not None  # nothing evicted for it


def test_a_retiring_versions_answers_are_dropped_and_others_kept() -> None:
    cache = ResponseCache(1 << 20)
    cache.put(b"a", "m", "1", {"y": np.zeros(1)})
    cache.put(b"b", "m", "2", {"y": np.zeros(1)})
    cache.put(b"c", "n", "1", {"y": np.zeros(1)})
    assert cache.drop("m", "1") == 1
    assert (cache.get(b"a"), cache.get(b"b") is not None, cache.get(b"c") is not None) == (
        None,
        True,
        True,
    )
    assert cache.used == 2 * _size(8)


def test_what_is_stored_is_a_read_only_copy() -> None:
    cache = ResponseCache(1 << 20)
    y = np.arange(4, dtype=np.float32)
    cache.put(b"a", "m", "1", {"y": y})
    y[:] = -1  # a runner reusing its output buffer
    hit = cache.get(b"a")
    assert isinstance(hit, CachedOutputs)
    assert hit["y"].tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(ValueError):
        hit["y"][0] = 5

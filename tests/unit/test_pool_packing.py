"""Packing a batch of single-row requests into a pool buffer: each row lands in its place,
whatever the caller's array, and the event loop's thread keeps the GIL while it copies (a copy
that lets the device threads take it once per row costs the loop ~1 ms a batch with two
devices: issue 46)."""

from __future__ import annotations

import asyncio
import hashlib
import sys
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
from test_queue_perf import IN, B, mlp_metadata

import actors.queues.pool as pool_module
from actors.queues.config import QueueConfig
from actors.queues.pool import Layout, RingPool
from actors.queues.request import Request

pytestmark = pytest.mark.timeout(30)


def _requests(arrays: list[np.ndarray]) -> list[Request]:
    loop = asyncio.new_event_loop()
    try:
        return [Request({"x": a}, 1, loop.create_future()) for a in arrays]
    finally:
        loop.close()


def _pool() -> RingPool:
    return RingPool(Layout(mlp_metadata(), QueueConfig(batching_dim=0)), 2)


@pytest.fixture(params=["joined", "record by record"])
def copies(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways rows are copied: joined (batches up to 1 MiB), record by record (bigger)."""
    if request.param == "record by record":
        monkeypatch.setattr(pool_module, "_JOIN_BYTES", 0)
    return str(request.param)


def test_rows_land_in_order_whatever_the_callers_arrays(copies: str) -> None:
    rng = np.random.default_rng(0)
    wide = rng.standard_normal((IN, 2)).astype(np.float32)
    arrays = [rng.standard_normal((1, IN)).astype(np.float32) for _ in range(5)]
    arrays.append(wide[:, 0][None])  # not contiguous: copied all the same
    pool = _pool()
    pool.fill(0, (), 6, None, 8, _requests(arrays))
    assert np.array_equal(pool.buffers[0][0]["x"][:6], np.concatenate(arrays))
    assert not pool.buffers[0][0]["x"][6:8].any()  # the bucket's padding
    other = [np.arange(IN, dtype=np.int32)[None]] * 2  # another dtype: values, not bytes
    pool.fill(1, (), 2, None, 2, _requests(other))
    assert np.array_equal(pool.buffers[1][0]["x"][:2], np.concatenate(other).astype(np.float32))


@pytest.fixture
def contender() -> Iterator[list[int]]:
    """A thread that, like a device's worker, works without the GIL (hashing 64 KiB) and then
    takes it back to count: it counts during a fill only if the fill let go of the GIL."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.2)  # no forced switch within a test's fills
    count = [0]
    stop = threading.Event()
    data = bytes(1 << 16)

    def work() -> None:
        while not stop.is_set():
            hashlib.sha256(data).digest()  # the GIL released meanwhile
            count[0] += 1

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    try:
        yield count
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(interval)


def test_a_batch_of_rows_is_packed_without_letting_other_threads_run(
    contender: list[int], copies: str
) -> None:
    rng = np.random.default_rng(1)
    requests = _requests([rng.standard_normal((1, IN)).astype(np.float32) for _ in range(B)])
    pool = _pool()
    time.sleep(0.01)  # the contender runs
    before = contender[0]
    for _ in range(500):  # a release hands the GIL over only now and then: many batches
        pool.fill(0, (), B, None, B, requests)
        if contender[0] != before:
            break
    assert contender[0] - before <= 1  # held from the first row to the last (+1: the hash
    # the contender was in as this thread took the GIL back ends, then it waits)

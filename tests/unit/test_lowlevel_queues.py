"""InputQueue / OutputQueue / QueueManager on their own (no device): packing and splitting
rows, zero-copy views, callbacks in order, flush padding, timeouts, disconnect and reset."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np
import pytest

from model_runtime.errors import InputValidationError
from model_runtime.executable.testing import tiny_executable
from model_runtime.lowlevel import (
    QueueDisconnectedError,
    QueueManager,
    QueueTimeoutError,
    RingMemoryPool,
    SpscRingBuffer,
)

META = tiny_executable(batch_size=2).metadata
X, Y, COUNTER_OUT = META.anchor("x"), META.anchor("y"), META.anchor("counter_out")


def manager(multiplier: int = 2, timeout: float = 0.05) -> QueueManager:
    return QueueManager([X], [Y, COUNTER_OUT], {"x": 1, "y": 1}, multiplier, timeout=timeout)


def note(events: list[str], *names: str) -> list[Callable[[], None]]:
    return [lambda n=n: events.append(n) for n in names]  # type: ignore[misc]


def rows(start: int, n: int) -> np.ndarray:
    return np.arange(start * 4, (start + n) * 4, dtype=np.float32).reshape(n, 4)


async def test_input_packs_and_splits_rows_with_callbacks_in_order() -> None:
    q = manager(multiplier=4).input_queue("x")
    events: list[str] = []
    for i, (start, n) in enumerate([(0, 1), (1, 3), (4, 2)]):
        await q.enqueue(rows(start, n), *note(events, f"start{i}", f"done{i}"))
    e0 = await q._element(0, 0.05)
    e1 = await q._element(1, 0.05)
    e2 = await q._element(2, 0.05)
    np.testing.assert_array_equal(np.concatenate([e0, e1, e2]), rows(0, 6))
    assert events == ["start0", "start1", "start2"]  # nothing consumed yet
    q._commit(1)
    assert events[-1] == "done0"
    q._commit(2)
    assert events[-2:] == ["done1", "done2"]
    assert e2.base is not None  # [4, 6) was one whole element: a view, not a copy


async def test_empty_input_times_out_and_keeps_partial_data() -> None:
    q = manager().input_queue("x")
    await q.enqueue(rows(0, 1))
    with pytest.raises(QueueTimeoutError, match="1 of 2 rows"):
        await q._element(0, 0.02)
    await q.enqueue(rows(1, 1))
    np.testing.assert_array_equal(await q._element(0, 0.02), rows(0, 2))


async def test_flush_pads_input_and_discards_matching_output_rows() -> None:
    qm = manager()
    iq, oq = qm.input_queue("x"), qm.output_queue("y")
    await iq.enqueue(rows(0, 1))
    out = np.full((1, 3), -1, np.float32)
    done: list[int] = []
    await oq.enqueue(out, lambda: done.append(1))
    qm.flush_all()
    element = await iq._element(0, 0.02)
    np.testing.assert_array_equal(element, np.vstack([rows(0, 1), np.zeros((1, 4), np.float32)]))
    oq._write(np.array([[1, 2, 3], [9, 9, 9]], np.float32))  # row 2 is padding
    np.testing.assert_array_equal(out, [[1, 2, 3]])
    assert done == [1] and oq.waiting_elements == 0  # the padding row was discarded
    # a flush with nothing partial queues one dummy element
    iq.flush()
    np.testing.assert_array_equal(await iq._element(1, 0.02), np.zeros((2, 4), np.float32))


async def test_outputs_wait_for_buffers_and_split_across_them() -> None:
    oq = manager().output_queue("y")
    oq._write(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert oq.waiting_elements == 1
    a, b = np.zeros((1, 3), np.float32), np.zeros((3, 3), np.float32)
    order: list[str] = []
    await oq.enqueue(a, lambda: order.append("a"))
    await oq.enqueue(b, lambda: order.append("b"))
    oq._write(np.arange(6, 12, dtype=np.float32).reshape(2, 3))
    assert order == ["a", "b"]
    np.testing.assert_array_equal(np.vstack([a, b]), np.arange(12).reshape(4, 3))
    # room: 2 buffers' worth of unclaimed outputs at most
    oq._write(np.zeros((2, 3), np.float32))
    oq._write(np.zeros((2, 3), np.float32))
    with pytest.raises(QueueTimeoutError, match="enqueue output buffers"):
        await oq._wait_room(1, 0.02)


async def test_bad_enqueues_are_typed_errors() -> None:
    qm = manager()
    with pytest.raises(InputValidationError, match="dtype"):
        await qm.input_queue("x").enqueue(rows(0, 2).astype(np.float64))
    with pytest.raises(InputValidationError, match="shape"):
        await qm.input_queue("x").enqueue(np.zeros((2, 5), np.float32))
    with pytest.raises(InputValidationError, match="shape"):
        await qm.output_queue("counter_out").enqueue(np.zeros((2,), np.float32))
    ro = np.zeros((2, 3), np.float32)
    ro.flags.writeable = False
    with pytest.raises(InputValidationError, match="writable"):
        await qm.output_queue("y").enqueue(ro)
    with pytest.raises(InputValidationError, match="no input queue 'nope'"):
        qm.input_queue("nope")


async def test_full_queue_times_out_then_disconnect_and_reset() -> None:
    qm = manager(multiplier=1)
    iq = qm.input_queue("x")
    await iq.enqueue(rows(0, 1))
    with pytest.raises(QueueTimeoutError, match="buffers still in use"):
        await iq.enqueue(rows(1, 1))
    waiter = asyncio.ensure_future(iq._element(1, 5.0))
    await asyncio.sleep(0)
    qm.disconnect_all()  # a blocked read returns dummy data at once
    np.testing.assert_array_equal(await asyncio.wait_for(waiter, 1.0), np.zeros((2, 4)))
    with pytest.raises(QueueDisconnectedError):
        await iq.enqueue(rows(0, 2))
    qm.reset_all()
    await iq.enqueue(rows(4, 2))
    np.testing.assert_array_equal(await iq._element(0, 0.02), rows(4, 2))


async def test_ring_buffer_and_memory_pool() -> None:
    ring: SpscRingBuffer[int] = SpscRingBuffer(2, "r")
    assert await ring.write(1) and ring.write_nowait(2) and not ring.write_nowait(3)
    assert await ring.read_lock() == 1
    ring.read_complete()
    assert ring.read_available() and "1/2 used" in ring.get_state()
    ring.invalidate()
    assert await ring.read_lock() is None and not await ring.write(4)
    pool = RingMemoryPool(24, 2)
    first = pool.get_array((2, 3), np.dtype(np.float32))
    first[...] = 7
    pool.get_memory_blob()
    assert (pool.get_array((2, 3), np.dtype(np.float32)) == 7).all()  # wrapped around

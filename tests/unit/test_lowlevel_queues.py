"""InputQueue / OutputQueue / QueueManager on their own (no device): packing and splitting
rows, zero-copy views, callbacks in order, flush padding, timeouts, disconnect and reset; the
two-phase enqueue (``enqueue_lock`` / ``enqueue_complete``); producer threads with the session's
side on the event loop (threads synchronise through the queue, never with sleeps), and last one
Session on a cpu device fed and drained by threads."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

import numpy as np
import pytest

from actors.device import DeviceManager
from model_runtime.errors import DeviceStateError, InputValidationError
from model_runtime.executable.testing import tiny_executable
from model_runtime.lowlevel import (
    InputData,
    OutputData,
    QueueDisconnectedError,
    QueueManager,
    QueueTimeoutError,
    RingMemoryPool,
    Session,
    SpscRingBuffer,
)

pytestmark = pytest.mark.timeout(20)
T = TypeVar("T")

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


# -- two-phase enqueue (seed enqueueLock / enqueueComplete) ----------------------------------


async def test_input_enqueue_lock_hands_out_one_input_data_until_enqueue_complete() -> None:
    q = manager().input_queue("x")
    events: list[str] = []
    data = await q.enqueue_lock()
    assert isinstance(data, InputData) and await q.enqueue_lock() is data  # seed: same buffer
    data.data = rows(0, 2)
    data.read_start_callback, data.read_complete_callback = note(events, "start", "done")
    assert q._ring.read_available() is False  # not queued before enqueue_complete
    q.enqueue_complete()
    np.testing.assert_array_equal(await q._element(0, 0.05), rows(0, 2))
    q._commit(1)
    assert events == ["start", "done"]
    assert await q.enqueue_lock() is not data  # seed: then a different buffer


async def test_input_enqueue_complete_errors_keep_or_drop_the_lock() -> None:
    """Ours: the seed leaves a complete without a lock, bad data and a disconnect while locked
    unspecified. Here: a typed error each; bad data keeps the lock (fix it, complete again),
    a disconnect drops the data, and a reset drops the lock."""
    q = manager().input_queue("x")
    with pytest.raises(DeviceStateError, match="without enqueue_lock"):
        q.enqueue_complete()
    data = await q.enqueue_lock()
    with pytest.raises(InputValidationError, match=r"set InputData\.data"):
        q.enqueue_complete()
    data.data = np.zeros((2, 5), np.float32)
    with pytest.raises(InputValidationError, match="shape"):
        q.enqueue_complete()
    assert await q.enqueue_lock() is data  # still locked: fix it and complete again
    data.data = rows(0, 2)
    q.enqueue_complete()
    data = await q.enqueue_lock()
    data.data = rows(2, 2)
    q.disconnect()
    with pytest.raises(QueueDisconnectedError):
        q.enqueue_complete()  # disconnected meanwhile: dropped
    with pytest.raises(QueueDisconnectedError):
        await q.enqueue_lock()
    q.reset()
    await q.enqueue_lock()
    q.reset()  # drops the lock
    with pytest.raises(DeviceStateError, match="without enqueue_lock"):
        q.enqueue_complete()


async def test_enqueue_fills_the_locked_buffer_and_enqueue_lock_times_out() -> None:
    q = manager(multiplier=2).input_queue("x")
    data = await q.enqueue_lock()
    data.data = rows(9, 2)  # filled, never completed: enqueue() below writes this buffer
    await q.enqueue(rows(0, 2))  # seed: enqueue locks (the same buffer), fills it, unlocks
    with pytest.raises(DeviceStateError, match="without enqueue_lock"):
        q.enqueue_complete()
    await q.enqueue(rows(2, 2))
    with pytest.raises(QueueTimeoutError, match="buffers still in use"):
        await q.enqueue_lock(timeout=0.01)
    np.testing.assert_array_equal(await q._element(0, 0.05), rows(0, 2))
    np.testing.assert_array_equal(await q._element(1, 0.05), rows(2, 2))


async def test_output_enqueue_lock_hands_out_one_output_data_until_enqueue_complete() -> None:
    oq = manager().output_queue("y")
    oq._write(np.arange(6, dtype=np.float32).reshape(2, 3))  # waits for a buffer
    done: list[str] = []
    data = await oq.enqueue_lock()
    assert isinstance(data, OutputData) and await oq.enqueue_lock() is data
    with pytest.raises(InputValidationError, match="writable numpy array"):
        oq.enqueue_complete()  # no data yet: still locked
    data.data = np.zeros((2, 3), np.float32)
    data.write_complete_callback = lambda: done.append("w")
    oq.enqueue_complete()  # the waiting output fills it at once
    assert done == ["w"] and oq.waiting_elements == 0
    np.testing.assert_array_equal(data.data, np.arange(6).reshape(2, 3))
    with pytest.raises(DeviceStateError, match="without enqueue_lock"):
        oq.enqueue_complete()


# -- producer threads, the session's side on the event loop ----------------------------------

BOUND = 2.0  # outer bound on a cross-thread hand-over
INNER = 4.0  # inner timeout of the waiting call: a lost wake-up is seen at BOUND


def in_thread(fn: Callable[[], T]) -> Future[T]:
    fut: Future[T] = Future()

    def main() -> None:
        try:
            fut.set_result(fn())
        except BaseException as exc:
            fut.set_exception(exc)

    threading.Thread(target=main, daemon=True).start()
    return fut


async def joined(fut: Future[T]) -> T:
    return await asyncio.wait_for(asyncio.wrap_future(fut), BOUND)


async def test_blocking_enqueues_refuse_to_block_the_event_loop() -> None:
    qm = manager()
    with pytest.raises(DeviceStateError, match="block the event loop"):
        qm.input_queue("x").enqueue_blocking(rows(0, 2), timeout=0.01)
    with pytest.raises(DeviceStateError, match="block the event loop"):
        qm.output_queue("y").enqueue_lock_blocking(timeout=0.01)


async def test_session_side_read_wakes_a_producer_thread_blocked_on_a_full_input_queue() -> None:
    q = manager(multiplier=1).input_queue("x")
    await q.enqueue(rows(0, 2))
    producer = in_thread(lambda: q.enqueue_blocking(rows(2, 2), timeout=INNER))
    assert await asyncio.to_thread(q._ring.wait_until_blocked, 1, BOUND)
    np.testing.assert_array_equal(await q._element(0, 0.05), rows(0, 2))  # frees the buffer
    await joined(producer)
    np.testing.assert_array_equal(await q._element(1, 0.05), rows(2, 2))


async def test_producer_thread_enqueue_lock_feeds_async_reads_in_order() -> None:
    q = manager(multiplier=1, timeout=INNER).input_queue("x")
    n = 200

    def producer() -> None:  # one row per buffer: two buffers per element
        for i in range(n):
            data = q.enqueue_lock_blocking()
            data.data = rows(i, 1)
            q.enqueue_complete()

    done = in_thread(producer)
    got: list[np.ndarray] = []
    for _ in range(n // 2):
        got.append((await q._element(0, INNER)).copy())
        q._commit(1)
    await joined(done)
    np.testing.assert_array_equal(np.concatenate(got), rows(0, n))


async def test_output_buffers_from_a_thread_wake_the_session_waiting_for_room() -> None:
    oq = manager(timeout=INNER).output_queue("y")
    for k in range(2):  # the most outputs that may wait for buffers
        oq._write(np.full((2, 3), k, np.float32))
    waiter = asyncio.ensure_future(oq._wait_room(1, INNER))
    await asyncio.sleep(0)
    assert not waiter.done()
    buf = np.zeros((2, 3), np.float32)
    filled: list[str] = []
    consumer = in_thread(lambda: oq.enqueue_blocking(buf, lambda: filled.append("in thread")))
    await asyncio.wait_for(waiter, BOUND)  # its drain made room, from the thread
    await joined(consumer)
    assert filled == ["in thread"] and oq.waiting_elements == 1
    np.testing.assert_array_equal(buf, np.zeros((2, 3)))


async def test_a_write_complete_callback_may_enqueue_the_next_buffer_from_its_thread() -> None:
    oq = manager(timeout=INNER).output_queue("y")
    bufs = [np.zeros((2, 3), np.float32) for _ in range(3)]
    order: list[int] = []

    def refill(k: int) -> Callable[[], None]:
        def cb() -> None:
            order.append(k)
            if k + 1 < len(bufs):  # re-enqueue from inside the callback (it runs unlocked)
                oq.enqueue_blocking(bufs[k + 1], refill(k + 1))

        return cb

    for k in range(3):
        oq._write(np.full((2, 3), k, np.float32))
    await joined(in_thread(lambda: oq.enqueue_blocking(bufs[0], refill(0))))
    assert order == [0, 1, 2]
    assert [float(b[0, 0]) for b in bufs] == [0.0, 1.0, 2.0]


async def test_a_session_fed_and_drained_by_threads() -> None:
    """The seed's use: application threads enqueue inputs and output buffers (two-phase),
    the session runs on its event loop; every ring holds one buffer, so each side waits for
    the other many times."""
    exe = tiny_executable(batch_size=2)
    runs = 20
    data = np.arange(4 * 2 * runs, dtype=np.float32).reshape(2 * runs, 4)
    out = np.zeros((2 * runs, 3), np.float32)
    counters = np.zeros((runs, 1), np.float32)
    async with Session(exe) as s:
        await s.bind_to_device(await DeviceManager().get_device())
        qm = s.create_queue_manager(1, timeout=INNER)
        s.set_callback_for_anchor("counter", lambda a: None)
        x, y, c = qm.input_queue("x"), qm.output_queue("y"), qm.output_queue("counter_out")

        def producer() -> None:
            for i in range(2 * runs):  # a row at a time: packed in pairs
                d = x.enqueue_lock_blocking()
                d.data = data[i : i + 1]
                x.enqueue_complete()

        def consumer() -> None:
            for r in range(runs):
                y.enqueue_blocking(out[2 * r : 2 * r + 2])
                c.enqueue_blocking(counters[r])

        threads = [in_thread(producer), in_thread(consumer)]
        for _ in range(runs):
            await s.run_main_programs()
        for t in threads:
            await joined(t)
    np.testing.assert_allclose(out, data @ exe.tensor("W") + exe.tensor("b"), rtol=1e-5)
    np.testing.assert_array_equal(counters[:, 0], np.arange(1, runs + 1))

"""SpscRingBuffer (seed 003, "Queue management"): the two-phase write (``write_lock`` /
``write_complete``), read locks that hand each item once, ``read_reset``, invalidation, the
read-timeout callback, and a producer and a consumer on different threads and event loops.

Threads synchronise with the ring itself (``wait_until_blocked``: the other side is asleep
in the ring) and with futures, never with sleeps. Every cross-thread wait has an outer bound
shorter than the inner one, so a lost wake-up fails the test instead of passing late.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

import pytest

from model_runtime.errors import ConfigurationError, DeviceStateError
from model_runtime.lowlevel import SpscRingBuffer

pytestmark = pytest.mark.timeout(20)

T = TypeVar("T")
BOUND = 2.0  # outer bound on a cross-thread hand-over
INNER = 4.0  # inner timeout of the waiting call: a lost wake-up is seen at BOUND, not hidden


def in_thread(fn: Callable[[], T]) -> Future[T]:
    """Run ``fn`` on a fresh OS thread; its result (or error) in a future."""
    fut: Future[T] = Future()

    def main() -> None:
        try:
            fut.set_result(fn())
        except BaseException as exc:
            fut.set_exception(exc)

    threading.Thread(target=main, daemon=True).start()
    return fut


async def blocked(ring: SpscRingBuffer[object] | SpscRingBuffer[int], count: int = 1) -> None:
    """Return once ``count`` calls sleep in ``ring`` (asked from a thread: it blocks)."""
    assert await asyncio.to_thread(ring.wait_until_blocked, count, BOUND), ring.get_state()


# -- point: write_lock / write_complete (the two-phase write) --------------------------------


def test_write_lock_returns_the_same_slot_until_write_complete() -> None:
    ring: SpscRingBuffer[str] = SpscRingBuffer(2, "r")
    slot = ring.write_lock_blocking()
    assert slot is not None and ring.write_lock_blocking() is slot  # seed: the same buffer
    slot.value = "a"
    assert not ring.read_available()  # not published before write_complete
    assert ring.write_complete() is True
    assert ring.read_lock_nowait() == "a"
    again = ring.write_lock_blocking()
    assert again is not None and again is not slot  # seed: then a different buffer
    slot.value = "stale"  # the ring took "a" at completion: a stale slot changes nothing
    again.value = "b"
    ring.write_complete()
    assert ring.items() == ("a", "b")


async def test_write_uses_the_write_locked_slot_and_write_lock_waits_for_room() -> None:
    ring: SpscRingBuffer[int] = SpscRingBuffer(2, "r")
    assert await ring.write(1)
    slot = await ring.write_lock(timeout=0)  # room for one more: locked, not yet published
    assert slot is not None and ring.items() == (1,)
    assert await ring.write(3, timeout=0)  # seed: write() locks (the same buffer) and fills it
    with pytest.raises(DeviceStateError, match="without write_lock"):
        ring.write_complete()  # that lock is gone: write() completed it
    assert not ring.write_nowait(4)  # full
    with pytest.raises(TimeoutError):
        await ring.write_lock(timeout=0.01)
    assert ring.items() == (1, 3)


def test_write_complete_out_of_order_raises_and_keeps_the_lock() -> None:
    """Ours: the seed states a precondition (a buffer write-locked) and leaves a breach
    undefined; here it is a typed error, and a slot with no value is never published."""
    ring: SpscRingBuffer[int] = SpscRingBuffer(1, "r")
    with pytest.raises(DeviceStateError, match="without write_lock"):
        ring.write_complete()
    slot = ring.write_lock_blocking()
    assert slot is not None
    with pytest.raises(DeviceStateError, match="before setting"):
        ring.write_complete()  # nothing written: it stays locked
    assert ring.write_lock_blocking(timeout=0) is slot
    slot.value = 5
    assert ring.write_complete() and ring.items() == (5,)
    with pytest.raises(TimeoutError):
        ring.write_lock_blocking(timeout=0.01)  # full now


# -- point: read_lock hands each item once; read_complete; read_reset ------------------------


async def test_read_lock_hands_each_item_once_and_read_complete_drops_the_oldest() -> None:
    ring: SpscRingBuffer[int] = SpscRingBuffer(3, "r")
    for i in (1, 2, 3):
        assert await ring.write(i)
    assert await ring.read_lock() == 1
    assert await ring.read_lock() == 2  # not 1 again
    assert ring.read_available() and "2 read-locked" in ring.get_state()
    ring.read_complete()  # drops 1, the oldest locked
    assert ring.items() == (2, 3) and await ring.write(4, timeout=0)
    assert await ring.read_lock() == 3
    ring.read_complete()
    ring.read_complete()
    assert ring.items() == (4,)
    with pytest.raises(DeviceStateError, match="without read_lock"):
        ring.read_complete()  # 4 is not locked
    assert ring.items() == (4,)


async def test_read_reset_puts_locked_items_back_in_front_in_order() -> None:
    ring: SpscRingBuffer[int] = SpscRingBuffer(3, "r")
    for i in (1, 2, 3):
        await ring.write(i)
    assert [await ring.read_lock(), await ring.read_lock()] == [1, 2]
    ring.read_reset()
    assert [await ring.read_lock() for _ in range(3)] == [1, 2, 3]
    ring.read_reset()
    ring.read_reset()  # nothing locked: nothing to do
    assert ring.peek() == 1 and len(ring) == 3


async def test_read_reset_wakes_a_reader_waiting_behind_locked_items() -> None:
    # seed: readLock() blocks until "some buffers are read-locked and readReset() is called"
    ring: SpscRingBuffer[int] = SpscRingBuffer(1, "r")
    await ring.write(1)
    assert await ring.read_lock() == 1
    reader = asyncio.ensure_future(ring.read_lock())
    await asyncio.sleep(0)  # the reader runs until it waits
    assert not reader.done() and "1 waiting" in ring.get_state()
    ring.read_reset()
    assert await asyncio.wait_for(reader, BOUND) == 1


# -- invalidate, reset -----------------------------------------------------------------------


async def test_invalidate_releases_a_blocked_thread_writer_as_in_the_seed_example() -> None:
    ring: SpscRingBuffer[int] = SpscRingBuffer(1, "r")
    await ring.write(0)

    def producer() -> str:  # the seed's example
        dst = ring.write_lock_blocking(timeout=INNER)
        if not ring.is_valid:
            return "dst is not valid: don't dereference it"
        assert dst is not None
        dst.value = 1
        ring.write_complete()
        return "written"

    done = in_thread(producer)
    await blocked(ring)
    ring.invalidate()
    assert await asyncio.wait_for(asyncio.wrap_future(done), BOUND) == (
        "dst is not valid: don't dereference it"
    )
    assert await ring.read_lock() is None and await ring.write_lock() is None
    assert not await ring.write(2) and not ring.write_nowait(2) and ring.peek() is None


async def test_write_complete_after_invalidate_drops_the_value_and_reset_revalidates() -> None:
    """The seed's ``writeComplete`` returns nothing on an invalidated ring; ours says False, so a
    producer can tell its value was dropped."""
    ring: SpscRingBuffer[int] = SpscRingBuffer(2, "r")
    slot = await ring.write_lock()
    assert slot is not None
    slot.value = 1
    ring.invalidate()
    assert ring.write_complete() is False and len(ring) == 0
    ring.reset()
    assert ring.is_valid and await ring.write(2)
    slot = await ring.write_lock()
    ring.reset()  # drops the write lock too
    with pytest.raises(DeviceStateError, match="without write_lock"):
        ring.write_complete()
    assert len(ring) == 0 and ring.num_buffers == 2 and ring.label == "r"


def test_bad_construction_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError):
        SpscRingBuffer(0, "r")
    with pytest.raises(ConfigurationError):
        SpscRingBuffer(1, "r", timeout=-1)


# -- the read-timeout callback ---------------------------------------------------------------


@pytest.mark.parametrize("side", ["thread", "async"])
async def test_timeout_callback_repeats_while_the_reader_waits(side: str) -> None:
    calls: list[str] = []

    def on_timeout(ring: SpscRingBuffer[int]) -> None:
        calls.append(threading.current_thread().name)
        if len(calls) == 3:  # the third call brings data: no fourth
            ring.write_nowait(7)

    ring: SpscRingBuffer[int] = SpscRingBuffer(1, "r", on_timeout, timeout=0.005)
    if side == "thread":
        got = await asyncio.wait_for(
            asyncio.wrap_future(in_thread(lambda: ring.read_lock_blocking(timeout=INNER))), BOUND
        )
        assert threading.main_thread().name not in calls  # in the reader's thread
    else:
        got = await ring.read_lock(timeout=INNER)
    assert got == 7 and len(calls) == 3
    ring.read_complete()
    assert ring.write_nowait(8)
    assert await ring.read_lock(timeout=INNER) == 8 and len(calls) == 3  # data: no callback


# -- point: thread-safe SPSC (threads and event loops) ---------------------------------------


async def test_blocking_calls_refuse_to_block_the_event_loop() -> None:
    """Ours: every seed call may block its thread. A ``*_blocking`` call on a thread that runs
    an event loop would freeze every coroutine of that loop (the other side of the ring among
    them, so it could never return): it is refused at once, naming the async call to use."""
    ring: SpscRingBuffer[int] = SpscRingBuffer(1, "r")
    with pytest.raises(DeviceStateError, match="block the event loop"):
        ring.read_lock_blocking(timeout=0.01)
    await ring.write(1)
    with pytest.raises(DeviceStateError, match=r"await ring.write_lock\(\)"):
        ring.write_lock_blocking(timeout=0.01)
    with pytest.raises(DeviceStateError, match="block the event loop"):
        ring.write_blocking(2, timeout=0.01)
    with pytest.raises(DeviceStateError, match="to_thread"):
        ring.wait_until_blocked(1, 0.01)


async def test_a_thread_write_wakes_an_async_reader() -> None:
    ring: SpscRingBuffer[int] = SpscRingBuffer(1, "r")
    reader = asyncio.ensure_future(ring.read_lock())  # no inner timeout: only a wake-up ends it
    await asyncio.sleep(0)
    assert not reader.done()
    writer = in_thread(lambda: ring.write_blocking(7, timeout=INNER))
    assert await asyncio.wait_for(reader, BOUND) == 7
    assert await asyncio.wait_for(asyncio.wrap_future(writer), BOUND) is True


async def test_an_async_read_complete_wakes_a_thread_writer() -> None:
    ring: SpscRingBuffer[int] = SpscRingBuffer(1, "r")
    await ring.write(1)
    writer = in_thread(lambda: ring.write_blocking(2, timeout=INNER))
    await blocked(ring)  # the writer sleeps: the ring is full
    assert await ring.read_lock() == 1
    ring.read_complete()
    assert await asyncio.wait_for(asyncio.wrap_future(writer), BOUND) is True
    assert ring.items() == (2,)


async def test_an_async_write_wakes_a_thread_reader() -> None:
    ring: SpscRingBuffer[int] = SpscRingBuffer(1, "r")
    reader = in_thread(lambda: ring.read_lock_blocking(timeout=INNER))
    await blocked(ring)
    assert await ring.write(9)
    assert await asyncio.wait_for(asyncio.wrap_future(reader), BOUND) == 9


async def test_a_writer_on_another_event_loop_wakes_this_loops_reader() -> None:
    ring: SpscRingBuffer[int] = SpscRingBuffer(1, "r")
    reader = asyncio.ensure_future(ring.read_lock())
    await asyncio.sleep(0)

    async def other_loop() -> bool:
        return await ring.write(5)

    writer = in_thread(lambda: asyncio.run(other_loop()))
    assert await asyncio.wait_for(reader, BOUND) == 5
    assert await asyncio.wait_for(asyncio.wrap_future(writer), BOUND) is True


N = 500


async def test_thread_producer_async_consumer_keeps_order_through_a_small_ring() -> None:
    ring: SpscRingBuffer[int] = SpscRingBuffer(2, "r")

    def producer() -> int:
        for i in range(N):
            dst = ring.write_lock_blocking(timeout=INNER)
            if not ring.is_valid:
                return i
            assert dst is not None
            dst.value = i
            ring.write_complete()
        return N

    done = in_thread(producer)
    got: list[int] = []
    for _ in range(N):
        item = await ring.read_lock(timeout=INNER)
        assert item is not None
        got.append(item)
        ring.read_complete()
    assert got == list(range(N))
    assert await asyncio.wait_for(asyncio.wrap_future(done), BOUND) == N


async def test_async_producer_thread_consumer_keeps_order_through_a_small_ring() -> None:
    ring: SpscRingBuffer[int] = SpscRingBuffer(2, "r")

    def consumer() -> list[int]:
        got: list[int] = []
        while len(got) < N:
            item = ring.read_lock_blocking(timeout=INNER)
            if item is None:
                break
            got.append(item)
            ring.read_complete()
        return got

    done = in_thread(consumer)
    for i in range(N):
        slot = await ring.write_lock(timeout=INNER)
        assert slot is not None
        slot.value = i
        ring.write_complete()
    assert await asyncio.wait_for(asyncio.wrap_future(done), BOUND * 5) == list(range(N))

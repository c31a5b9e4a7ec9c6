"""The ring-buffer example of seed 003 (``SpscRingBuffer``), with a producer thread.

The seed's example, as a producer writes one object::

    dst = ring.write_lock_blocking()
    if not ring.is_valid:
        return  # dst is not valid: don't use it
    dst.value = obj
    ring.write_complete()

1. An OS thread writes squares into a 2-buffer ring, as fast as it can; an async consumer
   reads ten of them, then invalidates the ring. The producer, waiting to write more, returns
   early through the ``is_valid`` check.
2. The reverse: an async producer writes cubes, an OS-thread consumer reads ten and
   invalidates the ring.

    python examples/ring_buffer.py

prints::

    thread -> async: [0, 1, 4, 9, 16, 25, 36, 49, 64, 81]
    producer thread: stopped, the ring was invalidated
    async -> thread: [0, 1, 8, 27, 64, 125, 216, 343, 512, 729]
    async producer: stopped, the ring was invalidated
"""

from __future__ import annotations

import asyncio
import itertools
import threading

from model_runtime.lowlevel import SpscRingBuffer

COUNT = 10
TIMEOUT = 10.0  # no wait in this example is unbounded


async def thread_producer_async_consumer() -> None:
    ring: SpscRingBuffer[int] = SpscRingBuffer(2, "squares")

    def producer() -> None:
        for i in itertools.count():
            dst = ring.write_lock_blocking(timeout=TIMEOUT)
            if not ring.is_valid:
                print("producer thread: stopped, the ring was invalidated")
                return
            assert dst is not None
            dst.value = i * i
            ring.write_complete()

    thread = threading.Thread(target=producer, name="producer")
    thread.start()
    got = []
    for _ in range(COUNT):
        item = await ring.read_lock(timeout=TIMEOUT)
        assert item is not None
        got.append(item)
        ring.read_complete()
    print(f"thread -> async: {got}", flush=True)
    ring.invalidate()
    await asyncio.to_thread(thread.join, TIMEOUT)


async def async_producer_thread_consumer() -> None:
    ring: SpscRingBuffer[int] = SpscRingBuffer(2, "cubes")

    def consumer() -> None:
        got = []
        for _ in range(COUNT):
            item = ring.read_lock_blocking(timeout=TIMEOUT)
            assert item is not None
            got.append(item)
            ring.read_complete()
        print(f"async -> thread: {got}", flush=True)
        ring.invalidate()

    thread = threading.Thread(target=consumer, name="consumer")
    thread.start()
    for i in itertools.count():
        dst = await ring.write_lock(timeout=TIMEOUT)
        if not ring.is_valid:
            print("async producer: stopped, the ring was invalidated")
            break
        assert dst is not None
        dst.value = i**3
        ring.write_complete()
    await asyncio.to_thread(thread.join, TIMEOUT)


async def main() -> None:
    await thread_producer_async_consumer()
    await async_producer_thread_consumer()


if __name__ == "__main__":
    asyncio.run(main())

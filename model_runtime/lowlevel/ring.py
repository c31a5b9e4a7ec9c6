"""Ring buffers and memory pools behind the queues (seed ``SpscRingBuffer``, ``RingMemoryPool``).

:class:`SpscRingBuffer` is a fixed-size, single-producer, single-consumer ring. Producer and
consumer may each be an OS thread or a coroutine, on any event loop: a thread producer can feed
an async consumer, and the reverse (as in the seed, where the executable's callback thread and
the application's threads meet at the ring). One ``threading.Lock`` guards the ring's state;
a waiting thread sleeps on its ``Condition``, a waiting coroutine on a future of its own loop,
woken from other threads with ``call_soon_threadsafe``. No call ever blocks an event loop:
the ``*_blocking`` calls refuse to run on a thread that runs one.

Waiting calls come in two forms: ``await ring.write_lock()`` for coroutines and
``ring.write_lock_blocking()`` for threads (likewise ``write``, ``read_lock``). They return
early when the ring is invalidated (``None``/``False``: check :attr:`is_valid`, as the seed's
example does) and raise :class:`TimeoutError` past ``timeout`` seconds, so no caller waits
forever unless it asks to (``timeout=None``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import numpy as np

from model_runtime.errors import ConfigurationError, DeviceStateError
from model_runtime.lowlevel.waiters import PENDING, Pending, Waiters, refuse_on_loop

__all__ = ["RingMemoryPool", "SpscRingBuffer", "WriteSlot"]

T = TypeVar("T")
_ALIGN = 64


class WriteSlot(Generic[T]):
    """The buffer :meth:`SpscRingBuffer.write_lock` hands out (the seed's ``BufferType*``):
    set :attr:`value`, then call :meth:`SpscRingBuffer.write_complete`. The ring takes the
    value at completion; setting it later changes nothing."""

    __slots__ = ("value",)
    value: T


class SpscRingBuffer(Generic[T]):
    """A fixed-size ring of ``num_buffers`` items, one producer, one consumer (see module doc).

    The seed's example, from a producer thread::

        dst = ring.write_lock_blocking()
        if not ring.is_valid:
            return  # dst is not valid: don't use it
        dst.value = obj
        ring.write_complete()

    ``timeout_cb`` is called (with the ring) each ``timeout`` seconds a read lock waits for data,
    until data comes, as the seed's read-timeout callback; it runs in the reader's thread.

    Raises:
        ConfigurationError: (constructor) ``num_buffers`` < 1 or a negative ``timeout``.
    """

    def __init__(
        self,
        num_buffers: int,
        label: str,
        timeout_cb: Callable[[SpscRingBuffer[T]], object] | None = None,
        timeout: float = 0.0,
    ) -> None:
        if num_buffers < 1 or timeout < 0:
            raise ConfigurationError(
                f"ring {label!r}: num_buffers {num_buffers} must be >= 1, timeout {timeout} >= 0"
            )
        self._capacity = num_buffers
        self._label = label
        self._idle: tuple[float, Callable[[], object]] | None = None
        if timeout_cb is not None and timeout > 0:
            self._idle = (timeout, lambda: timeout_cb(self))
        self._items: deque[T] = deque()  # published, oldest first
        self._read_locked = 0  # the first _read_locked items are locked by the reader
        self._slot: WriteSlot[T] | None = None  # locked by the writer, not yet published
        self._valid = True
        self._waiters = Waiters()
        self._lock = self._waiters.cond

    # -- producer ----------------------------------------------------------------------------

    async def write_lock(self, timeout: float | None = None) -> WriteSlot[T] | None:
        """Lock the next free buffer for writing; waits for one. While one is locked, returns
        that same one. None when the ring is (or gets) invalidated.

        Raises:
            TimeoutError: no free buffer within ``timeout`` seconds.
        """
        return await self._waiters.wait(self._try_write_lock, timeout)

    def write_lock_blocking(self, timeout: float | None = None) -> WriteSlot[T] | None:
        """:meth:`write_lock` for a thread.

        Raises:
            TimeoutError: no free buffer within ``timeout`` seconds.
            DeviceStateError: called on an event loop's thread.
        """
        return self._waiters.wait_blocking(
            self._try_write_lock, timeout, instead="await ring.write_lock()"
        )

    def write_complete(self) -> bool:
        """Publish the write-locked buffer to the reader and unlock it; the next lock is a
        different buffer. False if the ring was invalidated meanwhile (the value is dropped).

        Raises:
            DeviceStateError: no buffer is write-locked, or its ``value`` was never set (it
                stays locked).
        """
        with self._lock:
            slot = self._slot
            if slot is None:
                raise DeviceStateError(
                    f"ring {self._label!r}: write_complete() without write_lock()"
                )
            try:
                value = slot.value
            except AttributeError:
                raise DeviceStateError(
                    f"ring {self._label!r}: write_complete() before setting the slot's value"
                ) from None
            self._slot = None
            if not self._valid:
                return False
            self._items.append(value)
            self._waiters.notify()
            return True

    async def write(self, obj: T, timeout: float | None = None) -> bool:
        """Lock a buffer, set it to ``obj`` and publish it (the write-locked one, if any).
        False (and nothing written) if invalidated.

        Raises:
            TimeoutError: no free buffer within ``timeout`` seconds.
        """
        return await self._waiters.wait(lambda: self._try_write(obj), timeout)

    def write_blocking(self, obj: T, timeout: float | None = None) -> bool:
        """:meth:`write` for a thread.

        Raises:
            TimeoutError: no free buffer within ``timeout`` seconds.
            DeviceStateError: called on an event loop's thread.
        """
        return self._waiters.wait_blocking(
            lambda: self._try_write(obj), timeout, instead="await ring.write()"
        )

    def write_nowait(self, obj: T, *, force: bool = False) -> bool:
        """:meth:`write` if there is room (``force``: even past capacity, and ahead of a
        write-locked buffer, for internal markers).

        Returns False if the ring is full (and not ``force``) or invalidated.
        """
        with self._lock:
            if force and self._valid:
                self._items.append(obj)
                self._waiters.notify()
                return True
            result = self._try_write(obj)
            return result is True

    # -- consumer ----------------------------------------------------------------------------

    async def read_lock(self, timeout: float | None = None) -> T | None:
        """Lock the oldest unread item and return it; waits for one. Each call returns the next
        item; locked items stay in the ring until :meth:`read_complete` (or go back to unread
        with :meth:`read_reset`). None when the ring is (or gets) invalidated.

        Raises:
            TimeoutError: nothing to read within ``timeout`` seconds.
        """
        return await self._waiters.wait(self._try_read_lock, timeout, self._idle)

    def read_lock_blocking(self, timeout: float | None = None) -> T | None:
        """:meth:`read_lock` for a thread.

        Raises:
            TimeoutError: nothing to read within ``timeout`` seconds.
            DeviceStateError: called on an event loop's thread.
        """
        return self._waiters.wait_blocking(
            self._try_read_lock, timeout, self._idle, instead="await ring.read_lock()"
        )

    def read_lock_nowait(self) -> T | None:
        """:meth:`read_lock` without waiting: None when nothing is unread or invalidated."""
        with self._lock:
            result = self._try_read_lock()
            return None if result is PENDING else result

    def read_complete(self) -> None:
        """Drop the oldest read-locked item, making room for the writer.

        Raises:
            DeviceStateError: no item is read-locked.
        """
        with self._lock:
            if not self._read_locked:
                raise DeviceStateError(f"ring {self._label!r}: read_complete() without read_lock()")
            self._items.popleft()
            self._read_locked -= 1
            self._waiters.notify()

    def read_reset(self) -> None:
        """Unlock every read-locked item and put them back, in order, at the front of the unread
        items: the next :meth:`read_lock` returns the oldest again."""
        with self._lock:
            if self._read_locked:
                self._read_locked = 0
                self._waiters.notify()

    def read_available(self) -> bool:
        """Whether an item is available to be read-locked now."""
        with self._lock:
            return self._valid and self._read_locked < len(self._items)

    def peek(self) -> T | None:
        """The item :meth:`read_lock` would return now, without locking it (None if none)."""
        with self._lock:
            if self._valid and self._read_locked < len(self._items):
                return self._items[self._read_locked]
            return None

    # -- state -------------------------------------------------------------------------------

    def invalidate(self) -> None:
        """Make every blocking call return at once (and every later one), from any thread."""
        with self._lock:
            self._valid = False
            self._waiters.notify()

    def reset(self) -> None:
        """Drop every item and every lock, and make the ring valid again."""
        with self._lock:
            self._items.clear()
            self._read_locked = 0
            self._slot = None
            self._valid = True
            self._waiters.notify()

    @property
    def is_valid(self) -> bool:
        return self._valid

    @property
    def num_buffers(self) -> int:
        return self._capacity

    @property
    def label(self) -> str:
        return self._label

    def items(self) -> tuple[T, ...]:
        """The published items, oldest first, read-locked ones included (a snapshot)."""
        with self._lock:
            return tuple(self._items)

    def get_state(self, prefix: str = "") -> str:
        """A one-line debug description."""
        with self._lock:
            return (
                f"{prefix}{self._label}: {len(self._items)}/{self._capacity} used, "
                f"{self._read_locked} read-locked, "
                f"{'1' if self._slot is not None else '0'} write-locked, "
                f"{'valid' if self._valid else 'invalidated'}, {self._waiters.blocked} waiting"
            )

    def wait_until_blocked(self, count: int = 1, timeout: float = 5.0) -> bool:
        """Block until ``count`` calls wait on this ring (see :meth:`Waiters.wait_until_blocked`).

        Raises:
            DeviceStateError: called on an event loop's thread (run it in a thread).
        """
        refuse_on_loop("asyncio.to_thread(ring.wait_until_blocked)")
        return self._waiters.wait_until_blocked(count, timeout)

    def __len__(self) -> int:
        return len(self._items)

    # -- attempts (with the lock held) -------------------------------------------------------

    def _try_write_lock(self) -> WriteSlot[T] | Pending | None:
        if not self._valid:
            return None
        if self._slot is None:
            if len(self._items) >= self._capacity:
                return PENDING
            self._slot = WriteSlot()
        return self._slot

    def _try_write(self, obj: T) -> bool | Pending:
        if not self._valid:
            return False
        if self._slot is None and len(self._items) >= self._capacity:
            return PENDING
        self._slot = None  # a write-locked buffer is the one written (seed)
        self._items.append(obj)
        self._waiters.notify()
        return True

    def _try_read_lock(self) -> T | Pending | None:
        if not self._valid:
            return None
        if self._read_locked < len(self._items):
            self._read_locked += 1
            return self._items[self._read_locked - 1]
        return PENDING


class RingMemoryPool:
    """``num_blobs`` blobs of ``blob_size`` bytes, allocated once, handed out round-robin.

    Raises:
        ConfigurationError: (constructor) a size or count below 1.
    """

    def __init__(self, blob_size: int, num_blobs: int) -> None:
        if blob_size < 1 or num_blobs < 1:
            raise ConfigurationError(
                f"RingMemoryPool: blob_size {blob_size} and num_blobs {num_blobs} must be >= 1"
            )
        self._blob_size = blob_size
        self._stride = -(-blob_size // _ALIGN) * _ALIGN
        self._memory = np.zeros(self._stride * num_blobs, np.uint8)
        self._num_blobs = num_blobs
        self._next = 0

    @property
    def blob_size(self) -> int:
        return self._blob_size

    @property
    def num_blobs(self) -> int:
        return self._num_blobs

    def get_memory_blob(self) -> np.ndarray:
        """The next blob (``uint8``, ``blob_size`` bytes); wraps around after the last."""
        start = self._next * self._stride
        self._next = (self._next + 1) % self._num_blobs
        return self._memory[start : start + self._blob_size]

    def get_array(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        """The next blob viewed as an array of ``shape`` and ``dtype``.

        Raises:
            ConfigurationError: the array does not fit in a blob.
        """
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if nbytes > self._blob_size:
            raise ConfigurationError(f"{nbytes} bytes do not fit a {self._blob_size}-byte blob")
        return self.get_memory_blob()[:nbytes].view(dtype).reshape(shape)

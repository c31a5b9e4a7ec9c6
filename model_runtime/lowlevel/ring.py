"""Ring buffers and memory pools behind the queues (seed ``SpscRingBuffer``, ``RingMemoryPool``).

The seed's ring buffer is lock-free across threads; here producer and consumer are coroutines on
one event loop, so the ring is a bounded deque with an :class:`asyncio.Condition`. Blocking calls
(``write``, ``read_lock``) wait for room or data, return early when the ring is invalidated
(``None``/``False``: check :attr:`is_valid`), and raise :class:`TimeoutError` past ``timeout``
seconds, so no caller waits forever unless it asks to.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import numpy as np

from model_runtime.errors import ConfigurationError

__all__ = ["RingMemoryPool", "SpscRingBuffer"]

T = TypeVar("T")
_ALIGN = 64


class SpscRingBuffer(Generic[T]):
    """A fixed-size ring of ``num_buffers`` items, one producer, one consumer (see module doc).

    ``timeout_cb`` is called (with the ring) each time ``read_lock`` has waited ``timeout``
    seconds without data, as the seed's read-timeout callback.

    Raises:
        ConfigurationError: (constructor) ``num_buffers`` < 1 or a negative ``timeout``.
    """

    def __init__(
        self,
        num_buffers: int,
        label: str,
        timeout_cb: Callable[[SpscRingBuffer[T]], None] | None = None,
        timeout: float = 0.0,
    ) -> None:
        if num_buffers < 1 or timeout < 0:
            raise ConfigurationError(
                f"ring {label!r}: num_buffers {num_buffers} must be >= 1, timeout {timeout} >= 0"
            )
        self._capacity = num_buffers
        self._label = label
        self._timeout_cb = timeout_cb
        self._cb_timeout = timeout
        self._items: deque[T] = deque()
        self._valid = True
        # A fresh event per change: waiters hold the current one, a change sets and replaces it
        # (synchronous to signal, so the sync calls below can wake waiters).
        self._changed = asyncio.Event()

    async def _wait_until(self, ready: Callable[[], bool], timeout: float | None) -> None:
        async with asyncio.timeout(timeout):
            while not ready():
                changed = self._changed
                if self._timeout_cb is not None and self._cb_timeout > 0:
                    try:
                        async with asyncio.timeout(self._cb_timeout):
                            await changed.wait()
                    except TimeoutError:
                        self._timeout_cb(self)
                else:
                    await changed.wait()

    # -- producer ----------------------------------------------------------------------------

    async def write(self, obj: T, timeout: float | None = None) -> bool:
        """Append ``obj``, waiting for room. Returns False (and writes nothing) if invalidated.

        Raises:
            TimeoutError: no room within ``timeout`` seconds.
        """
        await self._wait_until(lambda: not self._valid or self._has_room(), timeout)
        return self.write_nowait(obj)

    def write_nowait(self, obj: T, *, force: bool = False) -> bool:
        """Append ``obj`` if there is room (``force``: even past capacity, for internal markers).

        Returns False if the ring is full (and not ``force``) or invalidated.
        """
        if not self._valid or (not force and not self._has_room()):
            return False
        self._items.append(obj)
        self._notify()
        return True

    # -- consumer ----------------------------------------------------------------------------

    async def read_lock(self, timeout: float | None = None) -> T | None:
        """The oldest item, left in the ring until :meth:`read_complete`; waits for one.

        Returns None when the ring is (or gets) invalidated.

        Raises:
            TimeoutError: nothing to read within ``timeout`` seconds.
        """
        await self._wait_until(lambda: not self._valid or bool(self._items), timeout)
        return self.peek()

    def peek(self) -> T | None:
        """The oldest item without waiting (None when empty or invalidated)."""
        return self._items[0] if self._valid and self._items else None

    def read_complete(self) -> None:
        """Drop the oldest item (the one :meth:`read_lock` returned), making room."""
        if self._items:
            self._items.popleft()
            self._notify()

    def read_available(self) -> bool:
        return self._valid and bool(self._items)

    # -- state -------------------------------------------------------------------------------

    def invalidate(self) -> None:
        """Make every blocking call return at once (and every later one)."""
        self._valid = False
        self._notify()

    def reset(self) -> None:
        """Drop every item and make the ring valid again."""
        self._items.clear()
        self._valid = True
        self._notify()

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
        """The items in the ring, oldest first (a snapshot)."""
        return tuple(self._items)

    def get_state(self, prefix: str = "") -> str:
        """A one-line debug description."""
        return (
            f"{prefix}{self._label}: {len(self._items)}/{self._capacity} used, "
            f"{'valid' if self._valid else 'invalidated'}"
        )

    def __len__(self) -> int:
        return len(self._items)

    def _has_room(self) -> bool:
        return len(self._items) < self._capacity

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()


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

"""Input and output queues (seed ``InputQueue``, ``OutputQueue``, ``IQueue``).

An :class:`InputQueue` packs or splits what you enqueue into the elements the executable reads:
an anchor with a batch dimension takes ``B`` rows along it per element, so you may enqueue any
number of rows at a time; an anchor without one takes exactly its own shape. An
:class:`OutputQueue` splits what the executable writes into the buffers you enqueue, in order.
Queues are created by :class:`~model_runtime.lowlevel.queue_manager.QueueManager`.

Enqueue in one call (``await q.enqueue(...)``) or in two, as the seed does: ``enqueue_lock``
hands out an :class:`InputData` (:class:`OutputData`) to fill and ``enqueue_complete`` queues
it. The producer side (``enqueue*``, ``flush``) may run on an OS thread while the session runs
on its event loop: the waiting calls have ``*_blocking`` forms for threads, and the queue's ring
is thread-safe (see :mod:`.ring`). One producer per queue.

Memory: an enqueued input is not copied when one element can be a view of it (rows first,
C-contiguous); else its rows are copied into a :class:`RingMemoryPool` blob. Either way, do not
modify an enqueued array until its ``read_complete_callback`` ran. Outputs the executable writes
before you enqueue a buffer for them wait in the queue (at most ``num_buffers`` elements).

Callbacks: ``read_start_callback`` when the first rows of an enqueued input are taken,
``read_complete_callback`` when its last rows are about to be consumed by the executable (both
on the session's event loop), ``write_complete_callback`` once an output buffer is full: on the
session's loop, or in the enqueuing thread when outputs were already waiting for that buffer.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque

import numpy as np

from model_runtime.errors import InputValidationError
from model_runtime.executable.model import Anchor
from model_runtime.lowlevel.errors import QueueTimeoutError
from model_runtime.lowlevel.queue_base import (
    InputData,
    OutputData,
    ReadCompleteCallback,
    ReadStartCallback,
    WriteCompleteCallback,
    _Element,
    _InEntry,
    _OutEntry,
    _Queue,
)
from model_runtime.lowlevel.ring import RingMemoryPool
from model_runtime.lowlevel.waiters import PENDING, Pending, Waiters

__all__ = [
    "InputData",
    "InputQueue",
    "OutputData",
    "OutputQueue",
    "ReadCompleteCallback",
    "ReadStartCallback",
    "WriteCompleteCallback",
    "allocate_queue_storage",
]


def allocate_queue_storage(
    queue: InputQueue | OutputQueue, extra_buffers: int = 0
) -> RingMemoryPool:
    """A memory pool big enough to back ``queue`` (one blob per buffer, plus ``extra_buffers``).

    Raises:
        ConfigurationError: ``extra_buffers`` makes the count < 1.
    """
    return RingMemoryPool(
        max(1, queue.tensor_info.size_in_bytes), queue.num_buffers + extra_buffers
    )


class InputQueue(_Queue[InputData]):
    """Feeds one input anchor (see the module docstring). Made by ``QueueManager``."""

    def __init__(self, anchor: Anchor, num_buffers: int, timeout: float) -> None:
        super().__init__(anchor, num_buffers, timeout, "input")
        self._pool = allocate_queue_storage(self, extra_buffers=1)
        self._prepared: deque[_Element] = deque()
        self._partial: _Element | None = None
        self._filled = 0
        self._dummy = np.zeros(anchor.shape, anchor.dtype)
        self._dummy.flags.writeable = False

    def _new_data(self) -> InputData:
        return InputData()

    async def enqueue(
        self,
        tensor: np.ndarray,
        read_start_callback: ReadStartCallback | None = None,
        read_complete_callback: ReadCompleteCallback | None = None,
        *,
        timeout: float | None = None,
    ) -> None:
        """Queue ``tensor`` (rows along the anchor's batch axis, or exactly its shape): lock a
        buffer (the enqueue-locked one, if any), fill it and complete it.

        Waits for a free buffer at most ``timeout`` seconds (default: the queue's timeout).

        Raises:
            InputValidationError: wrong dtype or shape.
            QueueTimeoutError: no free buffer in time.
            QueueDisconnectedError: the queue is disconnected.
        """
        rows = self._validated_rows(np.asarray(tensor))
        await self._put(_InEntry(rows, read_start_callback, read_complete_callback), timeout)
        self._count = (self._count + rows.shape[0]) % self._rows_per_element

    def enqueue_blocking(
        self,
        tensor: np.ndarray,
        read_start_callback: ReadStartCallback | None = None,
        read_complete_callback: ReadCompleteCallback | None = None,
        *,
        timeout: float | None = None,
    ) -> None:
        """:meth:`enqueue` for a producer thread.

        Raises:
            InputValidationError: wrong dtype or shape.
            QueueTimeoutError: no free buffer in time.
            QueueDisconnectedError: the queue is disconnected.
            DeviceStateError: called on an event loop's thread (await :meth:`enqueue`).
        """
        rows = self._validated_rows(np.asarray(tensor))
        self._put_blocking(_InEntry(rows, read_start_callback, read_complete_callback), timeout)
        self._count = (self._count + rows.shape[0]) % self._rows_per_element

    def enqueue_complete(self) -> None:
        """Queue the locked :class:`InputData` and unlock it; the next lock is a new buffer.

        Raises:
            DeviceStateError: no buffer is locked (no :meth:`enqueue_lock`, or a reset since).
            InputValidationError: ``data`` unset, or of the wrong dtype or shape (the buffer
                stays locked: fix it and complete again).
            QueueDisconnectedError: the queue was disconnected meanwhile (the data is dropped).
        """
        data = self._check_locked()
        if data.data is None:
            raise InputValidationError(
                f"input queue {self.name!r}: set InputData.data before enqueue_complete()"
            )
        rows = self._validated_rows(np.asarray(data.data))
        self._complete(_InEntry(rows, data.read_start_callback, data.read_complete_callback))
        self._count = (self._count + rows.shape[0]) % self._rows_per_element

    def flush(self) -> None:
        """Pad a partly enqueued element with zero rows, or, with none, queue a dummy element
        (ahead of an enqueue-locked buffer, which is not queued yet)."""
        if self._ring.is_valid:
            pad = np.zeros((self._flush_rows(), *self._ring_shape[1:]), self.anchor.dtype)
            self._ring.write_nowait(_InEntry(pad, None, None), force=True)

    def reset(self) -> None:
        """Drop everything queued, locked or half-read, and reconnect the queue."""
        self._ring.reset()
        self._prepared.clear()
        self._partial = None
        self._filled = 0
        self._reset_producer()

    @property
    def queued_elements(self) -> int:
        """Elements already prepared for the next runs (read, not yet consumed)."""
        return len(self._prepared)

    async def _element(self, index: int, timeout: float) -> np.ndarray:
        """Element ``index`` of the upcoming run, reading data as needed (session side).

        Raises:
            QueueTimeoutError: not enough data within ``timeout`` seconds (what was read is
                kept for the next attempt).
        """
        try:
            async with asyncio.timeout(timeout):
                while len(self._prepared) <= index:
                    await self._build_one()
        except TimeoutError:
            raise QueueTimeoutError(
                f"input queue {self.name!r}: no data for element {index} within {timeout} s "
                f"({self._filled} of {self._rows_per_element} rows ready)"
            ) from None
        return self._prepared[index].array

    def _commit(self, n: int) -> None:
        """The first ``n`` elements go to the executable: fire their read-complete callbacks."""
        for _ in range(min(n, len(self._prepared))):
            for cb in self._prepared.popleft().done:
                cb()

    async def _build_one(self) -> None:
        rows_needed = self._rows_per_element
        while True:
            entry: _InEntry | None = await self._ring.read_lock()
            if entry is None:  # disconnected: dummy data so the run can finish
                self._partial = None
                self._filled = 0
                self._prepared.append(_Element(self._dummy))
                return
            if not entry.started:
                entry.started = True
                if entry.read_start is not None:
                    entry.read_start()
            total = entry.rows.shape[0]
            start = entry.offset
            if self._partial is None and total - start >= rows_needed:
                view = entry.rows[start : start + rows_needed]
                if self._axis is None:
                    view = view[0]
                if self._axis in (None, 0) and view.flags.c_contiguous:
                    entry.offset += rows_needed
                    element = _Element(view)
                    self._entry_taken(entry, element)
                    self._prepared.append(element)
                    return
            if self._partial is None:
                self._partial = _Element(self._pool.get_array(self.anchor.shape, self.anchor.dtype))
                self._filled = 0
            take = min(total - start, rows_needed - self._filled)
            dst = self._rows(self._partial.array)
            dst[self._filled : self._filled + take] = entry.rows[start : start + take]
            entry.offset += take
            self._filled += take
            self._entry_taken(entry, self._partial)
            if self._filled == rows_needed:
                self._prepared.append(self._partial)
                self._partial = None
                self._filled = 0
                return

    def _entry_taken(self, entry: _InEntry, element: _Element) -> None:
        if entry.offset >= entry.rows.shape[0]:
            if entry.read_complete is not None:
                element.done.append(entry.read_complete)
            self._ring.read_complete()
        else:  # rows left for the next element: the entry goes back, first to read again
            self._ring.read_reset()


class OutputQueue(_Queue[OutputData]):
    """Collects one output anchor into your buffers (see the module docstring).

    Outputs are moved into buffers by whoever makes the match: the session when it writes
    (buffers were waiting), or the producer when it enqueues (outputs were waiting); a lock
    keeps the two apart, and callbacks run after it is released.
    """

    def __init__(self, anchor: Anchor, num_buffers: int, timeout: float) -> None:
        super().__init__(anchor, num_buffers, timeout, "output")
        self._stash: deque[np.ndarray] = deque()
        self._stashed = 0
        self._mutex = threading.Lock()  # the stash, and draining it into the ring's buffers
        self._room = Waiters(self._mutex)

    def _new_data(self) -> OutputData:
        return OutputData()

    def _validated_output(self, output: object) -> np.ndarray:
        if not isinstance(output, np.ndarray) or not output.flags.writeable:
            raise InputValidationError(
                f"output queue {self.name!r}: the buffer must be a writable numpy array"
            )
        return self._validated_rows(output)

    async def enqueue(
        self,
        output: np.ndarray,
        write_complete_callback: WriteCompleteCallback | None = None,
        *,
        timeout: float | None = None,
    ) -> None:
        """Queue ``output``, a writable buffer for the next rows (or the whole tensor): lock a
        buffer (the enqueue-locked one, if any), fill it and complete it.

        Waits for a free buffer at most ``timeout`` seconds (default: the queue's timeout).

        Raises:
            InputValidationError: not a writable numpy array, or wrong dtype or shape.
            QueueTimeoutError: no free buffer in time.
            QueueDisconnectedError: the queue is disconnected.
        """
        rows = self._validated_output(output)
        await self._put(_OutEntry(rows, rows.shape[0], write_complete_callback), timeout)
        self._enqueued(rows)

    def enqueue_blocking(
        self,
        output: np.ndarray,
        write_complete_callback: WriteCompleteCallback | None = None,
        *,
        timeout: float | None = None,
    ) -> None:
        """:meth:`enqueue` for a producer thread.

        Raises:
            InputValidationError: not a writable numpy array, or wrong dtype or shape.
            QueueTimeoutError: no free buffer in time.
            QueueDisconnectedError: the queue is disconnected.
            DeviceStateError: called on an event loop's thread (await :meth:`enqueue`).
        """
        rows = self._validated_output(output)
        self._put_blocking(_OutEntry(rows, rows.shape[0], write_complete_callback), timeout)
        self._enqueued(rows)

    def enqueue_complete(self) -> None:
        """Queue the locked :class:`OutputData` and unlock it; the next lock is a new buffer.

        Raises:
            DeviceStateError: no buffer is locked (no :meth:`enqueue_lock`, or a reset since).
            InputValidationError: ``data`` unset, not a writable numpy array, or of the wrong
                dtype or shape (the buffer stays locked: fix it and complete again).
            QueueDisconnectedError: the queue was disconnected meanwhile (the buffer is
                dropped).
        """
        data = self._check_locked()
        rows = self._validated_output(data.data)
        self._complete(_OutEntry(rows, rows.shape[0], data.write_complete_callback))
        self._enqueued(rows)

    def _enqueued(self, rows: np.ndarray) -> None:
        self._count = (self._count + rows.shape[0]) % self._rows_per_element
        self._drain()

    def flush(self) -> None:
        """Discard the rows that complete a partly requested element (the padding of the
        matching input flush), or, with none, one whole (dummy) element."""
        if self._ring.is_valid:
            self._ring.write_nowait(_OutEntry(None, self._flush_rows(), None), force=True)
            self._drain()

    def reset(self) -> None:
        """Drop every queued or locked buffer and waiting output, and reconnect the queue."""
        with self._mutex:
            self._ring.reset()
            self._stash.clear()
            self._stashed = 0
            self._room.notify()
        self._reset_producer()

    def disconnect(self) -> None:
        """See :meth:`_Queue.disconnect`."""
        super().disconnect()
        with self._mutex:
            self._room.notify()

    @property
    def waiting_elements(self) -> float:
        """Outputs written by the executable that no buffer has taken yet, in elements."""
        return self._stashed / self._rows_per_element

    async def _wait_room(self, elements: int, timeout: float) -> None:
        """Wait until ``elements`` more outputs can wait in the queue (session side).

        Raises:
            QueueTimeoutError: no room within ``timeout`` seconds.
        """
        limit = self.num_buffers * self._rows_per_element
        need = elements * self._rows_per_element

        def room() -> bool | Pending:
            return True if not self._ring.is_valid or self._stashed + need <= limit else PENDING

        try:
            await self._room.wait(room, timeout)
        except TimeoutError:
            raise QueueTimeoutError(
                f"output queue {self.name!r}: {self.waiting_elements:g} outputs wait for buffers "
                f"after {timeout} s; enqueue output buffers"
            ) from None

    def _write(self, element: np.ndarray) -> None:
        """The executable wrote ``element`` (session side; dropped when disconnected)."""
        if self._ring.is_valid:
            rows = self._rows(element)
            with self._mutex:
                self._stash.append(rows)
                self._stashed += rows.shape[0]
            self._drain()

    def _drain(self) -> None:
        done: list[WriteCompleteCallback] = []
        with self._mutex:
            entry: _OutEntry | None = None
            moved = False
            while self._stash:
                if entry is None:
                    entry = self._ring.read_lock_nowait()
                    if entry is None:
                        break
                src = self._stash[0]
                take = min(src.shape[0], entry.count - entry.offset)
                if entry.rows is not None:
                    entry.rows[entry.offset : entry.offset + take] = src[:take]
                entry.offset += take
                if take == src.shape[0]:
                    self._stash.popleft()
                else:
                    self._stash[0] = src[take:]
                self._stashed -= take
                moved = True
                if entry.offset == entry.count:
                    self._ring.read_complete()
                    if entry.write_complete is not None:
                        done.append(entry.write_complete)
                    entry = None
            if entry is not None:  # partly filled: it goes back, first to fill next time
                self._ring.read_reset()
            if moved:
                self._room.notify()
        for cb in done:
            cb()

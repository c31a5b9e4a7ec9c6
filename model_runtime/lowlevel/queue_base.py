"""What input and output queues share (seed ``IQueue``): the buffers callers fill, the
producer's side of the ring (lock, complete, flush) and the row validation. The queues
themselves, and the contract, are in :mod:`.queues`."""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np

from model_runtime.errors import DeviceStateError, InputValidationError
from model_runtime.executable.model import Anchor, TensorInfo
from model_runtime.lowlevel.errors import QueueDisconnectedError, QueueTimeoutError
from model_runtime.lowlevel.ring import (
    SpscRingBuffer,
    WriteSlot,
)

__all__ = [
    "InputData",
    "OutputData",
    "ReadCompleteCallback",
    "ReadStartCallback",
    "WriteCompleteCallback",
]

ReadStartCallback = Callable[[], object]
ReadCompleteCallback = Callable[[], object]
WriteCompleteCallback = Callable[[], object]


@dataclass(slots=True, eq=False)
class InputData:
    """An input buffer to fill between :meth:`InputQueue.enqueue_lock` and
    :meth:`InputQueue.enqueue_complete` (seed ``InputData``; the array carries its size)."""

    data: np.ndarray | None = None
    read_start_callback: ReadStartCallback | None = None
    read_complete_callback: ReadCompleteCallback | None = None


@dataclass(slots=True, eq=False)
class OutputData:
    """An output buffer to fill between :meth:`OutputQueue.enqueue_lock` and
    :meth:`OutputQueue.enqueue_complete` (seed ``OutputData``): ``data`` is where to write."""

    data: np.ndarray | None = None
    write_complete_callback: WriteCompleteCallback | None = None


D = TypeVar("D", bound=InputData | OutputData)


@dataclass(slots=True, eq=False)
class _InEntry:
    rows: np.ndarray  # rows first
    read_start: ReadStartCallback | None
    read_complete: ReadCompleteCallback | None
    offset: int = 0
    started: bool = False


@dataclass(slots=True, eq=False)
class _Element:
    array: np.ndarray  # the anchor's shape
    done: list[ReadCompleteCallback] = field(default_factory=list)


@dataclass(slots=True, eq=False)
class _OutEntry:
    rows: np.ndarray | None  # None: rows to discard (flush)
    count: int
    write_complete: WriteCompleteCallback | None
    offset: int = 0


class _Queue(abc.ABC, Generic[D]):
    """What input and output queues share (seed ``IQueue``), and the producer's side."""

    def __init__(self, anchor: Anchor, num_buffers: int, timeout: float, kind: str) -> None:
        self.anchor = anchor
        self.timeout = timeout
        self._axis = anchor.batch_dim
        self._rows_per_element = 1 if self._axis is None else anchor.shape[self._axis]
        self._ring_shape = (
            (1, *anchor.shape)
            if self._axis is None
            else (self._rows_per_element, *_without(anchor.shape, self._axis))
        )
        self._ring: SpscRingBuffer[Any] = SpscRingBuffer(num_buffers, f"{kind}:{anchor.name}")
        self._kind = kind
        self._count = 0  # rows enqueued, modulo the rows of one element
        self._slot: WriteSlot[Any] | None = None  # the ring's buffer behind enqueue_lock
        self._locked: D | None = None  # what enqueue_lock handed out

    @property
    def name(self) -> str:
        return self.anchor.name

    @property
    def tensor_info(self) -> TensorInfo:
        """Shape and dtype of one element (the anchor's)."""
        return self.anchor.tensor_info

    @property
    def num_buffers(self) -> int:
        """How many enqueued tensors the queue holds before ``enqueue`` waits."""
        return self._ring.num_buffers

    @property
    def is_connected(self) -> bool:
        return self._ring.is_valid

    def disconnect(self) -> None:
        """Stop waiting for data: blocked calls return, reads give dummy (zero) data, writes are
        dropped, and ``enqueue`` raises until :meth:`reset`."""
        self._ring.invalidate()

    async def enqueue_lock(self, *, timeout: float | None = None) -> D:
        """Lock a buffer for writing and return it to fill (an :class:`InputData` or an
        :class:`OutputData`); waits for a free one at most ``timeout`` seconds (default: the
        queue's timeout). One buffer is locked at a time: while one is, this returns it again.

        Raises:
            QueueTimeoutError: no free buffer in time.
            QueueDisconnectedError: the queue is disconnected.
        """
        return await self._lock(timeout)

    def enqueue_lock_blocking(self, *, timeout: float | None = None) -> D:
        """:meth:`enqueue_lock` for a producer thread.

        Raises:
            QueueTimeoutError: no free buffer in time.
            QueueDisconnectedError: the queue is disconnected.
            DeviceStateError: called on an event loop's thread (await :meth:`enqueue_lock`).
        """
        return self._lock_blocking(timeout)

    @abc.abstractmethod
    def _new_data(self) -> D:
        """A fresh buffer box for ``enqueue_lock`` (input or output data)."""

    def _rows(self, array: np.ndarray) -> np.ndarray:
        if self._axis is None:
            return array[np.newaxis]
        return array if self._axis == 0 else np.moveaxis(array, self._axis, 0)

    def _validated_rows(self, array: np.ndarray) -> np.ndarray:
        a = self.anchor
        if array.dtype != a.dtype:
            raise InputValidationError(
                f"{self._kind} queue {a.name!r}: dtype {array.dtype.name}, expected {a.dtype.name}"
            )
        if self._axis is None:
            ok = array.shape == a.shape
            want = f"{list(a.shape)}"
        else:
            ok = (
                array.ndim == len(a.shape)
                and array.shape[self._axis] >= 1
                and _without(array.shape, self._axis) == _without(a.shape, self._axis)
            )
            want = f"{list(a.shape)} with any number (>= 1) of rows along axis {self._axis}"
        if not ok:
            raise InputValidationError(
                f"{self._kind} queue {a.name!r}: shape {list(array.shape)}, expected {want}"
            )
        return self._rows(array)

    # -- producer: waiting for a buffer ------------------------------------------------------

    def _disconnected(self) -> QueueDisconnectedError:
        return QueueDisconnectedError(f"{self._kind} queue {self.name!r} is disconnected")

    def _full(self, limit: float) -> QueueTimeoutError:
        return QueueTimeoutError(
            f"{self._kind} queue {self.name!r}: all {self.num_buffers} buffers still in use "
            f"after {limit} s"
        )

    def _limit(self, timeout: float | None) -> float:
        if not self._ring.is_valid:
            raise self._disconnected()
        return self.timeout if timeout is None else timeout

    async def _put(self, entry: object, timeout: float | None) -> None:
        limit = self._limit(timeout)
        try:
            written = await self._ring.write(entry, limit)
        except TimeoutError:
            raise self._full(limit) from None
        self._written(written)

    def _put_blocking(self, entry: object, timeout: float | None) -> None:
        limit = self._limit(timeout)
        try:
            written = self._ring.write_blocking(entry, limit)
        except TimeoutError:
            raise self._full(limit) from None
        self._written(written)

    def _written(self, written: bool) -> None:
        if not written:
            raise self._disconnected()
        self._slot = self._locked = None  # a write-locked buffer was the one written (seed)

    async def _lock(self, timeout: float | None) -> D:
        limit = self._limit(timeout)
        try:
            slot = await self._ring.write_lock(limit)
        except TimeoutError:
            raise self._full(limit) from None
        return self._locked_data(slot)

    def _lock_blocking(self, timeout: float | None) -> D:
        limit = self._limit(timeout)
        try:
            slot = self._ring.write_lock_blocking(limit)
        except TimeoutError:
            raise self._full(limit) from None
        return self._locked_data(slot)

    def _locked_data(self, slot: WriteSlot[Any] | None) -> D:
        if slot is None:
            raise self._disconnected()
        if self._locked is None or self._slot is not slot:
            self._slot, self._locked = slot, self._new_data()
        return self._locked

    def _check_locked(self) -> D:
        if self._locked is None or self._slot is None:
            raise DeviceStateError(
                f"{self._kind} queue {self.name!r}: enqueue_complete() without enqueue_lock()"
            )
        return self._locked

    def _complete(self, entry: object) -> None:
        """Publish the locked buffer as ``entry``."""
        assert self._slot is not None
        self._slot.value = entry
        written = self._ring.write_complete()
        self._slot = self._locked = None
        if not written:
            raise self._disconnected()

    def _flush_rows(self) -> int:
        rem = self._count % self._rows_per_element
        self._count = 0
        return self._rows_per_element - rem if rem else self._rows_per_element

    def _reset_producer(self) -> None:
        self._count = 0
        self._slot = self._locked = None


def _without(shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    return shape[:axis] + shape[axis + 1 :]

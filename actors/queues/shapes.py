"""Batches of one shape: how a Queue packs the requests of a model with dynamic dimensions.

A model whose inputs have dynamic dimensions besides the batch (a text model's ``seq``) takes
requests of many shapes, and one batch holds rows of one shape only (Triton's rule). The Queue
keeps its one FIFO; when it seals a batch it picks the shape of the oldest waiting request (or,
for a full batch, the oldest shape that fills one), takes that shape's requests in FIFO order
with the same :func:`~actors.queues.packing.take` as any batch, under a :class:`Layout` of that
shape, and leaves the others where they were. So no shape starves: a shape's first request
waits at most the queue's timeout, as any first request does.

Buffers: the ring pool's buffers are of one shape, so each shape has a small ring pool of its
own (``look_ahead`` buffers: as many batches as may be sealed and not completed), kept beside
its layout, while the pools made so far fit :data:`POOL_BYTES`; a shape whose pool would not
fit gets a buffer per batch (no pool is freed to make room for another: shapes used in turn
beyond the budget would otherwise rebuild a pool on every batch). A pool goes with its layout,
when the shape is among the least recently used past :data:`_MAX_LAYOUTS`. The runner refuses
a request whose batch would pass the allocation limit before anything is allocated for it.
Fixed-shape models never come here.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Collection
from itertools import islice

from actors.queues.config import QueueConfig
from actors.queues.pool import Layout, RingPool
from actors.queues.request import Request
from model_runtime.executable.model import ExecutableMetadata

__all__ = ["POOL_BYTES", "ShapeGroups", "Split"]

#: Layouts kept for the shapes seen last; one is rebuilt in microseconds when evicted.
_MAX_LAYOUTS = 64
#: Bytes the shapes' ring pools may hold together, per queue (a shape whose pool would pass it
#: gets a buffer per batch). Small beside any allocation limit: it saves the allocation of a
#: buffer per batch for the many short shapes of a text model, not memory.
POOL_BYTES = 8 << 20

ShapeKey = tuple[tuple[int, ...], ...]


class Split:
    """The requests of one shape taken out of the FIFO (``group``, in order; ``key`` None and
    ``group`` empty when no shape qualified), the gone callers' requests found on the way
    (``gone``, for the queue to drop), and :meth:`merge` to put back what a batch leaves."""

    __slots__ = ("gone", "group", "key", "live")

    def __init__(
        self, live: list[Request], gone: list[Request], key: ShapeKey | None = None
    ) -> None:
        #: the FIFO without the gone, in order (what :meth:`merge` cuts from)
        self.live = live
        self.gone = gone
        self.key = key
        self.group: deque[Request] = (
            deque() if key is None else deque([r for r in live if r._shape == key])
        )

    def merge(self) -> deque[Request]:
        """The FIFO again, without the gone: the group's leftovers (the rest of a request
        split over batches, the requests a batch had no room for) back among the others, in
        their first order.

        A batch takes from the front of its group only, so what the group has left is a
        suffix of it: the others before its first leftover, then everything from there on."""
        live, key = self.live, self.key
        if key is None:
            return deque(live)
        if not self.group:
            return deque([r for r in live if r._shape != key])
        cut = live.index(self.group[0])
        fifo = deque([r for r in islice(live, cut) if r._shape != key])
        fifo.extend(islice(live, cut, None))
        return fifo


class ShapeGroups:
    """The shapes of a dynamic model's waiting requests, and a :class:`Layout` and a ring
    pool per shape."""

    __slots__ = ("_axes", "_capacity", "_config", "_held", "_layouts", "_metadata", "full", "rows")

    def __init__(self, metadata: ExecutableMetadata, config: QueueConfig, base: Layout) -> None:
        self._metadata = metadata
        self._config = config
        self._axes = tuple((s.name, s.axis) for s in base.inputs)
        self._capacity = base.capacity
        #: per shape seen lately: its layout, its ring pool (None: a buffer per batch) and
        #: the pool's bytes
        self._layouts: OrderedDict[ShapeKey, tuple[Layout, RingPool | None, int]] = OrderedDict()
        self._held = 0  # bytes of the pools in _layouts
        #: Unpacked rows per shape, at least (shapes with none left out): exact after a
        #: :meth:`split` for a full batch, raised by :meth:`add` as requests come, lowered by
        #: :meth:`taken` and :meth:`dropped` (rows that go otherwise are noticed at the next
        #: exact count).
        self.rows: dict[ShapeKey, int] = {}
        #: Shapes counted a batch's rows or more in ``rows``: 0 means no shape fills a batch,
        #: never missing one that does, and the common miss (many shapes, none full) costs no
        #: scan of the FIFO, nor of ``rows``.
        self.full = 0

    def add(self, req: Request) -> None:
        """Count a request queued now (its shape is computed here, once)."""
        key = req._shape
        if key is None:
            key = self.key(req)
        rows = self.rows
        before = rows.get(key, 0)
        after = rows[key] = before + req.samples - req._taken
        if after >= self._capacity > before:
            self.full += 1

    def taken(self, key: ShapeKey, rows: int) -> None:
        """``rows`` rows of shape ``key`` went into a batch."""
        counts = self.rows
        before = counts.get(key, 0)
        left = before - rows
        if before >= self._capacity > left:
            self.full -= 1
        if left > 0:
            counts[key] = left
        else:
            counts.pop(key, None)

    def dropped(self, req: Request) -> None:
        """``req``'s caller has gone: its unpacked rows are no longer waiting."""
        key = req._shape
        if key is not None:
            self.taken(key, req.samples - req._taken)

    def key(self, req: Request) -> ShapeKey:
        """The shape of ``req``'s rows, per input (without the row axis)."""
        key = req._shape
        if key is None:
            inputs = req.inputs
            axes = self._axes
            if len(axes) == 1 and axes[0][1] == 0:  # the common case: one input, rows first
                key = (inputs[axes[0][0]].shape[1:],)
            else:
                key = tuple([_rows_shape(inputs[name].shape, axis) for name, axis in axes])
            req._shape = key
        return key

    def layout(self, key: ShapeKey) -> tuple[Layout, RingPool]:
        """The layout of batches of shape ``key``, and the ring pool their buffers come from:
        the shape's own, or a pool of one buffer made now (the pools kept would pass
        :data:`POOL_BYTES`, or every buffer of the shape's is in use)."""
        layouts = self._layouts
        got = layouts.get(key)
        if got is None:
            got = layouts[key] = self._make(key)
            while len(layouts) > _MAX_LAYOUTS:
                self._forget()
        else:
            layouts.move_to_end(key)
        layout, pool, _ = got
        if pool is None or not pool.free:
            return layout, RingPool(layout, 1)
        return layout, pool

    def _make(self, key: ShapeKey) -> tuple[Layout, RingPool | None, int]:
        layout = Layout(self._metadata, self._config, key)
        size = self._config.look_ahead
        need = size * layout.I * sum(math.prod(s.shape) * s.dtype.itemsize for s in layout.inputs)
        if self._held + need > POOL_BYTES:  # no room: a buffer per batch (see the docstring)
            return layout, None, 0
        self._held += need
        return layout, RingPool(layout, size), need

    def _forget(self) -> None:
        """Forget the shape used longest ago (a batch still holding one of its buffers keeps
        that buffer until it ends)."""
        self._held -= self._layouts.popitem(last=False)[1][2]

    def split(self, pending: Collection[Request], capacity: int, partial: bool) -> Split:
        """Take the requests of one shape out of ``pending``: the oldest shape, or, unless
        ``partial``, the oldest that fills a batch of ``capacity`` rows (counted exactly
        here, gone callers' rows left out)."""
        live = [r for r in pending if not r.future.done()]
        gone = [r for r in pending if r.future.done()] if len(live) < len(pending) else []
        for req in gone:
            self.dropped(req)
        # Every queued request's shape was computed by add().
        if partial:
            return Split(live, gone, live[0]._shape if live else None)
        rows: dict[ShapeKey | None, int] = {}
        get = rows.get
        for req in live:
            key = req._shape
            rows[key] = get(key, 0) + req.samples - req._taken
        self.rows = rows  # type: ignore[assignment]
        self.full = sum(n >= capacity for n in rows.values())
        for shape, n in rows.items():
            if n >= capacity:
                return Split(live, gone, shape)
        return Split(live, gone)


def _rows_shape(shape: tuple[int, ...], axis: int | None) -> tuple[int, ...]:
    if axis is None:
        return shape
    return (*shape[:axis], *shape[axis + 1 :])

"""Batches of one shape: how a Queue packs the requests of a model with dynamic dimensions.

A model whose inputs have dynamic dimensions besides the batch (a text model's ``seq``) takes
requests of many shapes, and one batch holds rows of one shape only (Triton's rule). The Queue
keeps its one FIFO; when it seals a batch it picks the shape of the oldest waiting request (or,
for a full batch, the oldest shape that fills one), takes that shape's requests in FIFO order
with the same :func:`~actors.queues.packing.take` as any batch, under a :class:`Layout` of that
shape, and leaves the others where they were. So no shape starves: a shape's first request
waits at most the queue's timeout, as any first request does.

Buffers: a batch of a dynamic shape gets its own buffer, sized for its shape (the ring pool's
buffers are of one shape). The runner refuses a request whose batch would pass the allocation
limit before anything is allocated for it. Fixed-shape models never come here.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable

import numpy as np

from actors.queues.config import QueueConfig
from actors.queues.pool import Layout
from actors.queues.request import Request
from model_runtime.executable.model import ExecutableMetadata

__all__ = ["ShapeGroups", "Split"]

#: Layouts kept for the shapes seen last; one is rebuilt in microseconds when evicted.
_MAX_LAYOUTS = 64

ShapeKey = tuple[tuple[int, ...], ...]


class Split:
    """The requests of one shape taken out of the FIFO (``group``, in order; ``key`` None and
    ``group`` empty when no shape qualified), the live others (``rest``), the gone callers'
    requests found on the way (``gone``, for the queue to drop), and :meth:`merge` to put back
    what a batch leaves."""

    __slots__ = ("gone", "group", "key", "order", "rest")

    def __init__(self) -> None:
        self.key: ShapeKey | None = None
        self.group: deque[Request] = deque()
        self.rest: list[Request] = []
        self.gone: list[Request] = []
        self.order: dict[int, int] = {}

    def merge(self) -> deque[Request]:
        """The FIFO again, without the gone: the group's leftovers (the rest of a request
        split over batches, the requests a batch had no room for) back among the others, in
        their first order."""
        if not self.group:
            return deque(self.rest)
        order = self.order
        return deque(sorted((*self.group, *self.rest), key=lambda r: order[id(r)]))


class ShapeGroups:
    """The shapes of a dynamic model's waiting requests, and a :class:`Layout` per shape."""

    __slots__ = ("_axes", "_config", "_layouts", "_metadata", "rows")

    def __init__(self, metadata: ExecutableMetadata, config: QueueConfig, base: Layout) -> None:
        self._metadata = metadata
        self._config = config
        self._axes = tuple((s.name, s.axis) for s in base.inputs)
        self._layouts: OrderedDict[ShapeKey, Layout] = OrderedDict()
        #: Unpacked rows per shape, at least: exact after each :meth:`split`, then raised by
        #: :meth:`add` as requests come (rows that go meanwhile are noticed at the next split).
        #: So :meth:`may_fill` never misses a shape that fills a batch, and the common miss
        #: (many shapes, none full) costs no scan of the FIFO.
        self.rows: dict[ShapeKey, int] = {}

    def add(self, req: Request) -> None:
        """Count a request queued now."""
        key = self.key(req)
        rows = self.rows
        rows[key] = rows.get(key, 0) + req.samples - req._taken

    def may_fill(self, capacity: int) -> bool:
        """Some shape may have ``capacity`` rows waiting (False: none has)."""
        return any(n >= capacity for n in self.rows.values())

    def taken(self, key: ShapeKey, rows: int) -> None:
        """``rows`` rows of shape ``key`` went into a batch."""
        self.rows[key] -= rows

    def key(self, req: Request) -> ShapeKey:
        """The shape of ``req``'s rows, per input (without the row axis)."""
        key = req._shape
        if key is None:
            inputs = req.inputs
            key = req._shape = tuple(
                _rows_shape(np.shape(inputs[name]), axis) for name, axis in self._axes
            )
        return key

    def layout(self, key: ShapeKey) -> Layout:
        """The layout of batches of shape ``key``."""
        layouts = self._layouts
        layout = layouts.get(key)
        if layout is None:
            layout = layouts[key] = Layout(self._metadata, self._config, key)
            if len(layouts) > _MAX_LAYOUTS:
                layouts.popitem(last=False)
        else:
            layouts.move_to_end(key)
        return layout

    def split(self, pending: Iterable[Request], capacity: int, partial: bool) -> Split:
        """Take the requests of one shape out of ``pending``: the oldest shape, or, unless
        ``partial``, the oldest that fills a batch of ``capacity`` rows."""
        out = Split()
        rows: dict[ShapeKey, int] = {}
        live: list[tuple[Request, ShapeKey]] = []
        for req in pending:
            if req.future.done():
                out.gone.append(req)
                continue
            key = self.key(req)
            live.append((req, key))
            rows[key] = rows.get(key, 0) + req.samples - req._taken
        self.rows = rows
        for key, n in rows.items():
            if partial or n >= capacity:
                out.key = key
                break
        order = out.order
        group, rest = out.group, out.rest
        for i, (req, key) in enumerate(live):
            order[id(req)] = i
            (group.append if key == out.key else rest.append)(req)
        return out


def _rows_shape(shape: tuple[int, ...], axis: int | None) -> tuple[int, ...]:
    if axis is None:
        return shape
    return (*shape[:axis], *shape[axis + 1 :])

"""A packed batch: the inputs of one main run (I iterations of B rows) and where its rows go."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import numpy as np

from actors.queues.request import Request

__all__ = ["Batch", "Segment"]

#: ``(request, request_row, iteration, row, count)``: rows ``[request_row, request_row+count)``
#: of ``request`` sit at rows ``[row, row+count)`` of iteration ``iteration``. Segments are in
#: packing order and never cross an iteration boundary; padding rows have no segment.
Segment = tuple[Request, int, int, int, int]


@dataclass(slots=True, eq=False)
class Batch:
    """The inputs of one main run, and how to route its outputs back.

    ``inputs`` has exactly ``device_iterations`` entries; each maps every user input anchor
    name to a C-contiguous array of the anchor's exact shape and dtype. The arrays belong to the
    queue's ring pool (or, for a request that exactly fills whole batches, are views of the
    caller's arrays): the session must not keep them after ``Complete``/``Fail``.
    Rows ``[valid_rows, I*B)`` (flat, iteration-major) are padding when ``padded``.
    ``attempts`` counts dispatches; the session increments it on a retry.
    """

    id: int
    inputs: tuple[dict[str, np.ndarray], ...]
    #: where its rows go (None: a plain batch, derived from ``plain`` when asked)
    _segments: tuple[Segment, ...] | None
    valid_rows: int
    padded: bool
    t_packed: float
    attempts: int = 0
    #: application errors this batch met (a second one, after a reset, means its data)
    app_errors: int = 0
    #: output name -> array receiving the padding rows' outputs (from the flush callback)
    flush_outputs: dict[str, np.ndarray] | None = None
    #: per iteration, caller output buffers (views) the device writes into (zero-copy
    #: batches of a request that gave ``outputs``); None: the device allocates
    outputs_into: tuple[dict[str, np.ndarray], ...] | None = None
    #: the outcome of a run already made (the session ran it in place and it failed): the
    #: session handles it as the outcome of its first run instead of running it again
    ran: asyncio.Future[list[dict[str, np.ndarray]]] | None = field(default=None, repr=False)
    #: index of the ring pool buffer holding ``inputs`` (None: zero-copy views)
    _buffer: int | None = field(default=None, repr=False)
    #: the free list ``_buffer`` goes back to (None: the queue's own ring pool's)
    _free: list[int] | None = field(default=None, repr=False)
    #: completed or failed already (a second Complete/Fail is ignored)
    _released: bool = field(default=False, repr=False)
    #: A plain batch (the common case of many single-sample callers): one iteration whose
    #: row i is the one row of ``plain[i]``; each of these requests has all its rows here, so
    #: this batch is the only one that answers it. The queue packs and answers it without
    #: building segments.
    plain: list[Request] | None = field(default=None, repr=False)

    @property
    def segments(self) -> tuple[Segment, ...]:
        """``(request, request_row, iteration, row, count)`` per run of rows, packing order."""
        segments = self._segments
        if segments is None:
            assert self.plain is not None
            segments = self._segments = tuple(
                (req, 0, 0, row, 1) for row, req in enumerate(self.plain)
            )
        return segments

    @property
    def requests(self) -> list[Request]:
        """The distinct requests with rows in this batch, in packing order."""
        if self.plain is not None:
            return list(self.plain)
        seen: dict[int, Request] = {}
        for seg in self.segments:
            seen.setdefault(id(seg[0]), seg[0])
        return list(seen.values())

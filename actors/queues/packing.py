"""Taking rows off the FIFO of waiting requests into the segments of one batch."""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

import numpy as np

from actors.queues.batch import Segment
from actors.queues.pool import Layout
from actors.queues.request import Request

__all__ = ["Take", "take"]


class Take(NamedTuple):
    """What :func:`take` took: ``rows`` rows in ``segments`` (also grouped per iteration), or
    ``views`` (zero copy) instead of rows to copy, and then ``into``: views of the request's
    output buffers to run into, if it gave usable ones; ``dropped``: gone requests it
    removed."""

    rows: int
    segments: list[Segment]
    per_iteration: list[list[Segment]]
    views: tuple[dict[str, np.ndarray], ...] | None
    dropped: list[Request]
    into: tuple[dict[str, np.ndarray], ...] | None = None
    #: instead of segments: single-row requests, one per row (see ``Batch.plain``)
    plain: list[Request] | None = None


def take(pending: deque[Request], layout: Layout, partial: bool, now: float) -> Take:
    """Take up to I*B live rows from the front of ``pending`` (requests whose future is done
    are removed on the way and returned in ``dropped``).

    Takes nothing (``rows == 0``) when there are no live rows, or fewer than a full batch and
    not ``partial``. A request with at least I*B rows left at the front, C-contiguous with row
    axis 0, gives ``views`` of its arrays instead of segments to copy.
    """
    cap, b, iters = layout.capacity, layout.B, layout.I
    dropped: list[Request] = []
    while pending and pending[0].future.done():
        dropped.append(pending.popleft())
    segments: list[Segment] = []
    per_iteration: list[list[Segment]] = [segments] if iters == 1 else [[] for _ in range(iters)]
    if not pending:
        return Take(0, segments, per_iteration, None, dropped)
    first = pending[0]
    start = first._taken
    if first.samples - start >= cap:
        views = layout.zero_copy(first.inputs, start)
        if views is not None:
            first._taken = start + cap
            if first._taken == first.samples:
                pending.popleft()
            if not start:
                first._t_packed = now
            segments = [(first, start + k * b, k, 0, b) for k in range(iters)]
            into = layout.zero_copy_outputs(first.outputs, start)
            return Take(cap, segments, [[s] for s in segments], views, dropped, into)
    popped: list[Request] = []
    taken = 0
    if iters == 1:  # the common case, one request at a time off the front
        popleft = pending.popleft
        # Single-row requests, as a plain batch (no segment, no per-request state: a waiting
        # single-row request has none of its rows taken, and this batch answers it): the
        # common case, many small callers. Anything else (a request of several rows, a gone
        # caller) goes one request at a time, below.
        n = min(cap, len(pending))
        plain = [popleft() for _ in range(n)]
        if n == cap or (n and partial):
            for req in plain:
                if req.samples != 1 or req.future.done():
                    break
            else:
                return Take(n, segments, per_iteration, None, dropped, plain=plain)
        pending.extendleft(reversed(plain))
        while pending and taken < cap:
            req = popleft()
            if req.future.done():
                dropped.append(req)
                continue
            start = req._taken
            n = req.samples - start
            if n > cap - taken:  # its rest does not fit: it stays at the front
                n = cap - taken
                pending.appendleft(req)
                req._taken = start + n
            else:
                req._taken = req.samples
                popped.append(req)
            if not start:
                req._t_packed = now
            segments.append((req, start, 0, taken, n))
            taken += n
    while pending and taken < cap:  # several iterations: segments never cross one
        req = pending[0]
        if req.future.done():
            dropped.append(pending.popleft())
            continue
        start = req._taken
        n = min(req.samples - start, cap - taken)
        if not start:
            req._t_packed = now
        end = start + n
        while start < end:
            k, row = divmod(taken, b)
            m = min(end - start, b - row)
            seg = (req, start, k, row, m)
            segments.append(seg)
            per_iteration[k].append(seg)
            start += m
            taken += m
        req._taken += n
        if req._taken == req.samples:
            popped.append(pending.popleft())
    if taken == 0 or (taken < cap and not partial):
        for req, start, *_ in reversed(segments):  # put everything back as it was
            req._taken = start
            if not start:
                req._t_packed = 0.0
        pending.extendleft(reversed(popped))
        return Take(0, [], [], None, dropped)
    return Take(taken, segments, per_iteration, None, dropped)

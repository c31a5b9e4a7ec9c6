"""Finding the poisoned requests of a batch: masked copies of its inputs, one part per group.

A run that fails because of its data (DESIGN.md §7) is bisected on the same device without a
reset: the batch's live requests are split in halves, each half runs alone (the other rows are
zeroed, as padding is), and a half that fails again is split further until single requests
remain. :func:`masked_inputs` builds the inputs of one such run from a private copy of the
batch's inputs (the pooled buffers stay untouched); :func:`part` is the batch restricted to a
group, which the Queue routes exactly as a completed batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from actors.queues.batch import Batch
from actors.queues.pool import Layout, rows_view
from actors.queues.request import Request

__all__ = ["copy_inputs", "halves", "masked_inputs", "part"]

Inputs = tuple[dict[str, np.ndarray], ...]


def copy_inputs(batch: Batch) -> Inputs:
    """A private copy of the batch's inputs (the originals are pooled or the callers')."""
    return tuple({name: np.array(a, copy=True) for name, a in it.items()} for it in batch.inputs)


def masked_inputs(base: Inputs, batch: Batch, keep: Sequence[Request], layout: Layout) -> Inputs:
    """``base`` with the rows of every request not in ``keep`` set to zero."""
    kept = {id(r) for r in keep}
    out = tuple({name: a.copy() for name, a in it.items()} for it in base)
    for req, _, k, row, count in batch.segments:
        if id(req) in kept:
            continue
        for spec in layout.inputs:
            if spec.axis is not None:
                rows_view(out[k][spec.name], spec.axis)[row : row + count] = 0
    return out


def part(batch: Batch, group: Sequence[Request]) -> Batch:
    """``batch`` with only the segments of ``group``'s requests (no buffer of its own)."""
    kept = {id(r) for r in group}
    segments = tuple(s for s in batch.segments if id(s[0]) in kept)
    return Batch(
        batch.id,
        (),
        segments,
        sum(s[4] for s in segments),
        batch.padded,
        batch.t_packed,
        attempts=batch.attempts,
    )


def halves(group: Sequence[Request]) -> tuple[list[Request], list[Request]]:
    """Split ``group`` (at least two requests) into two non-empty halves, in order."""
    mid = len(group) // 2
    return list(group[:mid]), list(group[mid:])

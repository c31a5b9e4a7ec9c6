"""The tensors of many requests (or responses) of one frame, stacked into one tensor each.

When every request of a batch has the same inputs (names, data types and shapes), the sender
stacks each input along a new first axis and sends one descriptor per input for the whole batch
(``S``) instead of one per request: one placement in the ring, one copy out, a shorter header.
The receiver hands each request its row (a view of the stacked array). Responses of one frame
are stacked the same way when their outputs agree; a response takes its row ``s``. Anything
that does not agree (BYTES tensors, a shape or an output set of its own) travels per request.

This module imports only numpy and its siblings, because the instance process runs it too.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from model_runtime.python_backend.wire import WireError

__all__ = ["check_rows", "row_of", "stackable", "stacked"]

#: dtype kinds that stack: numbers and booleans (BYTES travel per request, serialized)
_KINDS = frozenset("biufc")


def stackable(tensors: Sequence[Sequence[tuple[str, np.ndarray]]]) -> bool:
    """Whether the named arrays of each of ``tensors`` (two or more) have the same names in
    the same order, data types and shapes, all numeric."""
    if len(tensors) < 2:
        return False
    first = tensors[0]
    if not first:
        return False
    for _, a in first:
        if a.dtype.kind not in _KINDS:
            return False
    for other in tensors[1:]:
        if len(other) != len(first):
            return False
        for (name, a), (oname, o) in zip(first, other, strict=True):
            if oname != name or o.dtype != a.dtype or o.shape != a.shape:
                return False
    return True


def stacked(tensors: Sequence[Sequence[tuple[str, np.ndarray]]]) -> list[tuple[str, np.ndarray]]:
    """Each position's arrays stacked along a new first axis (``tensors`` are
    :func:`stackable`)."""
    out = []
    for i, (name, first) in enumerate(tensors[0]):
        together = np.empty((len(tensors), *first.shape), first.dtype)
        for row, named in enumerate(tensors):
            together[row] = named[i][1]  # cheaper than np.stack for a few small arrays
        out.append((name, together))
    return out


def check_rows(arrays: Sequence[tuple[str, np.ndarray]], count: int) -> None:
    """Check that stacked ``arrays`` hold ``count`` rows each.

    Raises:
        WireError: an array that is not stacked, or of another row count.
    """
    for name, array in arrays:
        if array.ndim == 0 or array.shape[0] != count:
            raise WireError(
                f"stacked tensor {name!r} of shape {list(array.shape)} does not hold {count} rows"
            )


def row_of(array: np.ndarray, row: int) -> np.ndarray:
    """Row ``row`` of a stacked array, as an array (a view)."""
    return array[row, ...]

"""The classification extension, and BYTES tensors in responses.

An output requested with ``"parameters": {"classification": k}`` is not returned as the model
computed it but as its top-k classes: a BYTES tensor of shape ``[batch, k]`` (``[k]`` for an
output without a batch axis) whose elements read ``"<value>:<index>"``, or
``"<value>:<index>:<label>"`` when the model has labels; ``index`` counts over the output's
elements past the batch axis, flattened; the highest value comes first, and among equal values
the lower index. ``k`` past the number of classes returns them all. As Triton: values are
written as C++'s ``std::to_string`` writes them (``1.000000``, ``7``); integer and FP32/FP64
outputs only (others are refused in Triton's words), at most a million elements a row.

BYTES elements travel as JSON strings, or in binary data each as a 4-byte little-endian length
followed by its bytes (the binary tensor data extension).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from model_runtime.errors import ProtocolError
from model_runtime.server.tensors.datatypes import datatype_of

__all__ = ["MAX_CLASSIFICATION_ELEMENTS", "bytes_to_binary", "classify"]

#: Triton's bound on the elements of a classified output (per batch row).
MAX_CLASSIFICATION_ELEMENTS = 1_000_000

#: numpy kinds and sizes Triton classifies: its integer types, FP32 and FP64.
_CLASSIFIED = {("i", 1), ("i", 2), ("i", 4), ("i", 8), ("u", 1), ("u", 2), ("u", 4), ("u", 8),
               ("f", 4), ("f", 8)}  # fmt: skip


def _format(value: np.generic) -> str:
    if isinstance(value, np.floating):
        return f"{float(value):f}"  # std::to_string of a float or double (C's %f)
    return str(value.item())


def classify(
    arr: np.ndarray, count: int, *, batched: bool, labels: Sequence[str] | None = None
) -> np.ndarray:
    """The top ``count`` classes of ``arr`` as an array of ``bytes`` (dtype object); an empty
    output gives an empty result.

    Raises:
        ProtocolError: ``arr`` is not of a type Triton classifies (BYTES, BOOL, FP16...), or a
            row has more than :data:`MAX_CLASSIFICATION_ELEMENTS`; in Triton's words.
    """
    if (arr.dtype.kind, arr.dtype.itemsize) not in _CLASSIFIED:
        try:
            name = datatype_of(arr.dtype)
        except ValueError:
            name = str(arr.dtype)
        raise ProtocolError(
            f"class result not available for output due to unsupported type '{name}'"
        )
    rows = arr.reshape(arr.shape[0] if batched and arr.ndim else 1, -1)
    if rows.shape[1] > MAX_CLASSIFICATION_ELEMENTS:
        raise ProtocolError("classification output tensor too large")
    k = min(count, rows.shape[1])
    # argsort of the negated values is stable: equal values keep their index order.
    keys = -rows.astype(np.float64) if rows.dtype.kind in "bu" else -rows
    order = np.argsort(keys, axis=1, kind="stable")[:, :k]
    out = np.empty((rows.shape[0], k), dtype=object)
    for r in range(rows.shape[0]):
        row = rows[r]
        for j, index in enumerate(order[r]):
            text = f"{_format(row[index])}:{int(index)}"
            if labels is not None and index < len(labels):
                text += f":{labels[index]}"
            out[r, j] = text.encode()
    return out if batched and arr.ndim else out.reshape(k)


def bytes_to_binary(values: np.ndarray) -> bytes:
    """BYTES elements in row-major order, each as a 4-byte little-endian length and its bytes."""
    parts: list[bytes] = []
    for v in values.ravel():
        parts += [len(v).to_bytes(4, "little"), v]
    return b"".join(parts)

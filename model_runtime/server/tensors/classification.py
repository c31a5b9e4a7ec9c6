"""The classification extension, and BYTES tensors in responses.

An output requested with ``"parameters": {"classification": k}`` is not returned as the model
computed it but as its top-k classes: a BYTES tensor of shape ``[batch, k]`` (``[k]`` for an
output without a batch axis) whose elements read ``"<value>:<index>"``, or
``"<value>:<index>:<label>"`` when the model has labels; ``index`` counts over the output's
elements past the batch axis, flattened; the highest value comes first, and among equal values
the lower index. ``k`` past the number of classes returns them all (Triton does the same).

BYTES elements travel as JSON strings, or in binary data each as a 4-byte little-endian length
followed by its bytes (the binary tensor data extension).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["bytes_to_binary", "classify"]


def _format(value: np.generic) -> str:
    if isinstance(value, np.floating):
        return str(value)  # the shortest text that reads back as the same value of its type
    if isinstance(value, np.bool_):
        return str(int(value))
    return str(value.item())


def classify(
    arr: np.ndarray, count: int, *, batched: bool, labels: Sequence[str] | None = None
) -> np.ndarray:
    """The top ``count`` classes of ``arr`` as an array of ``bytes`` (dtype object).

    Raises:
        nothing: an empty output gives an empty result.
    """
    rows = arr.reshape(arr.shape[0] if batched and arr.ndim else 1, -1)
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

"""What the instance process does to exec batches before ``execute`` sees them: merge those
that wait for a busy instance into one call (Triton's dynamic batcher), and take out requests
cancelled before their turn (Triton's scheduler drops them; the model never sees them).

This module imports nothing of the daemon, because the instance process runs it.
"""

from __future__ import annotations

import collections
from typing import Any

__all__ = ["merge", "mergeable_rows", "take_cancelled"]


def mergeable_rows(batch: dict[str, Any]) -> int | None:
    """The rows of an exec batch (each request's batch dimension), or None if it may not be
    merged with others (sent alone, or a request of a sequence)."""
    if batch.get("a"):
        return None
    rows = 0
    for item in batch["r"]:
        if "c" in item:
            return None
        tensors = item["T"]
        shape = tensors[0].shape() if tensors else None
        rows += shape[0] if shape else 1
    return rows


def merge(header: dict[str, Any], deferred: collections.deque[dict[str, Any]], limit: int) -> None:
    """Join the exec batches queued at the head of ``deferred`` to exec ``header`` while their
    rows fit ``limit`` (the model's ``max_batch_size``); ``bs`` lists the batches merged.
    Batches sent ``alone``, and requests of sequences, are not merged."""
    rows = mergeable_rows(header)
    if rows is None:
        return
    while deferred and deferred[0]["t"] == "exec":
        more = mergeable_rows(deferred[0])
        if more is None or rows + more > limit:
            break
        batch = deferred.popleft()
        header["r"].extend(batch["r"])
        header.setdefault("bs", [header["b"]]).append(batch["b"])
        rows += more


def take_cancelled(header: dict[str, Any], cancelled: set[int]) -> list[int]:
    """Take the requests in ``cancelled`` out of exec ``header``; their keys."""
    items = header["r"]
    kept = [item for item in items if item["k"] not in cancelled]
    if len(kept) == len(items):
        return []
    header["r"] = kept
    return [item["k"] for item in items if item["k"] in cancelled]

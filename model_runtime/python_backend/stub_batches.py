"""What the instance process does to exec batches before ``execute`` sees them: merge those
that wait for a busy instance into one call (Triton's dynamic batcher), and take out requests
cancelled before their turn (Triton's scheduler drops them; the model never sees them).

This module imports nothing of the daemon, because the instance process runs it.
"""

from __future__ import annotations

import collections
from typing import Any

__all__ = ["merge", "mergeable_rows", "take_cancelled"]


def _rows(item: dict[str, Any]) -> int:
    tensors = item["T"]
    shape = tensors[0].shape() if tensors else None
    return shape[0] if shape else 1


def mergeable_rows(batch: dict[str, Any]) -> int | None:
    """The rows of an exec batch (each request's batch dimension), or None if it may not be
    merged with others (sent alone, or a request of a sequence)."""
    if batch.get("a"):
        return None
    rows = 0
    for item in batch["r"]:
        if "c" in item:
            return None
        rows += _rows(item)
    return rows


def merge(header: dict[str, Any], deferred: collections.deque[dict[str, Any]], limit: int) -> None:
    """Join the requests of the exec batches queued at the head of ``deferred`` to exec
    ``header`` while their rows fit ``limit`` (the model's ``max_batch_size``), as Triton's
    dynamic batcher fills a batch request by request: ``bs`` lists the batches taken whole; a
    batch that fits only in part gives its leading requests and stays queued with the rest
    (its end is told once they ran). Batches sent ``alone``, and requests of sequences, are
    not merged."""
    if not deferred or deferred[0]["t"] != "exec":
        return  # nothing waits to join it
    rows = mergeable_rows(header)
    if rows is None:
        return
    while rows < limit and deferred and deferred[0]["t"] == "exec":
        more = mergeable_rows(deferred[0])
        if more is None:
            break
        if rows + more <= limit:
            batch = deferred.popleft()
            header["r"].extend(batch["r"])
            header.setdefault("bs", [header["b"]]).append(batch["b"])
            rows += more
            continue
        items = deferred[0]["r"]
        taken = 0
        while taken < len(items) and rows + _rows(items[taken]) <= limit:
            rows += _rows(items[taken])
            taken += 1
        header["r"].extend(items[:taken])
        del items[:taken]
        break


def take_cancelled(header: dict[str, Any], cancelled: set[int]) -> list[int]:
    """Take the requests in ``cancelled`` out of exec ``header``; their keys."""
    items = header["r"]
    kept = [item for item in items if item["k"] not in cancelled]
    if len(kept) == len(items):
        return []
    header["r"] = kept
    return [item["k"] for item in items if item["k"] in cancelled]

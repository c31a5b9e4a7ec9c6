"""What an infer request is, counted, for every front end: its samples as Triton counts them
(``inference_count``), its ``Inference-Header-Content-Length``, and whether it is decoded or
its answer encoded off the event loop (past :data:`THREAD_PARSE_BYTES`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from model_runtime.server.answers import HTTPError
from model_runtime.server.inference.cache import CachedOutputs
from model_runtime.server.repository.entries import ModelEntry
from model_runtime.server.tensors.binary import HEADER_LENGTH

__all__ = ["THREAD_PARSE_BYTES", "encodes_in_thread", "json_length_of", "samples_of"]

#: A body larger than this is decoded off the event loop (below, the hop costs more).
THREAD_PARSE_BYTES = 1 << 20


def json_length_of(header: str | None) -> int | None:
    """The ``Inference-Header-Content-Length`` header's value (None: not given).

    Raises:
        HTTPError: 400, not an integer.
    """
    try:
        return None if header is None else int(header)
    except ValueError:
        raise HTTPError(400, f"{HEADER_LENGTH} must be an integer", "bad_request") from None


def encodes_in_thread(results: Mapping[str, Any]) -> bool:
    """Whether outputs this large are encoded off the event loop."""
    size = 0
    for a in results.values():
        size += a.nbytes
    return size > THREAD_PARSE_BYTES // 4


#: Whether a model's inputs have a batch axis, by ``id`` of its inputs (the object kept
#: with it, so an id is not reused while its entry is here).
_BATCHED: dict[int, tuple[object, bool]] = {}


def samples_of(entry: ModelEntry, inputs: Mapping[str, Any], outputs: Any = None) -> int:
    """The inferences a request of ``inputs`` is, as Triton counts them (``inference_count``):
    its batch for a model with a batch axis, else 1; 0 when its ``outputs`` came from the
    response cache (the model did not run)."""
    if isinstance(outputs, CachedOutputs):
        return 0
    specs = entry.inputs
    known = _BATCHED.get(id(specs))
    if known is None or known[0] is not specs:
        if len(_BATCHED) >= 1024:
            _BATCHED.clear()
        known = _BATCHED[id(specs)] = (specs, any(spec.has_batch_axis for spec in specs))
    if not known[1]:
        return 1
    first = next(iter(inputs.values()), None)
    return int(first.shape[0]) if first is not None and first.ndim else 1

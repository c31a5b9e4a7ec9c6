"""What an infer request is, counted, for every front end: its samples as Triton counts them
(``inference_count``), its ``Inference-Header-Content-Length``, whether it is decoded or its
answer encoded off the event loop (past :data:`THREAD_PARSE_BYTES`), and the requests that
succeeded in one turn of the event loop, recorded once (:class:`TurnRecords`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from model_runtime.server.answers import HTTPError
from model_runtime.server.inference.cache import CachedOutputs
from model_runtime.server.observability.metrics import DaemonMetrics
from model_runtime.server.repository.entries import ModelEntry
from model_runtime.server.tensors.binary import HEADER_LENGTH

__all__ = [
    "THREAD_PARSE_BYTES",
    "TurnRecords",
    "encodes_in_thread",
    "json_length_of",
    "samples_of",
]

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
    if outputs is not None and isinstance(outputs, CachedOutputs):
        return 0
    specs = entry.inputs
    known = _BATCHED.get(id(specs))
    if known is None or known[0] is not specs:
        if len(_BATCHED) >= 1024:
            _BATCHED.clear()
        known = _BATCHED[id(specs)] = (specs, any(spec.has_batch_axis for spec in specs))
    if not known[1]:
        return 1
    for first in inputs.values():  # (the first input's: no iterator object, no int())
        shape = first.shape
        return shape[0] if shape else 1  # type: ignore[no-any-return]
    return 1


class TurnRecords:
    """Requests that succeeded in this turn of the event loop, recorded in the statistics and
    metrics once per model, by one call the loop runs next (before any request it reads
    later: those see them), then no longer in flight (``leave(model, version, count)``)."""

    __slots__ = ("_done", "_leave", "_loop", "_metrics")

    def __init__(self, metrics: DaemonMetrics, leave: Callable[[str, str, int], None]) -> None:
        self._metrics = metrics
        self._leave = leave
        self._done: list[tuple[ModelEntry, float, int]] = []
        #: the event loop the requests end on (asked once: each asking is a getpid syscall)
        self._loop: asyncio.AbstractEventLoop | None = None

    def add(self, entry: ModelEntry, seconds: float, samples: int) -> None:
        """A request of ``entry`` that took ``seconds`` for ``samples`` succeeded."""
        done = self._done
        if not done:
            loop = self._loop
            if loop is None or loop.is_closed():
                loop = self._loop = asyncio.get_running_loop()
            loop.call_soon(self.record)
        done.append((entry, seconds, samples))

    def record(self) -> None:
        """Record what was added since the last call."""
        done, self._done = self._done, []
        i, n = 0, len(done)
        try:
            while i < n:
                entry = done[i][0]
                ns = samples = 0
                seconds: list[float] = []
                while i < n and done[i][0] is entry:
                    _, s, k = done[i]
                    ns += int(s * 1e9)
                    samples += k
                    seconds.append(s)
                    i += 1
                try:
                    entry.stats.record_ok(len(seconds), ns, samples)
                    self._metrics.observe_ok(entry.name, entry.version, seconds, samples)
                finally:  # whatever the metrics did: none stays in flight
                    self._leave(entry.name, entry.version, len(seconds))
        finally:  # nor those a failed record left unread
            for entry, _, _ in done[i:]:
                self._leave(entry.name, entry.version, 1)

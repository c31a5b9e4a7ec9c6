"""The requests an instance process holds, and how its answers reach their callers.

A request for a model that is not decoupled has a future: its final response (the last one
that carried outputs or an error, if the model sent a flag-only final after it) resolves it. A
decoupled request has a queue its stream reads. At the end of a batch (``done``), a request of
the batch with a future that got nothing is answered with an error: the model broke Triton's
contract. When the process dies, everything held fails with the error that says how.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from model_runtime.errors import PythonModelError
from model_runtime.python_backend.messages import PyResponse
from model_runtime.python_backend.wire import WireError

__all__ = ["Call", "Held", "Sink"]

_FINAL = 1


#: Takes a call's answer without a future: (the call's ``owner``, its final response or the
#: error that ended it), called once.
Sink = Callable[[Any, "PyResponse | BaseException"], None]


class Call:
    """One request held by the instance: a future (one response), a queue (a stream), or a
    ``sink`` called with its ``owner`` and its answer (one response, without a future: the
    batcher's requests). ``then``, when set, is called with the future as soon as it is
    resolved (in the same turn of the event loop, where a done callback would wait for the
    next); a sink is called likewise."""

    __slots__ = ("batch", "future", "key", "last", "owner", "queue", "responses", "sink", "then")

    def __init__(
        self,
        key: int,
        batch: int,
        stream: bool,
        loop: asyncio.AbstractEventLoop | None = None,
        sink: tuple[Sink, Any] | None = None,
    ) -> None:
        self.key = key
        self.batch = batch
        self.future: asyncio.Future[PyResponse] | None = None
        self.queue: asyncio.Queue[PyResponse | BaseException] | None = None
        self.sink: Sink | None = None
        self.owner: Any = None
        if stream:
            self.queue = asyncio.Queue()
        elif sink is not None:
            self.sink, self.owner = sink
        else:
            self.future = (loop or asyncio.get_running_loop()).create_future()
        self.responses = 0
        self.last: PyResponse | None = None
        self.then: Callable[[asyncio.Future[PyResponse]], None] | None = None


def _error(pair: Any) -> PythonModelError:
    if isinstance(pair, list) and len(pair) == 2:
        return PythonModelError(str(pair[1]), str(pair[0]))
    return PythonModelError(str(pair))


def _stacked(
    descs: Any, payload: memoryview, decode: Callable[[Any, memoryview], dict[str, np.ndarray]]
) -> dict[str, np.ndarray] | WireError:
    """A frame's stacked tensors (each with the same rows), or why they are broken."""
    try:
        arrays = decode(descs, payload)
        counts = {a.shape[0] if a.ndim else -1 for a in arrays.values()}
        if len(counts) > 1 or -1 in counts:
            raise WireError("the stacked tensors do not have one row count")
    except WireError as exc:
        return exc
    return arrays


def _rows(together: dict[str, np.ndarray] | WireError | None) -> tuple[list[Any], int]:
    """The stacked tensors as (name, array) pairs and their row count.

    Raises: WireError: no stacked tensors (or broken ones)."""
    if together is None or isinstance(together, WireError):
        raise together or WireError("a row of stacked tensors the frame does not have")
    pairs = list(together.items())
    return pairs, pairs[0][1].shape[0] if pairs else 0


def _row(pairs: list[Any], count: int, row: Any) -> dict[str, np.ndarray]:
    """Raises: WireError: no such row."""
    if type(row) is not int or not 0 <= row < count:
        raise WireError(f"row {row!r} of stacked tensors of {count} rows")
    return {name: array[row, ...] for name, array in pairs}


class Held:
    """The calls of one instance, by key, and its batches in flight."""

    def __init__(self) -> None:
        self._calls: dict[int, Call] = {}
        self._batches: dict[int, list[Call]] = {}
        #: called when a batch's execute returned (or the process died): room for the next
        self.on_batch_done: Callable[[], None] = lambda: None

    def __len__(self) -> int:
        return len(self._calls)

    @property
    def executing(self) -> int:
        """Batches whose ``execute`` has not returned yet."""
        return len(self._batches)

    def __contains__(self, key: int) -> bool:
        return key in self._calls

    def add(self, batch: int, calls: Sequence[Call]) -> None:
        for call in calls:
            self._calls[call.key] = call
        self._batches[batch] = list(calls)

    def responses(
        self,
        header: dict[str, Any],
        payload: memoryview,
        decode: Callable[[Any, memoryview], dict[str, np.ndarray]],
    ) -> None:
        """Deliver a ``resp`` frame's items (tensors copied out by ``decode``; an item with a
        row ``s`` has that row of the frame's stacked tensors ``S``), then end the batches it
        names ``done`` (one id, or a list of them)."""
        together: dict[str, np.ndarray] | WireError | None = None
        if "S" in header:
            together = _stacked(header["S"], payload, decode)
        pairs: list[Any] | None = None
        count = 0
        calls = self._calls
        for item in header["items"]:
            call = calls.get(item["k"])
            if call is None:
                continue  # answered already (a late response from a model thread)
            final = bool(item.get("fl", 0) & _FINAL)
            try:
                if "s" in item:
                    if pairs is None:
                        pairs, count = _rows(together)
                    outputs = _row(pairs, count, item["s"])
                else:
                    outputs = decode(item.get("T", []), payload)
                error = _error(item["e"]) if item.get("e") else None
            except WireError as exc:
                outputs, error = {}, PythonModelError(f"the model's response is broken: {exc}")
            params = json.loads(item["p"]) if item.get("p") else {}
            self._deliver(call, PyResponse(outputs, error, params, final))
        done = header.get("done")
        if done is not None:
            for batch in done if isinstance(done, list) else (done,):
                for call in self._batches.pop(batch, ()):
                    if call.queue is None and call.key in self._calls:
                        problem = "the model's execute returned without a response for this request"
                        self._deliver(call, PyResponse({}, PythonModelError(problem), {}, True))
            self.on_batch_done()

    def _deliver(self, call: Call, response: PyResponse) -> None:
        call.responses += 1
        if response.final:
            self._calls.pop(call.key, None)
        if call.queue is not None:
            call.queue.put_nowait(response)
            return
        if response.outputs or response.error is not None:
            call.last = response
        sink = call.sink
        if sink is not None:
            if response.final:
                call.sink = None
                last = call.last or response
                if not last.final:
                    last = PyResponse(last.outputs, last.error, last.parameters)
                sink(call.owner, last)
            return
        assert call.future is not None
        if response.final and not call.future.done():
            last = call.last or response
            call.future.set_result(
                last if last.final else PyResponse(last.outputs, last.error, last.parameters)
            )
            if call.then is not None:
                call.then(call.future)

    def fail_all(self, exc: BaseException) -> None:
        """Fail every call held (the process died)."""
        for call in self._calls.values():
            if call.queue is not None:
                call.queue.put_nowait(exc)
            elif call.sink is not None:  # after the death is known (restart counted)
                asyncio.get_running_loop().call_soon(call.sink, call.owner, exc)
                call.sink = None
            elif call.future is not None and not call.future.done():
                call.future.set_exception(exc)
                call.future.exception()  # retrieved: a cancelled caller no longer awaits it
                if call.then is not None:  # after the death is known (restart counted)
                    asyncio.get_running_loop().call_soon(call.then, call.future)
        self._calls.clear()
        self._batches.clear()
        self.on_batch_done()

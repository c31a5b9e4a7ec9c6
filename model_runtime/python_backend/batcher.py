"""The batcher of a python model: one queue, batches to the least loaded instance, and the
retries that heal a crash.

Requests leave the queue in batches of up to ``max_batch_size`` (one with ``max_batch_size: 0``)
for the instance that holds the fewest requests among those with room (a sync ``execute`` runs
one batch at a time per instance, and a busy one holds up to :data:`PIPELINE` full batches
queued behind it, or :data:`PIPELINE_SINGLE` for a model without batching; an async one runs
up to :data:`ASYNC_BATCHES`); with dynamic
batching the first request of a batch waits up to ``max_queue_delay_microseconds`` for company.
A sync instance of a model that batches (``max_batch_size`` > 0, not decoupled) also takes
partial batches while busy, up to :data:`PIPELINE` x ``max_batch_size`` requests: the instance
merges the batches waiting for it into one ``execute`` of up to ``max_batch_size`` requests
(:mod:`.stub`), so it never idles waiting for the daemon to send the next batch. Requests
that arrive during one turn of the event loop leave together, in one batch, at its end.
The requests an instance held when it died go back to the head of the queue, each alone in its
batch from then on, so that a second death names the one that caused it: that request is poison
and gets :class:`PoisonRequestError`; the others are answered.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from typing import Any

import structlog

from actors.clock import Clock
from actors.queues.tracing import CURRENT as CURRENT_TRACE, STATE as TRACING
from model_runtime.errors import (
    InputValidationError,
    InstanceCrashedError,
    ModelRuntimeError,
    PoisonRequestError,
)
from model_runtime.python_backend.config import PythonModelConfig
from model_runtime.python_backend.held import Call
from model_runtime.python_backend.instance import InstanceProcess
from model_runtime.python_backend.messages import PyRequest, PyResponse
from model_runtime.python_backend.pool import InstancePool
from model_runtime.python_backend.validate import check_outputs, output_dtypes

__all__ = ["ASYNC_BATCHES", "PIPELINE", "PIPELINE_SINGLE", "Batcher", "Item", "pipeline"]

_log = structlog.get_logger(__name__)
#: batches an instance with ``async def execute`` runs at once
ASYNC_BATCHES = 64
#: full batches a busy instance with a sync ``execute`` may hold queued: they cross in one
#: frame, run back to back, and their answers come back together
PIPELINE = 4
#: ... and for a model without batching (``max_batch_size: 0``, one request a batch): what 64
#: closed-loop clients hold in flight, so a busy instance never idles waiting for the next frame
PIPELINE_SINGLE = 64


def pipeline(max_batch_size: int) -> int:
    """Full batches a busy sync instance may hold queued (:data:`PIPELINE`,
    :data:`PIPELINE_SINGLE`)."""
    return PIPELINE if max_batch_size else PIPELINE_SINGLE


class Item:
    """A request in the runner: queued, held by an instance, or answered."""

    __slots__ = (
        "answered", "call", "dispatched", "enqueued", "future", "instance", "kills", "request",
        "responses", "sent", "slot", "then", "trace", "unwrap",
    )  # fmt: skip

    def __init__(
        self, request: PyRequest, stream: bool, now: float, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.request = request
        #: the answer (None for a stream): its PyResponse, or (``unwrap``) its outputs
        self.future: asyncio.Future[Any] | None = None if stream else loop.create_future()
        self.unwrap = False
        #: called with ``future`` as it is settled, before its done callbacks run (a turn of
        #: the event loop later): what follows the request at once (see :meth:`Batcher.settle`)
        self.then: Callable[[asyncio.Future[Any]], None] | None = None
        #: a stream's: resolved with its call once sent (None for a request of one answer)
        self.dispatched: asyncio.Future[Call] | None = loop.create_future() if stream else None
        self.call: Call | None = None
        self.instance: InstanceProcess | None = None
        self.slot = 0
        self.kills = 0
        self.responses = 0
        self.enqueued = now
        self.sent = now
        self.answered = False
        #: a traced request's receiver of its compute times (actors.queues.tracing)
        self.trace = CURRENT_TRACE.get() if TRACING.on else None


class Batcher:
    """The queue of one model and the task that empties it into its instances."""

    def __init__(self, config: PythonModelConfig, clock: Clock) -> None:
        self.config = config
        self._clock = clock
        self._queue: collections.deque[Item] = collections.deque()
        self._wake = asyncio.Event()
        self.pool: InstancePool | None = None
        #: requests taken and not yet answered
        self.inflight = 0
        self.idle = asyncio.Event()
        #: per instance slot: answered, and the sums of seconds in total, queued, computing
        self.counts = [[0, 0.0, 0.0, 0.0] for _ in range(config.instance_count)]
        self._delay = config.max_queue_delay_s if config.max_batch_size else 0.0
        self._pipeline = pipeline(config.max_batch_size)
        #: requests a busy sync instance of a batching model may hold (its merged batches)
        self._eager = PIPELINE * config.max_batch_size if not config.decoupled else 0
        self._scheduled = False
        #: the event loop the requests come on (each asks it for its future)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._dtypes = output_dtypes(config)
        #: what the instances call with each answer (one bound method, not one a request)
        self._sink: Callable[[Any, PyResponse | BaseException], None] = self._on_answer
        #: set when the model unloads: what a request held past the drain is answered with
        self.stopped: BaseException | None = None

    def poke(self) -> None:
        """Something changed (a request came, an instance has room, or serves again): look
        at the queue, at the end of this turn of the event loop (no batching delay: in a
        callback, not a task), with what else came in the turn."""
        if self._delay:
            self._wake.set()
        elif not self._scheduled:
            self._scheduled = True
            (self._loop or asyncio.get_running_loop()).call_soon(self._dispatch_soon)

    def _dispatch_soon(self) -> None:
        self._scheduled = False
        self._dispatch()

    def enqueue(self, request: PyRequest, stream: bool) -> Item:
        """Take a request: it leaves with the others of this turn of the event loop."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        item = Item(request, stream, self._clock.monotonic(), loop)
        self.inflight += 1
        self._queue.append(item)
        self.poke()
        return item

    def fail_queued(self, exc: BaseException) -> None:
        """Answer every request still queued with ``exc``, and every one that an instance
        gives back from now on."""
        self.stopped = exc
        while self._queue:
            self.settle(self._queue.popleft(), exc)

    def abandon(self, item: Item) -> None:
        """The caller left: forget a queued request, tell the model of one it holds."""
        if item.answered:
            return
        if item.call is None:
            try:
                self._queue.remove(item)
            except ValueError:
                pass
        elif item.instance is not None:
            item.instance.cancel([item.call])
        self.done(item)

    def done(self, item: Item) -> None:
        if item.answered:
            return
        item.answered = True
        self.inflight -= 1
        if item.call is not None:
            counts = self.counts[item.slot]
            now = self._clock.monotonic()
            counts[0] += 1
            counts[1] += now - item.enqueued
            counts[2] += item.sent - item.enqueued
            counts[3] += now - item.sent
            if item.trace is not None:  # computed: sent to its instance -> answered
                item.trace.computed(item.sent, item.sent, now, now)
        if not self.inflight:
            self.idle.set()

    def settle(self, item: Item, outcome: PyResponse | BaseException) -> None:
        if item.future is not None and not item.future.done():
            if isinstance(outcome, BaseException):
                item.future.set_exception(outcome)
                item.future.exception()  # a caller that left does not await it
            elif outcome.error is not None:
                item.future.set_exception(outcome.error)
                item.future.exception()
            else:
                item.future.set_result(outcome.outputs if item.unwrap else outcome)
            if item.then is not None:
                self.then(item)
        elif (
            isinstance(outcome, BaseException)
            and item.dispatched is not None
            and not item.dispatched.done()
        ):
            item.dispatched.set_exception(outcome)  # a stream's caller waits on this
            item.dispatched.exception()
        self.done(item)

    def then(self, item: Item) -> None:
        """Call ``item.then`` with its settled future, once; what it raises is logged (it
        runs inside the reading of the instance's frame, which nothing may break)."""
        then, item.then = item.then, None
        assert then is not None and item.future is not None
        try:
            then(item.future)
        except Exception as exc:
            _log.error("python_request_then_failed", model=self.config.name, error=repr(exc))

    def crashed(self, item: Item, exc: InstanceCrashedError) -> BaseException | None:
        """An instance died holding ``item``: None if it goes back to the queue (alone), else
        the error it gets (poison; or a stream that had begun and cannot be replayed)."""
        item.kills += 1
        if self.stopped is not None:
            return self.stopped  # unloading: the instances are finalized, nobody retries
        if item.responses:
            return exc
        if item.kills >= 2:
            _log.error("python_poison_request", model=self.config.name, error=str(exc))
            return PoisonRequestError(
                f"model '{self.config.name}': this request was held by instance processes "
                f"that died twice and is not tried again (last: {exc})",
                exc.returncode,
            )
        item.call = None
        item.instance = None
        if item.dispatched is not None:
            item.dispatched = asyncio.get_running_loop().create_future()
        self._queue.appendleft(item)
        self.poke()
        return None

    def _on_answer(self, item: Item, answer: PyResponse | BaseException) -> None:
        """The instance's answer to ``item`` (its final response, or the error that ended
        it): the :data:`~.held.Sink` of the calls this batcher sends."""
        if item.answered:
            return
        if isinstance(answer, InstanceCrashedError):
            error = self.crashed(item, answer)
            if error is not None:
                self.settle(item, error)
            return
        if isinstance(answer, BaseException):
            self.settle(item, answer)
            return
        self.settle(item, check_outputs(self.config, answer, self._dtypes))

    def _full(self) -> bool:
        """The queue holds a full batch (one that waiting could not make larger)."""
        queue = self._queue
        return len(queue) >= max(1, self.config.max_batch_size) and not queue[0].kills

    def _room(self, inst: InstanceProcess, full: bool) -> int:
        """Batches ``inst`` may take now: an idle sync instance one, a busy one more only when
        they are full (a partial batch waits to grow) or when it merges them (a model that
        batches: up to its held requests' cap); an async instance many. A request that was
        in a crash goes only to an idle instance."""
        if inst.is_async:
            return ASYNC_BATCHES - inst.executing
        if self._eager and not self._queue[0].kills:
            return 1 if inst.held < self._eager else 0
        return (self._pipeline if full else 1) - inst.executing

    def _pick(self) -> tuple[int, InstanceProcess] | None:
        best: tuple[int, InstanceProcess] | None = None
        assert self.pool is not None
        full = bool(self._queue) and self._full()
        for slot in self.pool.slots:
            inst = slot.instance
            if inst is None or not inst.alive:
                continue
            if self._room(inst, full) > 0 and (best is None or inst.held < best[1].held):
                best = (slot.index, inst)
        return best

    def _take(self) -> list[Item]:
        queue = self._queue
        if queue[0].kills:
            return [queue.popleft()]  # a request that was in a crash goes alone
        limit = max(1, self.config.max_batch_size)
        batch: list[Item] = []
        while queue and len(batch) < limit and not queue[0].kills:
            batch.append(queue.popleft())
        return batch

    async def run(self) -> None:
        """Dispatch for a model with a batching delay (without one, :meth:`poke` does)."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            while (wait := self._dispatch()) is not None:
                await self._clock.sleep(wait)

    def _dispatch(self) -> float | None:
        """Send what may leave now; the seconds the head of the queue still waits for company
        (None: it waits for an instance with room, or nothing is queued)."""
        delay = self._delay
        while self._queue:
            picked = self._pick()
            if picked is None:
                return None  # poked again when an instance has room
            limit = max(1, self.config.max_batch_size)
            if delay and len(self._queue) < limit and not self._queue[0].kills:
                wait = self._queue[0].enqueued + delay - self._clock.monotonic()
                if wait > 0:
                    return wait
            slot, instance = picked
            batches = [self._take()]
            room = self._room(instance, True) - 1 if self._queue else 0
            while room > 0 and self._queue and self._full():
                batches.append(self._take())  # full batches more: one frame for them all
                room -= 1
            if not self._send(slot, instance, *batches):
                return None
        return None

    def _send(self, slot: int, instance: InstanceProcess, *batches: list[Item]) -> bool:
        """Hand ``batches`` to ``instance``; False if it is gone (they are queued again, and
        looked at again on the next turn)."""
        stream = self.config.decoupled
        try:
            sent = instance.submit_many(
                [[item.request for item in batch] for batch in batches],
                stream=stream,
                alone=[bool(batch[0].kills) for batch in batches],
                now=True,  # (this turn's requests are in: no turn more before they leave)
                sink=None if stream else self._sink,  # (answered without a future each)
                owners=batches,
            )
        except InstanceCrashedError:
            for batch in reversed(batches):
                self._queue.extendleft(reversed(batch))  # it never reached the process
            self.poke()
            return False
        except (ValueError, ModelRuntimeError) as exc:
            for batch in batches:
                for item in batch:
                    self.settle(item, InputValidationError(f"the request cannot be sent: {exc}"))
            return True
        now = self._clock.monotonic()
        for batch, calls in zip(batches, sent, strict=True):
            for item, call in zip(batch, calls, strict=True):
                item.call, item.instance, item.slot, item.sent = call, instance, slot, now
                if item.dispatched is not None:
                    item.dispatched.set_result(call)
        return True

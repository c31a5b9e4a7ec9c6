"""The Queue actor: takes callers' requests, has them sealed into batches, routes answers back.

One Queue per replica, built on :class:`~actors.queues.sealer.Sealer` (which packs waiting
rows into batches in ``Queue.ready``). The queue adds what callers and the replica's session
see: requests queued by priority (the queue policy's hooks), the answers of a batch
(:class:`Complete`, :class:`Settle`, :class:`Fail`) routed to its callers, and the actor's life:
drain, stop, and evacuation when its replica goes out of service. A batch sealed as a request
arrives for an idle device is first offered to the session (``run_now``), which may run and
answer it in place, before ``enqueue`` returns. A caller that goes away while its request
waits (its future done) is simply dropped.

Like the sealer's, every change of state happens on the event loop without awaiting.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence

import anyio
import numpy as np

from actors.actor import Envelope
from actors.clock import Clock
from actors.queues.batch import Batch
from actors.queues.config import QueueConfig
from actors.queues.messages import (
    Complete,
    Drain,
    Enqueue,
    Fail,
    FailAll,
    Flush,
    GetStats,
    QueueMessage,
    Settle,
)
from actors.queues.request import Request
from actors.queues.routing import fail_batch, fail_requests, route_outputs, stamp
from actors.queues.sealer import Sealer
from actors.queues.stats import QueueStats
from actors.queues.tracing import STATE as TRACING
from model_runtime.errors import ActorStoppedError, RunnerStoppedError
from model_runtime.executable.model import ExecutableMetadata

__all__ = ["Queue"]


class Queue(Sealer):
    """One replica's batching queue (see the module docstring and :class:`QueueConfig`)."""

    #: Every ``execute()`` is one ``tell``: room for a burst of many concurrent callers.
    mailbox_size = 1 << 16

    def __init__(
        self,
        metadata: ExecutableMetadata,
        config: QueueConfig,
        *,
        replica: int = 0,
        clock: Clock | None = None,
        name: str | None = None,
        handoff: Callable[[list[Request], BaseException | None], None] | None = None,
    ) -> None:
        """Allocate the ring pool and the ``ready`` stream.

        ``handoff`` takes the requests still unanswered when the queue stops (its replica's
        subtree is being replaced), and those of a batch failed with ``Fail(elsewhere=True)``,
        with the error, so they move to another replica instead of failing.

        Raises:
            ConfigurationError: the model's anchors do not fit ``config`` (see ``Layout``).
        """
        super().__init__(metadata, config, replica=replica, clock=clock, name=name)
        self._handoff = handoff
        if self._groups is not None:  # (an instance attribute: fixed shapes pay nothing)
            self.enqueue_nowait = self._enqueue_shaped  # type: ignore[method-assign]

    # -- what the runner and the session read -----------------------------------------------------

    @property
    def pending_samples(self) -> int:
        """Rows enqueued and not answered yet (a gone caller's until the queue notices)."""
        return self._rows_in - self._rows_closed

    def saturated(self) -> bool:
        """Every batch buffer is in use: rows queued now wait until a batch ends."""
        return len(self._outstanding) >= self._max_outstanding

    def collecting(self) -> bool:
        """The device is idle and a flush is due this loop turn: rows queued now ride in the
        batch it seals (the callers of the last batch queueing again)."""
        return self._idle_flush_due

    def open_room(self) -> int:
        """Rows that complete the open partial batch (a whole batch's when the waiting rows
        are a whole number of batches): rows queued now, up to that many, ride in a batch
        sealed no later than the one the rows waiting now fill."""
        return self._capacity - self._pending_rows % self._capacity

    def placement(self) -> int:
        """How soon rows queued here now would run, for ``ReplicaSet.pick`` (smaller is
        sooner): fewest batches sealed and not completed first (an idle device), then the most
        rows waiting to be packed (the batch being filled: one sealer's batches, not R
        half-full ones), a flush due when the callers just answered have queued again
        counting as one; with every buffer in use, the fewest rows waiting (new rows wait
        behind them)."""
        outstanding = len(self._outstanding)
        if outstanding >= self._max_outstanding:
            return (outstanding << 32) + self._pending_rows
        return (outstanding << 32) - self._pending_rows - self._idle_flush_due

    @property
    def inflight_requests(self) -> int:
        """Requests enqueued and not answered yet."""
        return self._inflight

    def stats(self) -> QueueStats:
        """The statistics now, without messaging (same as asking :class:`GetStats`)."""
        return self._recorder.snapshot()

    # -- intake: the hot path ---------------------------------------------------------------------

    def enqueue_nowait(self, request: Request, now: float | None = None) -> bool:
        """Queue ``request`` at once, as handling ``Enqueue(request)`` would, without the
        mailbox's hop through the event loop (a caller on the queue's own event loop only);
        ``now``: the queue clock's time, if the caller has just read it. True: the request was
        answered before this returned (run in place on an idle device).

        Safe because every change to the queue's state happens without awaiting; the only
        difference from ``tell(Enqueue(...))`` is that it overtakes messages still in the
        mailbox. Never raises: refusals go to ``request.future``. A request whose caller has
        gone already (its future done) is queued all the same and dropped when reached, as one
        that goes while it waits.
        """
        req = request
        if self._draining or not self._running:
            fut = req.future
            if not fut.done():
                reason = "is draining" if self._running else "stopped"
                fut.set_exception(RunnerStoppedError(f"queue {self.name} {reason}"))
            return False
        n = req.samples  # req._open is True from its creation: counted from here on
        self._inflight += 1
        if now is None:
            now = self._now()
        self._last_arrival = now
        before = self._pending_rows
        after = self._pending_rows = before + n
        self._rows_in += n  # and pending_samples, which is _rows_in - _rows_closed
        pending = self._pending
        if not pending or pending[-1].priority >= req.priority:
            pending.append(req)  # the common case: one level, FIFO
        else:
            self._insert_by_priority(req)
        if after >= self._capacity:
            if len(self._outstanding) >= self._max_outstanding:
                return False
            self._pump()  # (a batch failed while being sealed answers at once)
            if self._groups is None or self._outstanding:
                return req.future.done()
            # rows of several shapes, none a full batch, and an idle device: as below
        if self._eager and not self._outstanding:
            if self._idle_flush_due or self._ran_now:
                # A flush is due this loop iteration and takes these rows; or one request of
                # this iteration ran in place: the others of the iteration (callers one answer
                # released) ride one batch, flushed when they have all queued.
                if before == 0:
                    self._open_since = now
                self._flush_when_idle()
                return False
            # An idle device: this request runs now, at its bucket; in place when the
            # session can (what waits is less than a batch: one batch is sealed), once per
            # loop iteration (above: callers that run in this iteration after an answer given
            # in place are not alone; they would each run alone, in place, never batched).
            self._direct = self.run_now is not None
            self._flush()
            self._direct = False
            batch, self._direct_batch = self._direct_batch, None
            if batch is not None:
                run_now = self.run_now
                if run_now is not None and run_now(batch):
                    self._ran_now = True
                    asyncio.get_running_loop().call_soon(self._next_turn)
                else:
                    self._emit(batch)
            return req.future.done()
        b = self.layout.B
        if before == 0:
            self._open_since = now
        if before < b <= after:
            self._iter_full_since = now
        elif before:
            return False
        self._kick()
        return False

    def _enqueue_shaped(self, request: Request, now: float | None = None) -> bool:
        """:meth:`enqueue_nowait` of a model with dynamic dimensions: counted by shape first."""
        assert self._groups is not None
        if self._running and not self._draining:
            self._groups.add(request)
        return Queue.enqueue_nowait(self, request, now)

    def _next_turn(self) -> None:
        self._ran_now = False

    def waiting(self, request: Request) -> None:
        """``request``'s caller now waits for its outputs: with ``flush_on_waiting_outputs``
        a partial batch that timed out holding its rows is flushed now. Same-loop callers only,
        like :meth:`enqueue_nowait`."""
        request.waiting = True
        self._kick()

    # -- the queue policy's hooks (model_runtime.queue_policy) ------------------------------------

    def _insert_by_priority(self, req: Request) -> None:
        """Queue ``req`` after every request of its priority or higher, before the lower ones
        (never before a request whose rows are already being packed)."""
        pending = self._pending
        i = len(pending)
        while i > 0 and pending[i - 1].priority < req.priority:
            i -= 1
        if i == 0 and pending and pending[0]._taken:
            i = 1
        pending.insert(i, req)

    def waiting_at(self, low: int, high: int) -> int:
        """Requests of priorities ``low`` to ``high`` waiting to be packed (a queue policy's
        ``max_queue_size`` per level, delayed ones included: :mod:`model_runtime.queue_policy`)."""
        return sum(
            1
            for r in self._pending
            if low <= r.priority <= high and not r._taken and not r.future.done()
        )

    def demote(self, request: Request, by: int) -> None:
        """Move ``request``, still waiting, ``by`` down (less than a level's step): behind the
        requests of its priority, later ones too (a queue policy's DELAY). Packed, answered or
        gone: left as it is."""
        if request._taken or request.future.done():
            return
        try:
            self._pending.remove(request)
        except ValueError:
            return
        request.priority -= by
        self._insert_by_priority(request)

    def expire(self, request: Request, error: BaseException) -> None:
        """Fail ``request`` with ``error`` if none of its rows is packed yet (its caller is
        answered now; its rows are dropped when reached, as a gone caller's)."""
        if not request._taken and not request.future.done():
            request.future.set_exception(error)

    @property
    def waiting_requests(self) -> int:
        """Requests queued and not yet packed into a batch (what ``max_queue_size`` bounds)."""
        return len(self._pending)

    # -- answers of batches -----------------------------------------------------------------------

    def answer_nowait(self, answer: Complete | Settle | Fail) -> None:
        """Take a batch's outcome at once, as handling the message would, without the
        mailbox's hop (the replica's session, on the queue's own loop: one fewer wake-up per
        batch). Like :meth:`enqueue_nowait`, it overtakes messages still in the mailbox,
        which only matters to ``GetStats`` (it sees the batch answered sooner).

        Raises:
            ActorStoppedError: the queue has stopped (its callers were handed off or failed).
        """
        if not self._running:
            raise ActorStoppedError(f"actor {self.name} has stopped")
        self._answer(answer)

    def _answer(self, answer: Complete | Settle | Fail) -> None:
        match answer:
            case Complete(batch, outputs, t_start, t_end):
                if self._release(batch):
                    submits: list[float] = []
                    packed: list[float] = []
                    try:
                        closed = route_outputs(self.layout, batch, outputs, submits, packed)
                    except (KeyError, IndexError, ValueError) as exc:
                        closed = fail_batch(batch, exc)
                    self._close(closed)
                    t_out = self._now()
                    self._recorder.add(t_start, t_end, t_out, submits, packed)
                    if TRACING.on:
                        stamp(batch, t_start, t_end, t_out)
                    self._after_release(closed[1])
            case Settle(batch, parts, rejected, t_start, t_end):
                if self._release(batch):
                    if TRACING.on:
                        stamp(batch, t_start, t_end, self._now())
                    self._after_release(self._settle(parts, rejected, t_start, t_end))
            case Fail(batch, error, elsewhere):
                if self._release(batch):
                    if elsewhere and self._handoff is not None:
                        self._handoff(self._give_up(batch), error)
                        self._after_release(0)
                    else:
                        closed = fail_batch(batch, error)
                        self._close(closed)
                        self._after_release(closed[1])

    def _settle(
        self,
        parts: Sequence[tuple[Batch, Sequence[Mapping[str, np.ndarray]]]],
        rejected: Sequence[tuple[Request, BaseException]],
        t_start: float,
        t_end: float,
    ) -> int:
        """Answer a bisected batch: the rejected requests their error, the rest their rows.
        Returns how many requests were answered."""
        closed = fail_requests(rejected)
        self._close(closed)
        answered = closed[1]
        submits: list[float] = []
        packed: list[float] = []
        for part, outputs in parts:
            try:
                closed = route_outputs(self.layout, part, outputs, submits, packed)
            except (KeyError, IndexError, ValueError) as exc:
                closed = fail_batch(part, exc)
            self._close(closed)
            answered += closed[1]
        self._recorder.add(t_start, t_end, self._now(), submits, packed)
        return answered

    # -- actor hooks ------------------------------------------------------------------------------

    async def on_start(self) -> None:
        if self._streams_closed:
            self._open_streams()

    async def on_stop(self) -> None:
        if self._handoff is not None:
            self._handoff(self.evacuate(), None)
        self._fail_all(RunnerStoppedError(f"queue {self.name} stopped"))
        stopped = ActorStoppedError(f"actor {self.name} has stopped")
        for envelope in self._drain_waiters:
            envelope.fail(stopped)
        self._drain_waiters.clear()
        self._ready_send.close()
        for waiter in self._readers:  # they find the stream ended
            if not waiter.done():
                waiter.set_result(None)
        self._readers.clear()
        self._streams_closed = True

    async def background(self) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._sender)
            await self._timer.run()

    async def _dispatch(self, envelope: Envelope) -> None:
        # Drain answers later (when nothing is left unpacked), so it bypasses handle().
        if type(envelope.message) is Drain and envelope.reply is not None:
            self._drain_waiters.append(envelope)
            self._start_drain()
            return
        await super()._dispatch(envelope)

    async def handle(self, message: QueueMessage) -> object:
        """Handle one message (see :mod:`actors.queues.messages`).

        Raises:
            ActorError: an unknown message.
        """
        match message:
            case Enqueue(request):
                self.enqueue_nowait(request)
            case Complete() | Settle() | Fail():
                self._answer(message)
            case Flush():
                self._flush()
            case Drain():
                self._start_drain()
            case FailAll(error):
                self._fail_all(error)
            case GetStats():
                return self._recorder.snapshot()
            case _:
                return await super().handle(message)
        return None

    # -- out of service, drain and shutdown -------------------------------------------------------

    def evacuate(self) -> list[Request]:
        """Give up every unanswered request and forget it; the queue takes no more.

        For a replica that is out of service: the runner re-queues the returned requests on
        another replica (inference is idempotent, so rows already computed here are simply
        computed again). Batches sealed here and completed or failed later are ignored, so a
        moved caller is never answered from here. Same-loop callers only, like
        :meth:`enqueue_nowait`.
        """
        moved: list[Request] = []
        seen: set[int] = set()

        def keep(req: Request) -> None:
            if id(req) not in seen and not req.future.done():
                seen.add(id(req))
                moved.append(req)

        for req in self._pending:
            keep(req)
        for batch in self._outstanding.values():
            for segment in batch.segments:
                keep(segment[0])
        self._draining = True
        self._pending.clear()
        self._pending_rows = self._inflight = 0
        self._rows_closed = self._rows_in
        if self._idle is not None:
            self._idle.set()
        for batch in list(self._outstanding.values()):
            self._release(batch)
        self._backlog.clear()
        while True:
            try:
                self._ready_recv.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                break
        self._check_drained()
        return moved

    def _give_up(self, batch: Batch) -> list[Request]:
        """Forget the unanswered requests of ``batch`` (they move elsewhere), once each."""
        moved: list[Request] = []
        closed_samples = closed = 0
        for req in batch.requests:
            if req._open:
                req._open = False
                closed_samples += req.samples
                closed += 1
                if not req.future.done():
                    moved.append(req)
        self._close((closed_samples, closed))
        return moved

    def resume(self) -> None:
        """Take requests again after :meth:`evacuate`: the replica is back in service."""
        self._draining = False

    async def wait_answered(self) -> None:
        """Return once every request taken here has its answer, or has moved to another
        queue (a caller gone meanwhile counts once the queue has noticed)."""
        while self._inflight > 0:
            if self._idle is None or self._idle.is_set():
                self._idle = anyio.Event()
            await self._idle.wait()

    def fail_everything(self, error: BaseException) -> None:
        """Answer every request still here with ``error`` (what :class:`FailAll` does), at
        once and whether or not the actor runs: the runner's last net when it stops."""
        self._fail_all(error)

    def _start_drain(self) -> None:
        self._draining = True
        self._pump()
        self._check_drained()

    def _fail_all(self, error: BaseException) -> None:
        while self._pending:
            req = self._pending.popleft()
            if not req.future.done():
                req.future.set_exception(error)
            self._drop(req)
        self._pending_rows = 0
        for batch in self._outstanding.values():
            self._close(fail_batch(batch, error))
        self._check_drained()

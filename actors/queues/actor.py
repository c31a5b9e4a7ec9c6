"""The Queue actor: packs callers' rows into device batches and routes outputs back.

One Queue per replica. Requests wait in a FIFO of unpacked rows; a batch is sealed (its rows
copied into a ring pool buffer, or passed as views when one request fills it exactly) when
``device_iterations * batch_size`` rows are waiting and a buffer is free, or when a flush
(timeout, :class:`Flush`, :class:`Drain`) makes a partial batch of what is waiting, padded.
Sealed batches go to ``Queue.ready`` in order; the session runs them and answers with
:class:`Complete` or :class:`Fail`, which frees the buffer. Until a buffer is free requests
wait, unpacked; a caller that goes away meanwhile (its future done) is simply dropped. A batch
sealed as a request arrives for an idle device is first offered to the session (``run_now``),
which may run and answer it in place, before ``enqueue`` returns.

Packing, splitting and the flush timer run on the event loop without awaiting, so the mailbox
handler and the background timer never see each other's half-done work.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence

import anyio
import numpy as np
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from actors.actor import Actor, Envelope
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
from actors.queues.packing import take
from actors.queues.pool import Layout, RingPool
from actors.queues.request import Request
from actors.queues.routing import fail_batch, fail_requests, route_outputs
from actors.queues.shapes import ShapeGroups
from actors.queues.stats import QueueStats, TraceRecorder
from actors.queues.timer import FlushTimer
from actors.queues.tracing import STATE as TRACING
from model_runtime.errors import ActorStoppedError, ApplicationRuntimeError, RunnerStoppedError
from model_runtime.executable.model import ExecutableMetadata

__all__ = ["Queue"]

_INF = math.inf


class Queue(Actor[QueueMessage]):
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
        super().__init__(name or f"queue-{metadata.model_name}-{replica}", clock=clock)
        self.config = config
        self.replica = replica
        self.layout = Layout(metadata, config)
        self._capacity = self.layout.capacity
        self._handoff = handoff
        #: A model with dynamic dimensions: batches of one shape each, in buffers of their own
        #: (:mod:`actors.queues.shapes`); the ring pool is for fixed shapes only.
        self._groups = ShapeGroups(metadata, config, self.layout) if metadata.is_dynamic else None
        self._pool = RingPool(self.layout, 0 if self._groups else config.pool_buffers)
        if self._groups is not None:  # (an instance attribute: fixed shapes pay nothing)
            self.enqueue_nowait = self._enqueue_shaped  # type: ignore[method-assign]
        #: batches packed and not completed, at most (max_look_ahead + 1, within the pool)
        self._max_outstanding = config.look_ahead
        self._recorder = TraceRecorder(config.request_tracepoints_buffer_size)
        self.log = self.log.bind(model=metadata.model_name, replica=replica)
        self._now = self.clock.monotonic
        self._ids = itertools.count()
        self._pending: deque[Request] = deque()
        self._pending_rows = 0  # unpacked rows in _pending (rows of gone callers included)
        self._rows_closed = 0  # rows of requests answered or given up (see pending_samples)
        self._inflight = 0
        self._outstanding: dict[int, Batch] = {}  # sealed, not completed or failed
        self._backlog: deque[Batch] = deque()  # sealed, not yet in the ready stream
        self._backlog_event: anyio.Event | None = None
        self._draining = False
        self._drain_waiters: list[Envelope] = []
        self._idle: anyio.Event | None = None  # set when no request is left unanswered
        self._readers: deque[asyncio.Future[None]] = deque()  # see batch_ready()
        self._rows_in = 0  # rows ever enqueued (rows packed or dropped: _rows_in - _pending_rows)
        self._flush_mark = 0  # a flush covers the rows enqueued before this mark
        self._last_arrival = self._open_since = self._iter_full_since = 0.0
        self._timer = FlushTimer(self.clock, self._flush_deadline, self._on_timeout)
        #: Batch-size buckets (DESIGN.md §6): a request is dispatched at once when the device
        #: is idle, at the smallest bucket that holds what waits, and ``timeout`` bounds the
        #: wait of a batch's first request. One batch size: the seed's fixed-batch rules.
        self._eager = len(self.layout.buckets) > 1
        self._idle_flush_due = False
        #: Set by the replica's session while it serves: given a batch sealed for an idle
        #: device, it runs and answers it in place and returns True, or returns False (the
        #: batch then goes to ``ready`` as any other).
        self.run_now: Callable[[Batch], bool] | None = None
        self._direct = False  # the batch being sealed may be run in place
        self._direct_batch: Batch | None = None
        self._ran_now = False  # a batch was run in place in this loop iteration
        self._kick = self._timer.kick
        self._open_streams()

    # -- what the runner and the session read --------------------------------------------------

    @property
    def ready(self) -> MemoryObjectReceiveStream[Batch]:
        """Sealed batches, in order; capacity ``config.look_ahead``. Ends when the queue stops."""
        return self._ready_recv

    @property
    def pending_samples(self) -> int:
        """Rows enqueued and not answered yet (a gone caller's until the queue notices)."""
        return self._rows_in - self._rows_closed

    # saturated() and open_room() are methods, not properties: ReplicaSet.pick reads them
    # when it scans the replicas, and a property costs twice a method call's overhead.

    def saturated(self) -> bool:
        """Every batch buffer is in use: rows queued now wait until a batch ends."""
        return len(self._outstanding) >= self._max_outstanding

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
            if self._idle_flush_due:  # scheduled this loop iteration: it takes these rows
                if before == 0:
                    self._open_since = now
                return False
            # An idle device: this request runs now, at its bucket; in place when the
            # session can (what waits is less than a batch: one batch is sealed), once per
            # loop iteration: callers that run in this iteration after an answer given in
            # place are not alone (they would each run alone, in place, never batched).
            self._direct = self.run_now is not None and not self._ran_now
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

    def stats(self) -> QueueStats:
        """The statistics now, without messaging (same as asking :class:`GetStats`)."""
        return self._recorder.snapshot()

    # -- actor hooks ---------------------------------------------------------------------------

    def _open_streams(self) -> None:
        send: MemoryObjectSendStream[Batch]
        send, self._ready_recv = anyio.create_memory_object_stream[Batch](self.config.look_ahead)
        self._ready_send = send
        self._streams_closed = False

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
                        _stamp(batch, t_start, t_end, t_out)
                    self._after_release(closed[1])
            case Settle(batch, parts, rejected, t_start, t_end):
                if self._release(batch):
                    if TRACING.on:
                        _stamp(batch, t_start, t_end, self._now())
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

    # -- the hot path --------------------------------------------------------------------------

    def _next_turn(self) -> None:
        self._ran_now = False

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

    def _close(self, closed: tuple[int, int]) -> None:
        self._rows_closed += closed[0]
        self._inflight -= closed[1]
        if self._idle is not None and self._inflight <= 0:
            self._idle.set()

    def _drop(self, req: Request) -> None:
        """Forget a gone caller's unpacked rows."""
        self._pending_rows -= req.samples - req._taken
        if req._open:
            req._open = False
            self._close((req.samples, 1))

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

    def _pump(self) -> None:
        """Seal every batch that may be sealed now (full ones, or a due partial one)."""
        cap = self.layout.capacity
        sealed = False
        while self._pending_rows and len(self._outstanding) < self._max_outstanding:
            due = self._rows_in - self._pending_rows < self._flush_mark or self._draining
            if self._pending_rows >= cap:
                # A batch's worth waits; of a dynamic model it may be of several shapes that
                # fill none, and then a due flush seals the oldest shape partly filled.
                partial = due and self._groups is not None
            elif due:
                partial = True
            else:
                break
            if self._seal(partial):
                sealed = True
            elif partial or self._groups is not None:  # (no shape fills a batch)
                break
        if sealed:
            now = self._now()
            self._open_since = now
            if self._pending_rows >= self.layout.B:
                self._iter_full_since = now
            self._kick()
        if self._draining:
            self._check_drained()

    def _seal(self, partial: bool) -> bool:
        """Make a batch of up to I*B waiting rows; False if none was made (no live rows, or
        fewer than a full batch when not ``partial``)."""
        groups = self._groups
        if not (partial or groups is None or groups.full):
            return False  # no shape fills a batch (ShapeGroups.full)
        now = self._now()
        if self._eager and partial and len(self._pending) == 1 and self._seal_alone(now):
            return True
        layout, pool = self.layout, self._pool
        if groups is None:
            got = take(self._pending, layout, partial, now)
        else:  # one shape's requests, in a buffer of that shape
            split = groups.split(self._pending, self._capacity, partial)
            for req in split.gone:
                self._drop(req)
            if split.key is None:
                self._pending = split.merge()
                return False
            layout, pool = groups.layout(split.key)
            got = take(split.group, layout, partial, now)
            groups.taken(split.key, got.rows)
            for req in got.dropped:
                groups.dropped(req)
            self._pending = split.merge()
        for req in got.dropped:
            self._drop(req)
        if not got.rows:
            return False
        self._pending_rows -= got.rows
        plain = got.plain
        segments = None if plain is not None else tuple(got.segments)
        if got.views is not None:
            batch = Batch(next(self._ids), got.views, segments, got.rows, False, now)
            batch.outputs_into = got.into
            self._emit(batch)
            return True
        index = pool.free.pop()
        inputs = pool.buffers[index]
        size = layout.capacity
        if self._eager and got.rows < size:  # the smallest bucket that holds the rows
            size = layout.bucket(got.rows)
            if size < layout.capacity:
                inputs = ({name: array[:size] for name, array in inputs[0].items()},)
        padded = got.rows < size
        batch = Batch(
            next(self._ids),
            inputs,
            segments,
            got.rows,
            padded,
            now,
            _buffer=index,
            plain=plain,
        )
        if pool is not self._pool:  # a shape's (see ShapeGroups.layout)
            batch._free = pool.free
        try:
            batch.flush_outputs = pool.fill(
                index, got.per_iteration, got.rows, self.config.flush_callback, size, plain
            )
        except Exception as exc:
            pool.free.append(index)
            callback = self.config.flush_callback
            name = getattr(callback, "__qualname__", repr(callback))
            error = ApplicationRuntimeError(
                f"queue {self.name}: flush_callback {name} failed: {type(exc).__name__}: {exc}"
            )
            error.__cause__ = exc
            self._close(fail_batch(batch, error))
            self.log.warning("queue.flush_failed", error=repr(exc))
            return True
        self._emit(batch)
        return True

    def _seal_alone(self, now: float) -> bool:
        """A lone waiting request whose rows are exactly a bucket runs on views of its own
        arrays (no copy into the pool); False: it is packed as usual."""
        req = self._pending[0]
        n = req.samples
        if req._taken or n not in self.layout.buckets or req.future.done():
            return False
        views = self.layout.zero_copy(req.inputs, 0, n)
        if views is None:
            return False
        self._pending.popleft()
        self._pending_rows -= n
        req._taken = n
        req._t_packed = now
        segment = (req, 0, 0, 0, n)
        batch = Batch(next(self._ids), views, (segment,), n, False, now)
        batch.outputs_into = self.layout.zero_copy_outputs(req.outputs, 0, n)
        self._emit(batch)
        return True

    def _emit(self, batch: Batch) -> None:
        self._outstanding[batch.id] = batch
        if self._direct:  # enqueue_nowait offers it to the session once the queue is done
            self._direct = False
            self._direct_batch = batch
            return
        if not self._backlog:
            try:
                self._ready_send.send_nowait(batch)
                self._wake_reader()
                return
            except anyio.WouldBlock:
                pass
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                self._undeliverable(batch)
                return
        self._backlog.append(batch)
        if self._backlog_event is not None:
            self._backlog_event.set()

    def batch_ready(self) -> asyncio.Future[None]:
        """A future done once a batch may be in ``ready`` (or the queue stopped): the session's
        cheap wait, then ``ready.receive_nowait()``. (anyio's ``receive`` costs a checkpoint
        and a backend lookup per wait.) Same-loop callers only."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._streams_closed or self._ready_recv.statistics().current_buffer_used:
            waiter.set_result(None)
        else:
            self._readers.append(waiter)
        return waiter

    def _wake_reader(self) -> None:
        readers = self._readers
        while readers:
            waiter = readers.popleft()
            if not waiter.done():  # a cancelled reader's turn passes to the next
                waiter.set_result(None)
                return

    def _release(self, batch: Batch) -> bool:
        if batch._released:
            return False
        batch._released = True
        self._outstanding.pop(batch.id, None)
        if batch._buffer is not None:
            (self._pool.free if batch._free is None else batch._free).append(batch._buffer)
        return True

    def _after_release(self, answered: int) -> None:
        """A batch ended (``answered``: how many callers its answers woke)."""
        if self._eager and not self._outstanding and (answered > 1 or self._pending_rows):
            # Several callers woke, or rows wait: flush once the woken have queued again.
            # (One woken caller and nothing waiting: its next request flushes at once.)
            self._flush_when_idle()
        if self._pending_rows:
            self._pump()
            self._kick()  # a partial batch that timed out while the pool was full is due now

    def _flush_when_idle(self) -> None:
        """The device went idle: flush what waits once the callers this batch's answers woke
        have run (their wake-ups were scheduled first), so their next requests ride along in
        one batch instead of the first going alone."""
        if not self._idle_flush_due:
            self._idle_flush_due = True
            asyncio.get_running_loop().call_soon(self._idle_flush)

    def _idle_flush(self) -> None:
        self._idle_flush_due = False
        if self._pending_rows and not self._outstanding and self.is_running:
            self._flush()

    # -- background tasks ----------------------------------------------------------------------

    async def _sender(self) -> None:
        """Moves batches the ready stream had no room for into it, in order."""
        while True:
            while not self._backlog:
                self._backlog_event = anyio.Event()
                await self._backlog_event.wait()
                self._backlog_event = None
            batch = self._backlog[0]
            try:
                await self._ready_send.send(batch)
                self._wake_reader()
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                self._undeliverable(batch)
            if self._backlog and self._backlog[0] is batch:  # evacuate() may have emptied it
                self._backlog.popleft()

    def _undeliverable(self, batch: Batch) -> None:
        """Nobody reads ``ready`` any more: the batch's callers get an error, not silence."""
        if self._release(batch):
            self._close(fail_batch(batch, RunnerStoppedError(f"queue {self.name}: no reader")))

    def _flush_deadline(self) -> float:
        """When the partial batch is due to be flushed (``inf``: not by time)."""
        if not self._pending_rows or self._draining:
            return _INF
        if len(self._outstanding) >= self._max_outstanding:
            return _INF  # nowhere to flush to; a release kicks the timer again
        cfg = self.config
        if (
            cfg.flush_on_waiting_outputs
            and not self._someone_waits()
            and not any(r.future.done() for r in self._pending)
        ):
            # Nobody waits for these rows (yet): no flush. (With rows of callers that went
            # away the timer still fires, to forget them.)
            return _INF
        # With buckets the first request's wait is bounded (Triton's max_queue_delay); with
        # one batch size, the seed's: no data for ``timeout`` since the last arrival.
        since = self._open_since if self._eager else self._last_arrival
        deadline = since + cfg.timeout if cfg.timeout > 0 else _INF
        if cfg.is_batch_size_timeout_enabled:
            if cfg.batch_size_timeout is not None:
                deadline = min(deadline, self._open_since + cfg.batch_size_timeout)
            if (
                cfg.data_parallel_timeout is not None
                and self.layout.I > 1
                and self._pending_rows >= self.layout.B
            ):
                deadline = min(deadline, self._iter_full_since + cfg.data_parallel_timeout)
        return deadline

    def _on_timeout(self) -> None:
        if self.config.flush_on_waiting_outputs and not self._someone_waits():
            live: deque[Request] = deque()
            for req in self._pending:
                if req.future.done():
                    self._drop(req)  # gone: forget its rows, flush nothing
                else:
                    live.append(req)  # not waiting yet: keep its rows for later
            self._pending = live
            return
        self._flush()

    def _someone_waits(self) -> bool:
        return any(r.waiting and not r.future.done() for r in self._pending)

    def waiting(self, request: Request) -> None:
        """``request``'s caller now waits for its outputs: with ``flush_on_waiting_outputs``
        a partial batch that timed out holding its rows is flushed now. Same-loop callers only,
        like :meth:`enqueue_nowait`."""
        request.waiting = True
        self._kick()

    def _flush(self) -> None:
        """Flush every row waiting now (full batches, then the partial one, padded) as soon as
        buffers allow; rows arriving before that partial batch is sealed ride along in it."""
        self._flush_mark = self._rows_in
        self._pump()

    # -- drain and shutdown --------------------------------------------------------------------

    def _start_drain(self) -> None:
        self._draining = True
        self._pump()
        self._check_drained()

    def _check_drained(self) -> None:
        if self._pending_rows == 0 and self._drain_waiters:
            for envelope in self._drain_waiters:
                envelope.answer(None)
            self._drain_waiters.clear()

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


def _stamp(batch: Batch, t_start: float, t_end: float, t_out: float) -> None:
    """Hand the traced requests of ``batch`` its times (only while tracing is on)."""
    requests = batch.plain if batch.plain is not None else [s[0] for s in batch.segments]
    for req in requests:
        trace = req.trace
        if trace is not None:
            trace.computed(req._t_packed, t_start, t_end, t_out)

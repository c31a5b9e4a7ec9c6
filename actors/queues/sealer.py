"""The sealing half of a replica's queue: waiting rows become batches in the ``ready`` stream.

:class:`Sealer` owns the rows waiting to be packed, the ring pool (or a dynamic model's shape
groups), the batches sealed and not yet answered, and the ``ready`` stream the session reads.
A batch is sealed (its rows copied into a pool buffer, or passed as views when one request
fills it exactly) when ``device_iterations * batch_size`` rows wait and a buffer is free, or
when a flush (the timer, :class:`~actors.queues.messages.Flush`, a drain) makes a partial
batch of what waits, padded to the smallest bucket that holds it. Sealed batches reach
``ready`` in order; a batch answered or failed frees its buffer and lets the next be sealed.

Everything here runs on the event loop without awaiting (but the backlog sender), so the
mailbox handler and the flush timer never see each other's half-done work.
:class:`~actors.queues.actor.Queue` builds on it: the intake, answers and lifecycle.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections import deque
from collections.abc import Callable
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from actors.actor import Actor, Envelope
from actors.clock import Clock
from actors.queues.batch import Batch
from actors.queues.config import QueueConfig
from actors.queues.messages import QueueMessage
from actors.queues.packing import take
from actors.queues.pool import Layout, RingPool
from actors.queues.request import Request
from actors.queues.routing import fail_batch
from actors.queues.shapes import ShapeGroups
from actors.queues.stats import TraceRecorder
from actors.queues.timer import FlushTimer
from model_runtime.errors import ApplicationRuntimeError, RunnerStoppedError
from model_runtime.executable.model import ExecutableMetadata

__all__ = ["Sealer"]

_INF = math.inf


class Sealer(Actor[QueueMessage]):
    """Seals one replica's waiting rows into batches (see the module docstring)."""

    def __init__(
        self,
        metadata: ExecutableMetadata,
        config: QueueConfig,
        *,
        replica: int = 0,
        clock: Clock | None = None,
        name: str | None = None,
    ) -> None:
        """Allocate the ring pool and the ``ready`` stream.

        Raises:
            ConfigurationError: the model's anchors do not fit ``config`` (see ``Layout``).
        """
        super().__init__(name or f"queue-{metadata.model_name}-{replica}", clock=clock)
        self.config = config
        self.replica = replica
        self.layout = Layout(metadata, config)
        self._capacity = self.layout.capacity
        #: A model with dynamic dimensions: batches of one shape each, in buffers of their own
        #: (:mod:`actors.queues.shapes`); the ring pool is for fixed shapes only.
        self._groups = ShapeGroups(metadata, config, self.layout) if metadata.is_dynamic else None
        self._pool = RingPool(self.layout, 0 if self._groups else config.pool_buffers)
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

    # -- the ready stream: what the session reads -------------------------------------------------

    @property
    def ready(self) -> MemoryObjectReceiveStream[Batch]:
        """Sealed batches, in order; capacity ``config.look_ahead``. Ends when the queue stops."""
        return self._ready_recv

    def batch_ready(self) -> asyncio.Future[None]:
        """A future done once a batch may be in ``ready`` (or the queue stopped): the session's
        cheap wait, then ``ready.receive_nowait()``. (anyio's ``receive`` costs a checkpoint
        and a backend lookup per wait.) Same-loop callers only."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.has_ready():
            waiter.set_result(None)
        else:
            self._readers.append(waiter)
        return waiter

    def has_ready(self) -> bool:
        """Whether ``ready.receive_nowait()`` answers now, a batch or the end of the stream
        (else it would raise ``WouldBlock``, an exception a batch the session need not pay)."""
        if self._streams_closed:
            return True
        state = self._ready_state
        if state is None:  # (an anyio without the state read below)
            stats = self._ready_recv.statistics()
            return bool(stats.current_buffer_used or stats.tasks_waiting_send)
        return bool(state.buffer or state.waiting_senders)

    def _wake_reader(self) -> None:
        readers = self._readers
        while readers:
            waiter = readers.popleft()
            if not waiter.done():  # a cancelled reader's turn passes to the next
                waiter.set_result(None)
                return

    def _open_streams(self) -> None:
        send: MemoryObjectSendStream[Batch]
        send, self._ready_recv = anyio.create_memory_object_stream[Batch](self.config.look_ahead)
        self._ready_send = send
        self._streams_closed = False
        # anyio's state of the stream (its buffer and waiting senders), read by has_ready
        # instead of statistics(), which builds a tuple of six counts a batch.
        self._ready_state: Any = getattr(self._ready_recv, "_state", None)
        if not hasattr(self._ready_state, "buffer") or not hasattr(
            self._ready_state, "waiting_senders"
        ):
            self._ready_state = None

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

    # -- bookkeeping of requests and buffers ------------------------------------------------------

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

    def _release(self, batch: Batch) -> bool:
        if batch._released:
            return False
        batch._released = True
        self._outstanding.pop(batch.id, None)
        if batch._buffer is not None:
            (self._pool.free if batch._free is None else batch._free).append(batch._buffer)
        return True

    def _check_drained(self) -> None:
        if self._pending_rows == 0 and self._drain_waiters:
            for envelope in self._drain_waiters:
                envelope.answer(None)
            self._drain_waiters.clear()

    # -- sealing: rows into batches ---------------------------------------------------------------

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

    def _flush(self) -> None:
        """Flush every row waiting now (full batches, then the partial one, padded) as soon as
        buffers allow; rows arriving before that partial batch is sealed ride along in it."""
        self._flush_mark = self._rows_in
        self._pump()

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

    # -- the flush timer --------------------------------------------------------------------------

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

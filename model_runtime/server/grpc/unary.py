"""``ModelInfer`` answered by callbacks on the nghttp2 transport (:mod:`.h2proto`), no task.

:class:`UnaryInfer` takes a call whose whole request has arrived (the transport holds a call
whose first :data:`WAIT_BYTES` did not end its request unstarted until it ends), for a
plain model (:func:`~model_runtime.server.inference.direct.plain_runner`): the message is
parsed (protobuf's C parser), checked and queued on its model's runner as the read is handled
(:func:`~model_runtime.server.inference.direct.submit`), and answered from its future's done
callback: encoded, serialized once, and its headers, DATA and trailers submitted together and
written with the other answers of that turn of the loop.

It keeps what :class:`~.native.GrpcApp` gives a call, or leaves the call to it: a call it does
not take (another method or encoding, a restricted group's refusal, a model that is not plain,
bytes that do not parse, a message past the size limit or big enough to parse off the loop, a
connection at its stream limit, the budget of :class:`~.budget.CallBudget` passed) goes the
app's way untouched, which answers it. For those it takes: Triton's status codes and texts
(:func:`~.service.failure_status`), ``grpc-timeout`` (DEADLINE_EXCEEDED past it), a client
that resets the stream or leaves cancels the request (its rows never run), the connection's
turns (:class:`~.shares.Shares`: a call waits for one by callback, refused RESOURCE_EXHAUSTED
past the write timeout), admission as over the app (a shed call's refusal held back while its
connection has other calls open), the call counted by its connection's share and the budget
until its stream ends, statistics and metrics as
:meth:`~.service.InferenceServicer.ModelInfer` counts them.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc
import structlog

from model_runtime.errors import QueueFullError, RequestTimeoutError
from model_runtime.server.answers import HTTPError, status_of
from model_runtime.server.ensemble import EnsembleRunner
from model_runtime.server.grpc.budget import CALL_OVERHEAD, CallBudget
from model_runtime.server.grpc.call import GRPC, OK, SERVICE_PATH, START_HEADERS, header_of
from model_runtime.server.grpc.codec import parse_model_infer_request
from model_runtime.server.grpc.framing import parse_timeout, status_trailers
from model_runtime.server.grpc.request_plan import read_model_infer_request
from model_runtime.server.grpc.response_wire import model_infer_response_bytes
from model_runtime.server.grpc.service import failure_status
from model_runtime.server.grpc.shares import Connection, Shares
from model_runtime.server.inference import direct
from model_runtime.server.inference.accounting import THREAD_PARSE_BYTES, samples_of
from model_runtime.server.inference.ensembles import submit_ensemble, taken_ensemble
from model_runtime.server.repository.entries import ModelState
from model_runtime.server.security.restrict import Restrictions, grpc_refusal

if TYPE_CHECKING:
    from model_runtime.server.grpc.h2proto import H2Protocol
    from model_runtime.server.grpc.h2stream import H2Stream
    from model_runtime.server.inference.plane import DataPlane
    from model_runtime.server.repository.entries import ModelEntry
    from model_runtime.server.tensors.request import InferRequest

__all__ = ["UnaryInfer"]

log = structlog.get_logger("model_runtime.server.grpc.service")  # the servicer's events

#: The most of a request that waits for its end before the app takes its call.
WAIT_BYTES = 16 << 10
_CONTENT_TYPE = b"content-type"
_TIMEOUT = b"grpc-timeout"
_ENCODING = b"grpc-encoding"


def taken_runner(plane: DataPlane, entry: ModelEntry, runner: Any) -> Any | None:
    """What runs a ModelInfer call taken by callbacks: a plain model's runner (queued by
    :func:`~.direct.submit`), or an ensemble that is not decoupled (its request queued by
    :func:`~.ensembles.submit_ensemble`, answered as a plain model's is); None: the app
    serves it."""
    inner = direct.plain_runner(plane, entry, runner)
    if inner is not None:
        return inner
    return taken_ensemble(plane, entry, runner)


def _read_headers(headers: list[tuple[bytes, bytes]]) -> tuple[bool, bytes | None]:
    """Whether a call of ``headers`` may be taken (gRPC's content type, no compression), and
    its ``grpc-timeout`` (None: none)."""
    timeout = None
    for key, value in headers:
        if key == _CONTENT_TYPE:
            if not value.startswith(GRPC):
                return False, None
        elif key == _TIMEOUT:
            timeout = value
        elif key == _ENCODING and value != b"identity":
            return False, None
    return True, timeout


class UnaryInfer:
    """The listener's ``ModelInfer`` calls taken by callbacks (see the module docstring)."""

    path = SERVICE_PATH + b"ModelInfer"

    def __init__(
        self,
        plane: DataPlane,
        *,
        max_message_size: int,
        shares: Shares,
        budget: CallBudget | None,
        restrictions: Restrictions | None = None,
    ) -> None:
        self.plane = plane
        self.shares = shares
        self.budget = budget
        self.restrictions = restrictions if restrictions else None
        self.max = min(max_message_size, THREAD_PARSE_BYTES - 1)
        # A call whose request spans reads waits unstarted (its bytes unread, its window not
        # given back) only while small: 256 such streams cannot fill a connection's window.
        self.max_wait = min(self.max + 5, WAIT_BYTES)

    def start(self, conn: H2Protocol, stream: H2Stream) -> bool:
        """Take the call of ``stream`` (its request ended); False: nothing was done, counted or
        answered (the app serves it)."""
        block = stream.block
        read = None if block is None else block.note
        if read is None:
            read = _read_headers(stream.headers)
            if block is not None:
                block.note = read
        taken, timeout = read
        if not taken:
            return False
        chunks = stream.chunks
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        size = len(body) - 5
        if (
            size < 0
            or size > self.max
            or body[0] != 0
            or int.from_bytes(body[1:5], "big") != size
            or (
                self.restrictions is not None
                and grpc_refusal(self.restrictions, "ModelInfer", header_of(stream.headers))
                is not None
            )
        ):
            return False
        try:
            seconds = None if timeout is None else parse_timeout(timeout)
            request = read_model_infer_request(memoryview(body)[5:])
        except Exception:  # (GrpcAbort among them) the app answers it
            return False
        plane = self.plane
        try:
            entry = plane.entry(request.model_name, request.model_version)
        except Exception:
            return False
        runner = entry.runner
        if plane.draining or runner is None or entry.state is not ModelState.READY:
            return False
        inner = taken_runner(plane, entry, runner)
        if inner is None or plane.tracer.reads_headers:
            return False
        shares = self.shares
        share = shares.start(conn.peer)
        if share is None:
            return False
        peer = conn.grpc_peer
        held = CALL_OVERHEAD + size
        budget = self.budget
        turn = shares.try_turn(share)
        if turn and budget is not None and not budget.try_enter(peer, held):
            shares.done(share)
            shares.end(share)
            return False
        # Taken: the request's window is given back, the call answers from here on.
        conn.taken(stream)
        deadline = None if seconds is None else conn.loop.time() + seconds
        call = _Call(self, conn, stream, share, peer, held, deadline)
        stream.ended_call = call.closed
        if turn:
            call.turn = call.entered = True
            call.begin(entry, inner, request, seconds)
        else:  # its connection's turns are taken: it waits for one, oldest first
            call.wait_turn(functools.partial(call.turned, entry, request))
        return True


class _Call:
    """One call taken by :class:`UnaryInfer`, from its request to its stream's end."""

    __slots__ = ("answered_at", "computing", "conn", "crowded", "deadline", "entered", "entry",
                 "held", "left", "owner", "parsed", "peer", "queue_full", "refused", "sent",
                 "share", "stream", "t0", "timed_out", "timer", "turn")  # fmt: skip

    def __init__(
        self,
        owner: UnaryInfer,
        conn: H2Protocol,
        stream: H2Stream,
        share: Connection,
        peer: str,
        held: int,
        deadline: float | None,
    ) -> None:
        self.owner = owner
        self.conn = conn
        self.stream = stream
        self.share = share
        self.peer = peer
        self.held = held
        self.deadline = deadline
        self.crowded = share.open > 1
        #: Holds one of its connection's turns; counted in the budget (as computed, until
        #: ``computing`` is over).
        self.turn = self.entered = False
        self.computing = True
        self.timed_out = False
        #: Its answer was submitted; its stream ended (counted out of share and budget).
        self.sent = self.left = False
        self.refused = self.queue_full = False
        self.entry: ModelEntry | None = None  # set once admitted, until finished
        self.parsed: InferRequest | None = None
        self.timer: direct.Expiry | None = None
        self.t0 = self.answered_at = 0.0

    def wait_turn(self, then: Callable[[asyncio.Future[None]], None]) -> None:
        """Wait for one of the connection's turns (:meth:`Shares.turn`'s rules, no task):
        ``then`` is called with the waiter once it is handed over, timed out, or cancelled."""
        loop = self.conn.loop
        waiter: asyncio.Future[None] = loop.create_future()
        self.share.queued.append(waiter)
        self.stream.task = waiter  # cancelled if the stream closes first
        self.timer = loop.call_later(self.owner.shares.write_timeout, self._turn_late, waiter)
        waiter.add_done_callback(then)

    def _turn_late(self, waiter: asyncio.Future[None]) -> None:
        if not waiter.done():
            self.timed_out = True
            waiter.cancel()

    def turned(self, entry: ModelEntry, request: Any, waiter: asyncio.Future[None]) -> None:
        """The wait for a turn ended: go on with the call, or refuse it, or (its client left)
        nothing."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if waiter.cancelled():
            if waiter in self.share.queued:
                self.share.queued.remove(waiter)
            if self.timed_out and not self.left:
                shares = self.owner.shares
                self.refuse(
                    f"this connection's calls waited {shares.write_timeout} s for one of its "
                    f"{shares.max_busy} turns; read the answers of the calls sent",
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                )
            return
        self.turn = True  # (handed over: counted by Shares)
        if self.left:
            self.computed(0)
            return
        budget = self.owner.budget
        if budget is not None:
            why = budget.enter(self.peer, self.held)
            if why is not None:
                self.refuse(why, grpc.StatusCode.RESOURCE_EXHAUSTED)
                return
            self.entered = True
        plane = self.owner.plane
        try:
            runner = plane.serving_runner(entry)  # (it may have changed while the call waited)
            inner = taken_runner(plane, entry, runner)
            if inner is None:
                raise HTTPError(503, f"model {entry.name!r} changed; retry", "not_ready")
        except Exception as exc:
            self.fail(exc)
            return
        deadline = self.deadline
        seconds = None if deadline is None else max(0.0, deadline - self.conn.loop.time())
        self.begin(entry, inner, request, seconds)

    def begin(self, entry: ModelEntry, inner: Any, request: Any, seconds: float | None) -> None:
        """Admit, decode and queue the request; its answer follows by callbacks."""
        plane = self.owner.plane
        refused = plane.admission.try_admit(entry.name, crowded=self.crowded)
        if refused is not None:
            self.refuse(refused)
            return
        self.entry = entry
        plane.enter_request(entry.name, entry.version)
        self.t0 = time.perf_counter()
        try:
            parsed = self.parsed = parse_model_infer_request(
                request, entry.inputs, entry.outputs, model=entry.name,
                regions=plane.shared_memory,
            )  # fmt: skip
            future: asyncio.Future[dict[str, Any]]
            if type(inner) is EnsembleRunner:  # its steps, each queued on its model's runner
                self.stream.task = submit_ensemble(plane, entry, inner, parsed, seconds, self.ran)
                return
            future, self.timer = direct.submit(plane, entry, inner, parsed, seconds)
        except Exception as exc:
            self.fail(exc)
            return
        self.stream.task = future
        if future.done():  # (run in place: answered with this read's flush, no turn later)
            self.ran(future)
        else:
            future.add_done_callback(self.ran)

    def ran(self, future: asyncio.Future[dict[str, Any]]) -> None:
        """The request's outputs (or failure) are in: answer."""
        if self.timer is not None:
            self.timer.cancel()
        if future.cancelled():  # the client reset the stream or left
            entry = self.entry
            if entry is not None:
                log.info("request_cancelled", model=entry.name)
            self.finish("cancelled", 0)
            self.computed(0)
            return
        exc = future.exception()
        if exc is not None:
            if not isinstance(exc, Exception):  # not an answer's error: as a task would die
                self.finish("internal", 0)
                self.computed(0)
                self.conn.reset(self.stream.id, 0x2)  # INTERNAL_ERROR
                raise exc
            self.fail(exc)
            return
        entry, parsed = self.entry, self.parsed
        assert entry is not None and parsed is not None
        results = future.result()
        try:
            framed = model_infer_response_bytes(
                entry.name, entry.version, parsed, results, entry.datatypes,
                specs=entry.outputs, framed=True,
            )  # fmt: skip
        except Exception as e:
            self.fail(e)
            return
        self.finish(None, samples_of(entry, parsed.inputs, results))
        why = self.computed(len(framed) - 5)
        if why is not None:
            self.send_status(grpc.StatusCode.RESOURCE_EXHAUSTED, why)
            return
        self.answer(framed, START_HEADERS, OK)

    def fail(self, exc: Exception) -> None:
        """Answer ``exc`` in Triton's words (counted and logged as the servicer does)."""
        reason = status_of(exc)[1]
        self.queue_full = isinstance(exc, QueueFullError) and reason == "queue_full"
        deadline = self.deadline
        if (
            isinstance(exc, RequestTimeoutError)
            and deadline is not None
            and self.conn.loop.time() >= deadline - 1e-3
        ):  # the caller's deadline passed: as grpc says it
            code, message = grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"
        else:
            code, message = failure_status(exc, "ModelInfer")
        self.finish(reason, 0)
        self.computed(0)
        self.send_status(code, message)

    def refuse(self, message: str, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE) -> None:
        """Shed the call (admission's UNAVAILABLE, a budget's RESOURCE_EXHAUSTED): its refusal
        is held back while its connection has other calls open that are not refusals
        (:meth:`Shares.before_refusal`)."""
        self.computed(0)
        self.refused = True
        share = self.share
        if share.open - 1 - share.refusing <= 0:
            self.send_status(code, message)
            return
        self.stream.task = self.conn.loop.create_task(self._refuse_later(message, code))

    async def _refuse_later(self, message: str, code: grpc.StatusCode) -> None:
        await self.owner.shares.before_refusal(self.share)
        self.send_status(code, message)

    def finish(self, reason: str | None, samples: int) -> None:
        """The request is no longer in flight: statistics, metrics, admission, regions."""
        entry, self.entry = self.entry, None
        if entry is None:
            return
        plane = self.owner.plane
        parsed = self.parsed
        if parsed is not None and parsed.leases:
            parsed.release()  # its shared memory regions
        if reason is None:  # recorded with this turn's other successes, as HTTP's
            plane.finish_ok(entry, self.t0, samples)
        else:
            plane.finish_request(entry, reason, self.t0, samples)
        plane.admission.release(entry.name, queue_full=self.queue_full, crowded=self.crowded)

    def computed(self, answer_size: int) -> str | None:
        """Its turn is given back and the budget told its answer's size (0: none); why the
        answer is refused instead."""
        if not self.computing:
            return None
        self.computing = False
        owner = self.owner
        if self.turn:
            self.turn = False
            owner.shares.done(self.share)
        budget = owner.budget
        if budget is None or self.left or not self.entered:
            return None
        why = budget.computed(self.peer, answer_size)
        if why is None:
            self.held += answer_size
        return why

    def send_status(self, code: grpc.StatusCode, message: str) -> None:
        """End the call with ``code`` and ``message`` (trailers only)."""
        trailers = status_trailers(code, message)
        self.answer(b"", [(b"content-type", GRPC), *trailers], trailers)

    def answer(
        self, body: bytes, headers: list[tuple[bytes, bytes]], trailers: list[tuple[bytes, bytes]]
    ) -> None:
        """Send the answer; the call stays open until its stream ends (:meth:`closed`)."""
        if self.left:
            return
        self.sent = True
        self.owner.shares.answered(self.share)
        budget = self.owner.budget
        self.answered_at = now = self.conn.loop.time()
        if budget is not None:
            budget.hold_unsent(self, self.peer, now)
        if not self.stream.answer(headers, body, trailers, now=False):
            self.closed()

    def closed(self) -> None:
        """The stream ended: an unanswered call's request is cancelled (its rows never run);
        the call leaves its connection's share and the budget."""
        if self.left:
            return
        self.left = True
        owner = self.owner
        shares, budget = owner.shares, owner.budget
        if self.sent:
            shares.written(self.share, self.conn.loop.time() - self.answered_at)
            if budget is not None:
                budget.written(self)
        else:
            task = self.stream.task
            if task is not None and not task.done():
                task.cancel()  # its callback counts it
        if budget is not None and self.entered:
            if self.computing:  # (the budget counts it computed until its callback runs)
                budget.computed(self.peer, 0)
            budget.leave(self.peer, self.held)
        shares.end(self.share, refused=self.refused)

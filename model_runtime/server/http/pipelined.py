"""The part of a guarded connection that answers requests at the protocol level
(:mod:`model_runtime.server.http.fastpath`): it hands an admitted request to the fast path,
feeds it its body as it arrives, holds what the client pipelines meanwhile (read where it lies,
never copied per request; past :data:`_HOLD_LIMIT` the connection is not read), writes the
answer and reads on. :class:`~model_runtime.server.http.connection.GuardedConnection` is the
connection; this is a base of it, its state declared here and owned there."""

from __future__ import annotations

import asyncio
import contextvars
from typing import TYPE_CHECKING, Any

from aiohttp.web_protocol import RequestHandler

from model_runtime.server.http.held import HeldBytes

if TYPE_CHECKING:
    from model_runtime.server.http.fastpath import Answering
    from model_runtime.server.http.guard import Admitted, ConnectionGuard
    from model_runtime.server.inference.admission import ModelAdmission

__all__ = ["UNREAD", "HeadRead", "ProtocolLevelAnswers"]

#: What the fast path reads of an infer head: ``((model, version),
#: Inference-Header-Content-Length, X-Request-ID)`` (:meth:`FastInfer.read`; None: not one
#: for it).
HeadRead = tuple[tuple[str, str | None], str | None, str | None]
#: A head the fast path has not read yet.
UNREAD: HeadRead = (("", None), None, None)

_NEVER = float("inf")
#: Bytes held from a client while a request of its connection is answered at the protocol
#: level (a pipelining client): past it, its connection is not read until the answer is out.
_HOLD_LIMIT = 64 << 10


class ProtocolLevelAnswers:
    """Requests answered at the protocol level, for a guarded connection (see the module)."""

    # The state both parts of the connection read (set by GuardedConnection.__init__).
    __slots__ = (
        "_admitted",
        "_body",
        "_body_due",
        "_body_size",
        "_busy",
        "_closed",
        "_fast",
        "_fresh",
        "_guard",
        "_held",
        "_inner",
        "_last_head",
        "_last_plain",
        "_last_read",
        "_loop",
        "_paused",
        "_reserved",
        "_skip",
        "_transport",
        "_write_paused",
    )

    _guard: ConnectionGuard
    _inner: RequestHandler
    _transport: asyncio.Transport | None
    _loop: asyncio.AbstractEventLoop
    _admitted: Admitted | None
    _fast: Answering | None
    _held: HeldBytes
    _reserved: int
    _body: bytearray
    _body_due: asyncio.Future[bytearray] | None
    _body_size: int
    _busy: bool
    _fresh: bool
    _skip: int
    _paused: bool
    _closed: bool
    _write_paused: bool
    _last_head: bytes
    _last_plain: tuple[bytes, int, int]
    _last_read: HeadRead | None

    if TYPE_CHECKING:  # the connection's own

        def _withdraw(self) -> None: ...
        def _refuse(self, answer: bytes, present: int, head: tuple[bytes, int, int]) -> int: ...
        def _disarm(self) -> None: ...
        def _arm(self, seconds: float | None = None) -> float: ...
        def _receive(self, data: bytes, pos: int) -> None: ...
        def _refusal_done(self) -> None: ...

    def _answer_fast(self, data: bytes, pos: int, head: tuple[bytes, int, int] | None) -> int:
        """Hand the admitted request at ``data[pos:]`` to the guard's fast path if the path
        takes it (-1: its body is read here as it arrives, and what follows it is held until
        it is answered). Its body not in hand and past the memory budget, it is refused: the
        bytes taken (the rest of its body is skipped). Else 0: for aiohttp, its admission
        kept for it."""
        guard = self._guard
        fast = guard.fast
        if fast is None or head is None:
            return 0
        target, head_size, length = head
        start = pos + head_size
        end = start + length
        whole = end <= len(data)
        if not whole and not guard.budget.take(length):
            self._withdraw()
            guard.budget_log(limit=guard.budget.limit)
            return self._refuse(guard.budget_refusal, len(data) - pos, head)
        admitted: ModelAdmission = self._admitted  # type: ignore[assignment]  # at_head's
        # The rest of a body on its way: the request awaits it (fill_body).
        due: asyncio.Future[bytearray] | None = None if whole else self._loop.create_future()
        body = data[start:end] if due is None else due
        # The task runs from the loop's next turn (no eager task factory): the state below is
        # set before it can answer.
        if head is self._last_plain:  # the connection's last head: read once
            read = self._last_read
            if read is UNREAD:
                read = self._last_read = fast.read(target, data[pos:start])
        else:
            read = fast.read(target, data[pos:start])
        task = fast.start(self, target, read, body, admitted)
        if task is None:
            if not whole:
                guard.budget.give(length)
            return 0
        self._reserved = 0 if whole else length
        self._admitted = None  # the fast path leaves it
        self._fast = task
        self._busy = True
        self._fresh = False
        self._disarm()
        # aiohttp saw no request: its keep-alive close must not fire while this one runs.
        inner: Any = self._inner
        inner._next_keepalive_close_time = _NEVER
        self._guard.idle.pop(self, None)  # type: ignore[call-overload]  # (the connection)
        if not whole:
            self._body = bytearray(memoryview(data)[start:])
            self._body_size = length
            self._body_due = due
        elif end < len(data):  # the rest waits for the answer: held as it is, not copied
            self._held.put_back(data, end)
        return -1

    def _fill_body(self, data: bytes, pos: int) -> int:
        """Add ``data[pos:]`` to the body on its way; once it is whole, give it to the
        request awaiting it. Returns where what follows the body begins in ``data``."""
        due = self._body_due
        assert due is not None
        stop = pos + self._body_size - len(self._body)
        self._body += memoryview(data)[pos:stop]
        if len(self._body) < self._body_size:
            return len(data)
        self._body_due = None
        if not due.done():  # not given up on (its body timeout)
            due.set_result(self._body)
        self._body = bytearray()
        return stop

    def _hold(self, data: bytes, pos: int) -> None:
        """Keep ``data[pos:]`` until the request answered here is; past :data:`_HOLD_LIMIT`
        held, the connection is not read meanwhile."""
        self._held.add(data, pos)
        if self._held.size > _HOLD_LIMIT and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()  # again if aiohttp resumed it meanwhile

    def _read_held(self) -> None:
        """Read the bytes held, in order, until a request is answered here again (the rest
        waits for it) or the client does not take its answers (the rest waits for it to)."""
        held = self._held
        while held and not self._closed:
            if self._fast is not None and self._body_due is None:
                break
            if self._fast is None and self._write_paused:
                break
            if self._body_due is not None:
                data, pos = held.take()
                held.put_back(data, self._fill_body(data, pos))
            else:  # read outside the finished request's context (its request id)
                contextvars.Context().run(self._receive, *held.take_head())
        inner: Any = self._inner
        if self._paused and held.size <= _HOLD_LIMIT and not self._closed:
            self._paused = False
            if getattr(inner, "_buffer_paused", False):
                return  # aiohttp paused it too (its queue of requests is full): it resumes
            assert self._transport is not None
            self._transport.resume_reading()

    def fast_answer(self, answer: bytes | list[bytes], close: bool = False) -> None:
        """Write the answer of the request answered at the protocol level; ``close``: then
        close the connection (its body did not arrive in time: the stream is lost)."""
        transport = self._transport
        if self._closed or transport is None or transport.is_closing():
            return
        if isinstance(answer, bytes):
            transport.write(answer)
        else:
            transport.writelines(answer)
        if close:
            self._closed = True
            transport.close()  # connection_lost follows

    def fast_reply(self, answer: bytes | list[bytes]) -> None:
        """:meth:`fast_answer` then :meth:`fast_done`, in one call: the common end of a
        request answered here (its body all read, the connection kept)."""
        transport = self._transport
        if self._closed or transport is None or transport.is_closing():
            self.fast_done()
            return
        if isinstance(answer, bytes):
            transport.write(answer)
        else:
            transport.writelines(answer)
        self._fast = None
        self._busy = False
        if self._reserved:
            self._guard.budget.give(self._reserved)
            self._reserved = 0
        if self._body_due is not None:
            self._after_early_answer()
            return
        self._refusal_done()
        if self._held.size or self._paused:
            self._read_held()

    def fast_done(self) -> None:
        """The request answered at the protocol level is over: the connection is idle in
        keep-alive, and what arrived meanwhile is read now."""
        self._fast = None
        self._busy = False
        if self._reserved:
            self._guard.budget.give(self._reserved)
            self._reserved = 0
        transport = self._transport
        if self._closed or transport is None or transport.is_closing():
            return  # gone (connection_lost may still be queued): nothing held is read
        if self._body_due is not None:
            self._after_early_answer()
            return
        self._refusal_done()
        self._read_held()

    def _after_early_answer(self) -> None:
        """Answered before its body was all in: the rest is skipped as it comes, and must
        come within the header timeout, like a refused body."""
        self._skip = self._body_size - len(self._body)
        self._body_due, self._body = None, bytearray()
        self._arm()

"""One client connection of the daemon's HTTP server, behind its guard (DESIGN.md §11).

:class:`GuardedConnection` is the ``asyncio.Protocol`` of each connection: it stands in front of
aiohttp's own protocol for that connection and keeps what :mod:`.connections` describes for
the guard (:class:`~model_runtime.server.http.guard.ConnectionGuard`): the header and idle
timeouts (one lazily moved timer), its place among the idle keep-alive connections, the
HTTP/2 preface sniff, admission decided from a plain request head (a refusal answered from
prebuilt bytes, its body skipped as it arrives), and the admitted infer requests answered at
the protocol level (:mod:`.fastpath`), with the bytes that arrive meanwhile held until each is
answered so the connection keeps its order (:class:`~model_runtime.server.http.held.HeldBytes`,
read where they lie; past :data:`_HOLD_LIMIT` the connection is not read). While its client
does not take its answers (the write buffer past its high-water mark) what it sends is held
too, and past the write timeout the connection is closed. Everything else is handed to
aiohttp as it arrives; :class:`~model_runtime.server.http.heads.Framer` follows those bytes, so a
head is read here only where a message starts.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, cast

from aiohttp.web_protocol import RequestHandler

from model_runtime.server.http.heads import Framer, chunked_over_length, plain_head
from model_runtime.server.http.held import HeldBytes
from model_runtime.server.http.pipelined import _NEVER, UNREAD, HeadRead, ProtocolLevelAnswers

if TYPE_CHECKING:
    from model_runtime.server.http.fastpath import Answering
    from model_runtime.server.http.guard import Admitted, ConnectionGuard

__all__ = ["AIOHTTP_STATE", "H2_PREFACE", "GuardedConnection"]

#: The client connection preface of HTTP/2 (RFC 9113 §3.4) begins with this line.
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_H2_SNIFF = len(b"PRI * HTTP/2.0")
# An empty SETTINGS frame (the server preface), then GOAWAY(last stream 0, HTTP_1_1_REQUIRED).
_H2_REFUSAL = (
    b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
    + (8 + 38).to_bytes(3, "big")
    + b"\x07\x00\x00\x00\x00\x00"
    + b"\x00\x00\x00\x00\x00\x00\x00\x0d"
    + b"this port speaks HTTP/1.1, not HTTP/2."
)
#: The attributes of aiohttp's ``RequestHandler`` the guard reads (it writes only its
#: keep-alive clock, ``_next_keepalive_close_time`` and ``_keepalive_handle``);
#: :meth:`ConnectionGuard.protocol` checks they are there (if not, early refusals and the
#: protocol-level path are off and the middleware refuses).
AIOHTTP_STATE = (
    "_waiter",
    "_messages",
    "_request_count",
    "_request_in_progress",
    "_close",
    "_force_close",
    "_next_keepalive_close_time",
    "_keepalive_timeout",
    "_keepalive_handle",
    "_process_keepalive",
    "_buffer_paused",
)


class GuardedConnection(ProtocolLevelAnswers, asyncio.Protocol):
    """One client connection: aiohttp's protocol, behind the guard's checks."""

    __slots__ = (
        "_answered",
        "_deadline",
        "_finished",
        "_framer",
        "_payload",
        "_refused",
        "_sniff",
        "_timer",
        "_write_charged",
        "_write_timer",
    )

    def __init__(self, guard: ConnectionGuard, inner: RequestHandler) -> None:
        self._guard = guard
        self._inner = inner
        self._transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        # The connection closes at ``_deadline`` (loop time; never: inf). One timer, moved
        # lazily: a later deadline (every answer pushes it) costs a float, not a timer; a
        # timer that finds its deadline moved on re-arms for it.
        self._deadline = _NEVER
        self._timer: asyncio.TimerHandle | None = None
        self._busy = False
        self._refused = False
        self._sniff: bytes | None = b""  # the first bytes, until they rule out HTTP/2
        self._skip = 0  # body bytes of an early-refused request still to come (and drop)
        self._finished = 0  # requests that left the app (its middleware saw them end)
        self._payload: Any = None  # the body stream of the last of them
        # Where the bytes given to aiohttp end: a head read here must start at a boundary.
        self._framer = Framer()
        # Idle: its timer (if any) is the idle one, replaced by the header timeout at the
        # next byte. New connections are idle until they send something.
        self._fresh = True
        self._answered = False  # a request of it was answered here (then idle is not silent)
        self._admitted: Admitted | None = None  # the admission of the head given to aiohttp
        # A request answered at the protocol level (guard.fast): its task, and the bytes that
        # arrive meanwhile (read once it is answered, in order).
        self._fast: Answering | None = None
        self._held = HeldBytes()
        self._reserved = 0  # bytes of the memory budget its body holds
        # Its body while it arrives (the task awaits ``_body_due``), and the bytes still due.
        self._body = bytearray()
        self._body_due: asyncio.Future[bytearray] | None = None
        self._body_size = 0
        self._paused = False
        self._closed = False
        # The transport's write buffer is past its high-water mark since the timer was set.
        self._write_paused = False
        self._write_timer: asyncio.TimerHandle | None = None
        self._write_charged = 0  # its answers waiting, charged to the memory budget
        # The last plain head read here, what plain_head said of it and what the fast path
        # read of it (UNREAD: not yet).
        self._last_head = b"\0"
        self._last_plain: tuple[bytes, int, int] = (b"", 0, 0)
        self._last_read: HeadRead | None = UNREAD

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport = cast(asyncio.Transport, transport)  # uvloop's: no subclass
        guard = self._guard
        if len(guard.open) >= guard.high_water:
            guard.make_room(self._loop.time())
        if len(guard.open) >= guard.limit:
            self._refused = True
            guard.refused += 1
            guard.limit_log(limit=guard.limit)
            transport.write(guard.refusal)
            transport.close()
            return
        guard.open[self._inner] = self
        guard.idle[self] = self._loop.time()  # idle until its first request
        self._arm(guard.limits.keepalive_timeout)
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        pos = 0
        if self._body_due is not None:  # the body of the request answered here
            pos = self._fill_body(data, 0)
            if pos == len(data):
                return
        # Read once the request before is answered, and its client takes its answers: until
        # then aiohttp is not given more requests to answer either.
        if self._fast is not None or self._held.size or self._write_paused:
            self._hold(data, pos)
            return
        self._receive(data, pos)

    def _receive(self, data: bytes, pos: int) -> None:
        """Read ``data`` from ``pos`` (nothing before it is read or copied)."""
        if self._skip:
            if len(data) - pos <= self._skip:
                self._skip -= len(data) - pos
                if not self._skip:
                    self._refusal_done()
                return
            pos += self._skip
            self._skip = 0
            self._refusal_done()
        if self._sniff is not None:
            seen = self._sniff + (data[pos:] if pos else data)
            if H2_PREFACE[:_H2_SNIFF].startswith(seen[:_H2_SNIFF]):
                if len(seen) < _H2_SNIFF:
                    self._sniff = seen  # a prefix of the preface: wait for more
                    self._guard.idle.pop(self, None)
                    if self._fresh:
                        self._head_begins()
                    return
                self._refuse_http2()
                return
            self._sniff, data, pos = None, seen, 0
        plain = None  # data's plain head, once read here
        if self._guard.head_admission is not None:
            framer = self._framer
            while data.startswith(b"POST /", pos) and framer.at_boundary and self._quiet():
                # A client repeats its head: the same bytes as its last one are read as it
                # was (compared in place: no copy, no hash).
                last = self._last_head
                if data.startswith(last, pos):  # (b"\0" at first: no head starts so)
                    plain = self._last_plain
                    if plain[2] > self._guard.early_max_body:
                        plain = None
                else:
                    plain = plain_head(data, self._guard.early_max_body, pos)
                    if plain is not None:
                        self._last_head = data[pos : pos + plain[1]]
                        self._last_plain = plain
                        self._last_read = UNREAD
                taken = self._refuse_early(data, pos, plain)
                if not taken and self._admitted is not None:
                    taken = self._answer_fast(data, pos, plain)
                    if taken < 0:
                        return
                if not taken:
                    break
                pos, plain = pos + taken, None
            if pos == len(data):
                return
        if pos:
            data = data[pos:]  # for aiohttp: copied once, as it reads on from here
        if self._fresh:  # the first byte of a head (a whole one refused above needs no timer)
            self._head_begins()
        self._guard.idle.pop(self, None)  # the next request: not idle any more
        framer = self._framer
        if framer.at_boundary and (fixed := chunked_over_length(data)) is not None:
            data = fixed  # a chunked body with a Content-Length too: read as RFC 9112 says
        framer.feed(data, plain)
        # A head begun (not the rest of a body its answer did not wait for) must be complete
        # within the header timeout.
        if not self._busy and self._deadline == _NEVER and (framer.lost or framer.mid_head):
            self._arm()
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        if not self._refused:
            self._inner.eof_received()
        return None

    def connection_lost(self, exc: BaseException | None) -> None:
        self._closed = True
        self._stop_timer()
        self._write_done()
        self._held.clear()
        if self._fast is not None:
            self._fast.cancel()  # the client went away: so does its request
        self._withdraw()
        if self._refused:
            return
        self._guard.open.pop(self._inner, None)
        self._guard.idle.pop(self, None)
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        """The client does not take its answers as fast as they come: nothing more is
        answered here until it does, and it must within the write timeout."""
        if self._refused:
            return
        self._write_paused = True
        if self._write_timer is None:
            timeout = self._guard.limits.write_timeout
            self._write_timer = self._loop.call_later(timeout, self._write_expired)
        if self._transport is not None and not self._write_charged:
            self._write_charged = self._transport.get_write_buffer_size()
            self._guard.budget.charge(self._write_charged)
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._refused:
            return
        self._write_done()
        self._inner.resume_writing()
        if self._fast is None and self._held:
            self._read_held()

    def _write_done(self) -> None:
        """Its answers are taken (or dropped with it): the write timer stops, the budget is
        given back what they were charged."""
        self._write_paused = False
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        if self._write_charged:
            self._guard.budget.give(self._write_charged)
            self._write_charged = 0

    def _write_expired(self) -> None:
        """Answers not taken within the write timeout: the connection ends (its answers
        are dropped, not kept for a client that does not read them)."""
        self._write_timer = None
        if self._closed or not self._write_paused:
            return
        self._guard.write_timeouts += 1
        self._inner.force_close()
        if self._transport is not None:
            self._transport.abort()  # close() would wait for the buffer to drain

    # -- the header timeout --------------------------------------------------------------------

    def request_started(self) -> Admitted | None:
        """aiohttp's app took a request of this connection: the header timeout stops. Returns
        the admission its head was given, if any (the request carries it on)."""
        self._busy = True
        self._disarm()
        admitted, self._admitted = self._admitted, None
        return admitted

    def _withdraw(self) -> None:
        """An admission given to a head that never reached the app is given back."""
        if self._admitted is not None:
            admitted, self._admitted = self._admitted, None
            admitted.withdraw()

    def request_finished(self, payload: Any) -> None:
        self._busy = False
        self._finished += 1
        self._payload = payload
        if self._framer.mid_head and self._deadline == _NEVER:
            self._arm()  # the next head began while this request ran: it has the timeout
        idle = self._guard.idle
        idle.pop(self, None)
        idle[self] = self._loop.time()  # newest idle last: the oldest is closed first

    def is_idle(self) -> bool:
        """Waiting in keep-alive for a next request: answered, nothing sent since (aiohttp's
        own test before its keep-alive close: its handler awaits the next message)."""
        inner = self._inner
        waiter = inner._waiter
        return (
            not self._busy
            and waiter is not None
            and not waiter.done()
            and not inner._messages
            and self._transport is not None
            and not self._transport.get_write_buffer_size()
        )

    def close_idle(self) -> None:
        """Close this idle connection to make room (no request is lost: none is under way)."""
        self._stop_timer()
        self._guard.open.pop(self._inner, None)
        self._inner.force_close()  # closes the transport; connection_lost follows

    def head_began(self) -> float | None:
        """When (loop time) the head (or refused body) now under the header timeout began;
        None when none is."""
        if self._busy or self._deadline == _NEVER:
            return None
        return self._deadline - self._guard.limits.header_timeout

    def close_slow(self) -> None:
        """Close this connection, whose head is late, to make room near the limit."""
        self._stop_timer()
        self._guard.open.pop(self._inner, None)
        self._inner.force_close()  # closes the transport; connection_lost follows

    def _head_begins(self) -> None:
        """The first byte of a head on an idle connection: it must be complete within the
        header timeout (no longer the idle one)."""
        self._fresh = False
        self._arm()

    def _arm(self, seconds: float | None = None) -> float:
        """Close the connection unless a complete head comes within ``seconds`` (default: the
        header timeout). Returns the loop's time now."""
        loop = self._loop
        now = loop.time()
        guard = self._guard
        heads = guard.heads
        heads.pop(self, None)
        if seconds is None:
            seconds = guard.limits.header_timeout
            heads[self] = None  # a head (or a refused body) on its way: newest last
        self._deadline = deadline = now + seconds
        timer = self._timer
        if timer is not None:
            if timer.when() <= deadline:
                return now  # it fires first and re-arms for the deadline
            timer.cancel()
        self._timer = loop.call_at(deadline, self._expire)
        return now

    def _disarm(self) -> None:
        self._deadline = _NEVER  # a pending timer lapses when it fires
        self._guard.heads.pop(self, None)

    def _stop_timer(self) -> None:
        self._deadline = _NEVER
        self._guard.heads.pop(self, None)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        deadline = self._deadline
        if deadline == _NEVER:
            return
        if self._loop.time() < deadline:
            self._timer = self._loop.call_at(deadline, self._expire)
            return
        self._deadline = _NEVER
        self._guard.heads.pop(self, None)
        if not self._busy:
            if self._fresh:
                if not self._answered:  # after an answer: a keep-alive close, as aiohttp's
                    self._guard.idle_timeouts += 1
            else:
                self._guard.header_timeouts += 1
            self._inner.force_close()  # closes the transport; connection_lost follows

    # -- early refusals ----------------------------------------------------------------------

    def _quiet(self) -> bool:
        """Whether aiohttp holds no request of this connection: every head it parsed has left
        the app and been answered (``_request_in_progress`` ends after the response is
        written), the last one's body has all arrived, and it keeps the connection open. Then
        a response written here cannot overtake one of aiohttp's, and a new head is not the
        rest of a body. Reads aiohttp's protocol state: :data:`AIOHTTP_STATE` names what."""
        inner: Any = self._inner
        payload = self._payload
        return (
            not self._busy
            and inner._request_count == self._finished
            and not inner._request_in_progress
            and not inner._messages
            and not inner._close
            and not inner._force_close
            and (payload is None or payload.is_eof())
            # Answers not yet taken by the client: the next refusal waits its turn in aiohttp,
            # whose reading pauses (a client that sends and never reads holds no memory).
            and self._transport is not None
            and not self._transport.get_write_buffer_size()
        )

    def _refuse_early(self, data: bytes, pos: int, head: tuple[bytes, int, int] | None) -> int:
        """Decide on the head at ``data[pos:]`` if it is a plain one (``head``: what
        :func:`plain_head` said of it). Refused: answer it and return the bytes it takes (head
        and the body present; the rest of the body is skipped as it comes). Else 0: for
        aiohttp, with the admission it was given (if any) kept for it."""
        guard = self._guard
        assert guard.head_admission is not None
        if self._admitted is not None:
            self._withdraw()  # an earlier head's that never reached the app (aiohttp refused it)
        if head is None:
            return 0
        answer = guard.head_admission(head[0])
        if answer is None:
            return 0
        if not isinstance(answer, bytes):
            self._admitted = answer
            return 0
        self._guard.early_refused += 1
        return self._refuse(answer, len(data) - pos, head)

    def _refuse(self, answer: bytes, present: int, head: tuple[bytes, int, int]) -> int:
        """Answer the request of ``head`` with ``answer``; ``present``: its bytes in hand
        (from its head on). Returns those it takes: the rest of its body is skipped."""
        _, head_size, length = head
        assert self._transport is not None
        self._transport.write(answer)
        taken = head_size + length
        if taken <= present:
            self._refusal_done()
            return taken
        self._skip = taken - present
        self._fresh = False
        self._guard.idle.pop(self, None)  # not idle before its body is skipped
        self._arm()  # the body must come within the header timeout, like a head
        return present

    def _refusal_done(self) -> None:
        """A request answered here (refused early, its body skipped, or answered at the
        protocol level) is over: the connection is idle in keep-alive again, as after any
        answer."""
        now = self._arm(self._guard.limits.keepalive_timeout)  # idle until the next head
        self._fresh = True
        self._answered = True
        idle = self._guard.idle
        idle.pop(self, None)
        idle[self] = now
        inner: Any = self._inner  # aiohttp's keep-alive clock restarts, as after its answers
        close = inner._next_keepalive_close_time = now + inner._keepalive_timeout
        # ... and its timer with it: one that fired while a request ran here was put off to
        # never (see _answer_fast), and aiohttp arms no new one while it has one.
        handle = inner._keepalive_handle
        if handle is not None and handle.when() > close:
            handle.cancel()
            inner._keepalive_handle = self._loop.call_at(close, inner._process_keepalive)

    def _refuse_http2(self) -> None:
        self._sniff = None
        self._guard.http2_log(peer=_peer(self._transport))
        assert self._transport is not None
        self._transport.write(_H2_REFUSAL)
        self._inner.force_close()


def _peer(transport: asyncio.BaseTransport | None) -> str:
    peer = None if transport is None else transport.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else str(peer)

"""Admitted infer requests answered at the protocol level, without aiohttp.

The connection guard (:mod:`model_runtime.server.http.guard`) reads the plain head of a POST to
decide its admission; when it is an admitted infer request, :class:`FastInfer` answers it from
there: its body read by the connection as it arrives (408 past the body timeout, the
connection then closed), decoded, run and encoded by the data plane
(:meth:`DataPlane.answer_infer`), errors answered by :meth:`DataPlane.error_answer`, the same
access log line and request id as aiohttp's route, written straight to the transport. A client
that goes away cancels its request (499 in the access log). Everything else goes to aiohttp,
which answers alike: a head that is not plain (:func:`~model_runtime.server.http.heads.plain_head`),
a ``Content-Encoding``, a percent-encoded target, any route but infer, and every request while
inference is restricted. A connection keeps its order: what arrives after a request answered
here is read once its answer is written.
"""

from __future__ import annotations

import asyncio
import email.utils
import time
from functools import partial
from http import HTTPStatus
from typing import Any, Protocol

import orjson
import structlog

from model_runtime.server.http.access import REQUEST_ID_HEADER, log as access_log, new_request_id
from model_runtime.server.http.body import body_timeout
from model_runtime.server.http.fastcall import FastCall, FastConnection
from model_runtime.server.http.pipelined import UNREAD, HeadRead
from model_runtime.server.inference.accounting import THREAD_PARSE_BYTES
from model_runtime.server.inference.admission import QUEUE_FULL, ModelAdmission
from model_runtime.server.inference.plane import DataPlane
from model_runtime.server.tensors.binary import HEADER_LENGTH

__all__ = ["Answering", "FastInfer"]

_HEADER_LENGTH = HEADER_LENGTH.lower().encode()
_HEADER_LENGTH_NAME = HEADER_LENGTH.encode()
_REQUEST_ID = REQUEST_ID_HEADER.lower().encode()
_REQUEST_ID_NAME = REQUEST_ID_HEADER.encode()
_IDENTITY = b"identity"
_PHRASES = {s.value: s.phrase.encode() for s in HTTPStatus}
#: A written answer larger than this goes out as two buffers (head, body), not one copy.
_JOIN_BELOW = 64 << 10
#: A 200 answer's head is three pieces: its front (status, type, length, up to the request
#: id's value), made once per body length; the request id; its back (the binary data's
#: ``Inference-Header-Content-Length``, the date), made once per JSON length and second.
_FRONT = b"HTTP/1.1 200 OK\r\nContent-Type: application/%s\r\nContent-Length: %%d\r\n%s: "
_FRONT_JSON = _FRONT % (b"json", _REQUEST_ID_NAME)
_FRONT_BINARY = _FRONT % (b"octet-stream", _REQUEST_ID_NAME)
_BACK_JSON = b"\r\nDate: %s\r\n\r\n"
_BACK_BINARY = b"\r\n" + _HEADER_LENGTH_NAME + b": %d\r\nDate: %s\r\n\r\n"
#: The pieces kept (of each kind) before they are made afresh.
_PIECES_MAX = 256


class Answering(Protocol):
    """What answers a request taken here: the connection cancels it when its client goes."""

    def cancel(self) -> Any: ...


class _Date:
    """The ``Date`` header's value, made once per second (RFC 9110 §6.6.1)."""

    __slots__ = ("_second", "_value")

    def __init__(self) -> None:
        self._second = -1
        self._value = b""

    def __call__(self) -> bytes:
        now = time.time()
        second = int(now)
        if second != self._second:
            self._second = second
            self._value = email.utils.formatdate(now, usegmt=True).encode()
        return self._value


class FastInfer:
    """Answers admitted plain infer requests for one :class:`DataPlane` (see the module
    docstring). ``access_log``: one ``http_request`` line per request, as the middleware's."""

    __slots__ = (
        "_back_date",
        "_backs",
        "_date",
        "_fronts_binary",
        "_fronts_json",
        "_tasks",
        "access_log",
        "plane",
        "taken",
    )

    def __init__(self, plane: DataPlane, *, access_log: bool = True) -> None:
        self.plane = plane
        self.access_log = access_log
        self._date = _Date()
        # The 200 heads' pieces (see _FRONT): fronts by body length, backs by JSON length
        # (-1: all JSON) for the date they were made in.
        self._fronts_json: dict[int, bytes] = {}
        self._fronts_binary: dict[int, bytes] = {}
        self._backs: dict[int, bytes] = {}
        self._back_date = b""
        self._tasks: set[asyncio.Task[None]] = set()
        #: Requests answered here (the rest of the infer requests went to aiohttp).
        self.taken = 0

    @staticmethod
    def read(target: bytes, head: bytes) -> HeadRead | None:
        """What :meth:`start` needs of the plain ``head`` (blank line included) of a request
        for ``target``; None: not one for here (aiohttp's)."""
        read = _HEADS.get(head, UNREAD)
        if read is UNREAD:
            read = _read_head(target, head)
            if len(_HEADS) >= _HEADS_MAX:
                _HEADS.clear()
            _HEADS[head] = read
        return read

    def start(
        self,
        conn: FastConnection,
        target: bytes,
        read: HeadRead | None,
        body: bytes | asyncio.Future[bytearray],
        state: ModelAdmission,
    ) -> Answering | None:
        """Answer the request of a head (``read``: :meth:`read` of it) and ``body`` (all of
        it, or a future the connection sets once it is in: awaited within the body timeout)
        for ``target``, admitted as ``state`` (which it leaves when answered); its answer goes
        to ``conn``, then ``conn.fast_done()``. Returns what answers it (a :class:`FastCall`
        for a body in hand and a plain model, else a task), or None: not one for here
        (nothing was done; aiohttp takes it)."""
        if read is None:
            return None
        where, header_length, request_id = read
        self.taken += 1
        rid = new_request_id(request_id)
        if isinstance(body, bytes) and len(body) <= THREAD_PARSE_BYTES:
            call = FastCall(self, conn, target, rid, state)
            if call.begin(where, header_length, body):
                return call
        started = [False]
        coro = self._answer(conn, target, where, header_length, body, rid, state, started)
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)  # held until done (the loop keeps weak references only)
        task.add_done_callback(partial(self._done, conn, state, started))
        return task

    def hold(self, task: asyncio.Task[None]) -> None:
        """Keep ``task`` until it is done (the loop keeps weak references only)."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _done(
        self,
        conn: FastConnection,
        state: ModelAdmission,
        started: list[bool],
        task: asyncio.Task[None],
    ) -> None:
        """A task cancelled before its first step (its client reset as it was read) never ran
        ``_answer``'s cleanup: its admission is given back here, and the connection freed."""
        self._tasks.discard(task)
        if not started[0]:
            state.withdraw()
            conn.fast_done()

    async def _answer(
        self,
        conn: FastConnection,
        target: bytes,
        where: tuple[str, str | None],
        header_length: str | None,
        body: bytes | asyncio.Future[bytearray],
        rid: str,
        state: ModelAdmission,
        started: list[bool],
    ) -> None:
        started[0] = True
        plane = self.plane
        t0 = time.perf_counter()
        status = 500
        queue_full = close = False
        structlog.contextvars.bind_contextvars(request_id=rid)  # this task's own context
        try:
            try:
                entry = plane.entry(*where)
                runner = plane.serving_runner(entry)
                timeout = plane.options.body_timeout
                arrived = body if isinstance(body, bytes) else partial(_arrival, body, timeout)
                out, json_length = await plane.answer_infer(entry, runner, header_length, arrived)
                status = 200
                answer = self.ok_answer(out, json_length, rid)
            except Exception as exc:
                status, answer, close, queue_full = self.error_answer(exc, target, rid)
            conn.fast_answer(answer, close)
        except asyncio.CancelledError:
            status = 499  # the client went away (nginx's code, as the access log's)
            raise
        finally:
            self.leave(conn, state, target, rid, status, queue_full, t0)

    def ok_answer(self, out: bytes, json_length: int | None, rid: str) -> bytes | list[bytes]:
        """The 200 answer of body ``out`` (``json_length``: its JSON part's; None: all JSON)."""
        n = len(out)
        fronts = self._fronts_json if json_length is None else self._fronts_binary
        front = fronts.get(n)
        if front is None:
            front = self._front(fronts, n, json_length is None)
        date = self._date()
        if date is not self._back_date:  # a new second: the backs are made afresh
            self._backs.clear()
            self._back_date = date
        back = self._backs.get(-1 if json_length is None else json_length)
        if back is None:
            back = self._back(json_length, date)
        if n < _JOIN_BELOW:
            return b"".join((front, rid.encode(), back, out))
        return [b"".join((front, rid.encode(), back)), out]

    @staticmethod
    def _front(fronts: dict[int, bytes], n: int, json: bool) -> bytes:
        """The front of a 200 head for a body of ``n`` bytes, kept in ``fronts``."""
        if len(fronts) >= _PIECES_MAX:
            fronts.clear()
        front = fronts[n] = (_FRONT_JSON if json else _FRONT_BINARY) % n
        return front

    def _back(self, json_length: int | None, date: bytes) -> bytes:
        """The back of a 200 head (``json_length``: its binary data's JSON part; None: all
        JSON) at ``date``, kept for that second."""
        backs = self._backs
        if len(backs) >= _PIECES_MAX:
            backs.clear()
        if json_length is None:
            back = backs[-1] = _BACK_JSON % date
        else:
            back = backs[json_length] = _BACK_BINARY % (json_length, date)
        return back

    def error_answer(
        self, exc: Exception, target: bytes, rid: str
    ) -> tuple[int, bytes | list[bytes], bool, bool]:
        """The answer to ``exc`` (:meth:`DataPlane.error_answer`, logged as it says): its
        status, bytes, whether the connection closes after it, and whether it is a full
        queue's 503."""
        status, message, headers, close = self.plane.error_answer(exc, target.decode("latin-1"))
        queue_full = status == 503 and headers is not None and "Retry-After" in headers
        out = orjson.dumps({"error": message})
        extra = b"".join(
            b"%s: %s\r\n" % (k.encode("latin-1"), v.encode("latin-1"))
            for k, v in (headers or {}).items()
        )
        if close:  # its body was not all read: the connection ends with this answer
            extra += b"Connection: close\r\n"
        head = self._head(status, b"application/json", len(out), rid, extra)
        return status, head + out if len(out) < _JOIN_BELOW else [head, out], close, queue_full

    def leave(
        self,
        conn: FastConnection,
        state: ModelAdmission,
        target: bytes,
        rid: str,
        status: int,
        queue_full: bool,
        t0: float,
    ) -> None:
        """A request answered (or given up: 499) leaves its admission ``state``, has its
        access log line, and ``conn`` reads on."""
        try:
            if queue_full:
                state.refused[QUEUE_FULL].inc()
            admission = self.plane.admission
            state.leave(queue_full, admission.queue_delay, admission.capacity)
            if self.access_log:
                _log_request(target, status, t0, rid)
        finally:
            conn.fast_done()  # whatever the log did: the connection reads on

    def answered(
        self,
        conn: FastConnection,
        state: ModelAdmission,
        target: bytes,
        rid: str,
        out: bytes,
        json_length: int | None,
        t0: float,
    ) -> None:
        """:meth:`ok_answer` written to ``conn`` and :meth:`leave` with 200, in one call: the
        common end of a request answered by callbacks."""
        try:
            admission = self.plane.admission
            state.leave(False, admission.queue_delay, admission.capacity)
            if self.access_log:
                _log_request(target, 200, t0, rid)
        except BaseException:
            conn.fast_answer(self.ok_answer(out, json_length, rid))
            conn.fast_done()
            raise
        conn.fast_reply(self.ok_answer(out, json_length, rid))

    def _head(
        self, status: int, content_type: bytes, length: int, rid: str, extra: bytes = b""
    ) -> bytes:
        return (
            b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n"
            b"%s: %s\r\n%sDate: %s\r\n\r\n"
            % (
                status,
                _PHRASES.get(status, b""),
                content_type,
                length,
                _REQUEST_ID_NAME,
                rid.encode(),
                extra,
                self._date(),
            )
        )


#: What :func:`_read_head` read of each head (by its bytes: clients repeat theirs), emptied
#: when full.
_HEADS: dict[bytes, HeadRead | None] = {}
_HEADS_MAX = 512


def _read_head(target: bytes, head: bytes) -> HeadRead | None:
    """``((model, version), Inference-Header-Content-Length, X-Request-ID)`` of an infer
    request's plain ``head`` for ``target``; None: not one for here (aiohttp's)."""
    where = _model_version(target)
    if where is None:
        return None
    header_length = request_id = None
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        key = name.lower()
        # The first of a repeated header counts, as aiohttp's headers.get() reads it.
        if key == _HEADER_LENGTH:
            if header_length is None:
                header_length = value.strip(b" \t").decode("latin-1")
        elif key == _REQUEST_ID:
            if request_id is None:
                request_id = value.strip(b" \t").decode("latin-1")
        elif key == b"content-encoding" and value.strip(b" \t").lower() != _IDENTITY:
            return None  # aiohttp inflates it (or refuses it)
    return where, header_length, request_id


async def _arrival(body: asyncio.Future[bytearray], timeout: float | None) -> bytearray:
    """A body the connection is still reading, once it is all in, within ``timeout`` seconds.

    Raises:
        HTTPError: 408 past the timeout (aiohttp's route answers the same).
    """
    try:
        async with asyncio.timeout(timeout):
            return await body
    except TimeoutError:
        body.cancel()  # given up on: the connection drops the rest as it comes
        raise body_timeout(timeout) from None


def _model_version(target: bytes) -> tuple[str, str | None] | None:
    """``(model, version)`` of an infer URL without percent-encoding (None: aiohttp's)."""
    if b"%" in target or b"?" in target:
        return None
    parts = target[11:-6].split(b"/")  # /v2/models/ ... /infer: admission checked the shape
    try:
        if len(parts) == 1:
            return parts[0].decode(), None
        if not parts[2]:
            return None  # /versions//infer: aiohttp's route answers it (404)
        return parts[0].decode(), parts[2].decode()
    except UnicodeDecodeError:
        return None


def _log_request(target: bytes, status: int, t0: float, rid: str) -> None:
    """The access log line of a request answered on the fast path."""
    access_log.info(
        "http_request",
        method="POST",
        path=target.decode("latin-1"),
        status=status,
        duration_ms=round((time.perf_counter() - t0) * 1e3, 3),
        request_id=rid,
    )

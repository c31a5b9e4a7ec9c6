"""The gRPC service as an ASGI application, for a native HTTP/2 server (h2corn: :mod:`.h2server`).

:class:`GrpcApp` serves every method of Triton's ``GRPCInferenceService`` from the same method
handlers grpc.aio is given (``service_handlers`` of the servicer, unary ones under the
:class:`~.budget.CallBudget`): one port, every method. Each HTTP/2 stream is one call: the
method from ``:path``, the request message(s) read with :class:`~.framing.MessageReader` (a
message past ``max_message_size`` is refused RESOURCE_EXHAUSTED before it is buffered),
answers framed as gRPC messages and the status sent as trailers. For the handlers,
:class:`~.call.NativeContext` stands in for grpc.aio's context (``abort``, ``time_remaining``,
``peer``, ``invocation_metadata``).

What a call gets, as on grpc.aio: ``grpc-timeout`` bounds it (DEADLINE_EXCEEDED past it); a
client that resets its stream or leaves cancels it; restricted groups
(:mod:`~model_runtime.server.security.restrict`) are refused UNAVAILABLE before the handler
runs; ``gzip``/``deflate`` requests are inflated; an unknown method, or one whose name is not
UTF-8, is UNIMPLEMENTED for that call only; Triton's methods this server lacks say why. gRPC's
health service answers ``grpc.health.v1.Health/Check`` (:mod:`.health`). What a call is to
its handler and its transport: :mod:`.call`.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import structlog

from model_runtime.server.grpc.budget import CallBudget
from model_runtime.server.grpc.call import (
    GRPC,
    OK,
    SERVICE_PATH,
    START_HEADERS,
    STREAM_EXTENSION,
    NativeContext,
    Send,
    StreamExtension,
    header_of,
)
from model_runtime.server.grpc.framing import (
    CallEnded,
    GrpcAbort,
    MessageReader,
    frame,
    parse_timeout,
    status_trailers,
)
from model_runtime.server.grpc.health import HEALTH_PATH, health_check_handler
from model_runtime.server.grpc.rawsplit import split_raw_inputs
from model_runtime.server.grpc.service import UNSUPPORTED_METHODS
from model_runtime.server.grpc.shares import Connection, Shares
from model_runtime.server.inference.accounting import THREAD_PARSE_BYTES
from model_runtime.server.security.restrict import (
    RestrictionCounter,
    Restrictions,
    grpc_refusal,
)
from model_runtime.server.triton import grpc_service_pb2 as pb

__all__ = ["GrpcApp"]

log = structlog.get_logger(__name__)

#: The messages every answered unary call sends but its body (h2corn does not keep them).
_START = {"type": "http.response.start", "status": 200, "headers": START_HEADERS,
          "trailers": True}  # fmt: skip
_END = {"type": "http.response.trailers", "headers": OK}

Receive = Callable[[], Awaitable[dict[str, Any]]]


class GrpcApp:
    """The ASGI application of the gRPC listener (see the module docstring).

    ``handlers``: grpc's method handlers by method name; ``restrictions`` and ``counter``:
    the restricted groups and where refusals are counted; ``budget``: where a big message's
    bytes are counted before it is read (refused RESOURCE_EXHAUSTED past the budget);
    ``shares``: the calls open by connection (:mod:`.shares`: a cap per connection, refusals
    held back while a connection has other calls open).
    """

    def __init__(
        self,
        handlers: dict[str, Any],
        *,
        max_message_size: int,
        restrictions: Restrictions | None = None,
        counter: RestrictionCounter | None = None,
        budget: CallBudget | None = None,
        shares: Shares | None = None,
    ) -> None:
        self._handlers = handlers
        self._shares = shares
        ready = handlers.get("ServerReady")
        self._health = None if ready is None else health_check_handler(ready)
        self._budget = budget
        self._max = max_message_size
        self._restrictions = restrictions if restrictions else None
        self._counter = counter or RestrictionCounter()
        self.calls = 0

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        self.calls += 1
        extensions = scope.get("extensions")
        state = _Answer(send, extensions.get(STREAM_EXTENSION) if extensions else None)
        shares = self._shares
        if shares is None:
            await self._serve(scope, receive, state, None)
            return
        client = scope.get("client")
        conn = shares.start(tuple(client) if client else None)
        if conn is None:
            await state.end(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"this connection has {shares.max_streams} calls open (its limit)",
            )
            return
        refused = False
        try:
            refused = await self._serve(scope, receive, state, conn)
        finally:
            if not state.handed:
                shares.end(conn, refused=refused)

    async def _serve(
        self, scope: dict[str, Any], receive: Receive, state: _Answer, conn: Connection | None
    ) -> bool:
        """Serve one call; return whether it was refused."""
        refused = False
        try:
            await self._call(scope, receive, state, conn)
        except CallEnded:
            return False
        except GrpcAbort as exc:
            reader = state.reader
            if (
                conn is not None
                and (
                    exc.code is grpc.StatusCode.RESOURCE_EXHAUSTED  # a budget's refusal
                    or (state.context is not None and state.context.shed)
                )
                and self._shares is not None
                and not (reader is not None and reader.partial)  # its bytes would wait unread
            ):
                refused = True
                await self._shares.before_refusal(conn)
            await state.end(exc.code, exc.details)
        except Exception as exc:  # a handler's bug: that call's status, the server serves on
            log.error("grpc_call_failed", exc_info=exc)
            await state.end(grpc.StatusCode.UNKNOWN, f"Unexpected {type(exc).__name__}: {exc}")
        finally:
            if state.reader is not None:
                state.reader.close()
        if conn is not None and self._shares is not None:
            self._shares.answered(conn)  # counted open and unsent until written
            loop = asyncio.get_running_loop()
            answered = loop.time()
            if state.stream is not None:  # the transport says when the stream ends
                state.handed = True
                state.stream.on_end(
                    functools.partial(self._ended, self._shares, conn, loop, answered, refused)
                )
                return refused
            try:
                await _stream_end(receive, self._shares)
            finally:
                self._shares.written(conn, loop.time() - answered)
        return refused

    @staticmethod
    def _ended(shares: Shares, conn: Connection, loop: Any, answered: float, refused: bool) -> None:
        shares.written(conn, loop.time() - answered)
        shares.end(conn, refused=refused)

    async def _call(
        self, scope: dict[str, Any], receive: Receive, state: _Answer, conn: Connection | None
    ) -> None:
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        content_type = timeout = encoding = None
        for key, value in headers:
            if key == b"content-type":
                content_type = value
            elif key == b"grpc-timeout":
                timeout = value
            elif key == b"grpc-encoding":
                encoding = value
        if content_type is None or not content_type.startswith(GRPC):
            await state.send({"type": "http.response.start", "status": 415, "headers": []})
            await state.send({"type": "http.response.body", "body": b""})
            return
        handler, name = self._handler(scope.get("raw_path") or scope["path"].encode())
        if self._restrictions is not None:
            refused = grpc_refusal(self._restrictions, name, header_of(headers))
            if refused is not None:
                message, group = refused
                self._counter.refused("grpc", group)
                raise GrpcAbort(grpc.StatusCode.UNAVAILABLE, message)
        loop = asyncio.get_running_loop()
        seconds = parse_timeout(timeout)
        deadline = None if seconds is None else loop.time() + seconds
        client = scope.get("client")
        peer = f"ipv4:{client[0]}:{client[1]}" if client else "unknown"
        context = state.context = NativeContext(peer, headers, deadline, loop, conn)
        admit = None if self._budget is None else functools.partial(_admit, self._budget, peer)
        reader = state.reader = MessageReader(
            receive, self._max, None if encoding is None else encoding.decode("latin-1"), admit
        )
        if handler.request_streaming:
            await self._stream(handler, reader, context, deadline, state)
        elif conn is None or self._shares is None:
            await self._unary(handler, name, reader, context, deadline, state)
        else:
            shares = self._shares
            if not await shares.turn(conn):
                raise GrpcAbort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"this connection's calls waited {shares.write_timeout} s for one of its "
                    f"{shares.max_busy} turns; read the answers of the calls sent",
                )
            try:
                await self._unary(handler, name, reader, context, deadline, state)
            finally:
                shares.done(conn)

    def _handler(self, path: bytes) -> tuple[Any, str]:
        if path.startswith(SERVICE_PATH):
            try:
                name = path[len(SERVICE_PATH) :].decode()
            except UnicodeDecodeError:
                name = ""
            handler = self._handlers.get(name)
            if handler is not None:
                return handler, name
            why = UNSUPPORTED_METHODS.get(name)
            if why is not None:
                raise GrpcAbort(grpc.StatusCode.UNIMPLEMENTED, why)
        elif path == HEALTH_PATH + b"Check" and self._health is not None:
            return self._health, "ServerReady"  # its API group (health) is ServerReady's
        raise GrpcAbort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")

    async def _unary(
        self,
        handler: Any,
        name: str,
        reader: MessageReader,
        context: NativeContext,
        deadline: float | None,
        state: _Answer,
    ) -> None:
        data = await reader.next()
        if data is None:
            raise GrpcAbort(grpc.StatusCode.INTERNAL, "the call has no request message")
        # Bytes the reader counted stay counted by it until the call ends (reader.close()).
        context.message_bytes = 0 if reader.counted else len(data)
        if len(data) < THREAD_PARSE_BYTES:
            request = _decode(handler, data)
        else:
            split = split_raw_inputs(pb.ModelInferRequest(), data) if name == "ModelInfer" else None
            if split is None:
                request = await asyncio.to_thread(_decode, handler, data)
            else:
                request, context.raw_inputs = split
        del data
        # A client that resets the stream or leaves while the call is computed cancels it:
        # h2corn cancels the call's task then (no watcher of ours is needed).
        if deadline is None:
            answer = await handler.unary_unary(request, context)
        else:
            answer = await _before(deadline, handler.unary_unary(request, context))
        serialize = handler.response_serializer
        body = frame(answer if serialize is None else serialize(answer))
        send = state.raw_send
        state.started = True
        if state.stream is not None:
            if not state.stream.answer(START_HEADERS, body, OK):
                raise CallEnded()
            return
        try:  # three sends, one frame of the wrappers (this is the hot path)
            await send(_START)
            await send({"type": "http.response.body", "body": body})
            await send(_END)
        except Exception as exc:
            raise CallEnded() from exc

    async def _stream(
        self,
        handler: Any,
        reader: MessageReader,
        context: NativeContext,
        deadline: float | None,
        state: _Answer,
    ) -> None:
        async def requests() -> AsyncIterator[Any]:
            while (data := await reader.next()) is not None:
                if len(data) < THREAD_PARSE_BYTES:
                    yield _decode(handler, data)
                else:
                    yield await asyncio.to_thread(_decode, handler, data)

        await state.send(
            {"type": "http.response.start", "status": 200, "headers": START_HEADERS,
             "trailers": True}
        )  # fmt: skip
        state.started = True

        async def answer_all() -> None:
            serialize = handler.response_serializer
            async for answer in handler.stream_stream(requests(), context):
                body = frame(serialize(answer))
                await state.send({"type": "http.response.body", "body": body, "more_body": True})

        if deadline is None:
            await answer_all()
        else:
            await _before(deadline, answer_all())
        await state.send({"type": "http.response.body", "body": b""})
        await state.send({"type": "http.response.trailers", "headers": OK})


class _Answer:
    """One call's side of the stream: what was sent, and its end with a status."""

    __slots__ = ("context", "handed", "raw_send", "reader", "started", "stream")

    def __init__(self, send: Send, stream: StreamExtension | None = None) -> None:
        self.raw_send = send
        self.stream = stream
        #: The stream's end is the transport's to report (``stream.on_end``).
        self.handed = False
        self.started = False
        self.reader: MessageReader | None = None
        self.context: NativeContext | None = None

    async def send(self, event: dict[str, Any]) -> None:
        """Send ``event`` on the stream.

        Raises:
            CallEnded: the stream is closed (the client reset it or left, or the server ended
                it: an answer stalled behind flow control past the write timeout).
        """
        try:
            await self.raw_send(event)
        except Exception as exc:
            raise CallEnded() from exc

    async def end(self, code: grpc.StatusCode, details: str) -> None:
        """End the call with ``code`` (trailers-only where nothing was sent yet)."""
        trailers = status_trailers(code, details)
        try:
            if not self.started:
                await self.send(
                    {"type": "http.response.start", "status": 200,
                     "headers": [(b"content-type", GRPC), *trailers], "trailers": True}
                )  # fmt: skip
                self.started = True
            await self.send({"type": "http.response.body", "body": b""})
            await self.send({"type": "http.response.trailers", "headers": trailers})
        except CallEnded:
            return


async def _stream_end(receive: Receive, shares: Shares | None) -> None:
    """Return when the call's stream ends (its answer written, or the stream reset or ended by
    the write timeout: h2corn's ``http.disconnect``), within the write timeout and a second;
    at once if its client is still sending (what it sends is not read)."""
    limit = 1.0 + (shares.write_timeout if shares is not None else 0.0)
    try:
        async with asyncio.timeout(limit):
            while True:
                event = await receive()
                if event["type"] != "http.request" or event.get("body"):
                    return
    except TimeoutError:
        return


def _admit(budget: CallBudget, peer: str, size: int) -> Callable[[], None]:
    why = budget.hold_message(peer, size)
    if why is not None:
        raise GrpcAbort(grpc.StatusCode.RESOURCE_EXHAUSTED, why)
    return functools.partial(budget.drop_message, size)


async def _before(deadline: float, work: Awaitable[Any]) -> Any:
    try:
        async with asyncio.timeout_at(deadline):
            return await work
    except TimeoutError:
        raise GrpcAbort(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None


def _decode(handler: Any, data: bytes) -> Any:
    deserialize = handler.request_deserializer
    if deserialize is None:  # a handler of the wire's bytes
        return data
    try:
        return deserialize(data)
    except Exception:
        raise GrpcAbort(grpc.StatusCode.INTERNAL, "Exception deserializing request!") from None

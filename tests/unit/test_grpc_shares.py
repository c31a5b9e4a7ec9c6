"""Each connection's share of the native gRPC listener (:mod:`.shares`): its calls open, the
turns of its unary calls, refusals held back while it has other calls open; driven directly
and through :class:`GrpcApp` as h2corn drives it (a stream ends with ``http.disconnect``)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from model_runtime.server.grpc.framing import frame
from model_runtime.server.grpc.native import GrpcApp
from model_runtime.server.grpc.shares import UNREAD_BUSY, Shares
from model_runtime.server.triton import grpc_service_pb2 as pb

pytestmark = pytest.mark.timeout(10)


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_a_connection_has_at_most_max_streams_calls_open() -> None:
    shares = Shares(max_streams=2, write_timeout=1)
    a, b = shares.start("a"), shares.start("a")
    assert a is not None and a is b and a.open == 2
    assert shares.start("a") is None  # refused, not counted
    assert shares.start("b") is not None  # another connection has its own
    shares.end(a)
    assert shares.start("a") is a
    shares.end(a)
    shares.end(a)
    assert "a" not in shares.connections  # forgotten once nothing is open


def test_a_connections_calls_take_turns_oldest_first() -> None:
    async def main() -> None:
        shares = Shares(max_streams=10, write_timeout=5, max_busy=2)
        conn = shares.start("c")
        assert conn is not None
        conn.reads = True  # a client that reads its answers
        assert await shares.turn(conn) and await shares.turn(conn)
        order: list[int] = []

        async def wait(i: int) -> None:
            assert await shares.turn(conn)
            order.append(i)

        tasks = [asyncio.create_task(wait(i)) for i in range(3)]
        await _settle()
        assert order == [] and conn.busy == 2  # both turns taken: the rest wait
        shares.done(conn)
        await _settle()
        assert order == [0]
        shares.done(conn)
        shares.done(conn)
        await asyncio.gather(*tasks)
        assert order == [0, 1, 2] and conn.busy == 2
        other = shares.start("d")
        assert other is not None and await shares.turn(other)  # not another's turns

    asyncio.run(main())


def test_a_call_that_waits_past_the_write_timeout_for_a_turn_is_refused() -> None:
    async def main() -> None:
        shares = Shares(max_streams=10, write_timeout=0.05, max_busy=1)
        conn = shares.start("c")
        assert conn is not None
        conn.reads = True
        assert await shares.turn(conn)
        assert not await shares.turn(conn)
        assert not conn.queued and conn.busy == 1

    asyncio.run(main())


def test_a_refusal_waits_for_another_call_of_its_connection_to_end() -> None:
    async def main() -> None:
        shares = Shares(max_streams=10, write_timeout=5)
        conn = shares.start("c")
        assert conn is not None
        await asyncio.wait_for(shares.before_refusal(conn), 1)  # nothing else open: at once
        shares.start("c")  # an answer its client has not read
        first = asyncio.create_task(shares.before_refusal(shares.start("c") or conn))
        second = asyncio.create_task(shares.before_refusal(shares.start("c") or conn))
        await _settle()
        assert not first.done() and not second.done() and conn.refusing == 2
        shares.end(conn)  # the unread answer's stream ends: one refusal goes
        await _settle()
        assert first.done() and not second.done()
        shares.end(conn, refused=True)  # a refusal ending wakes none (no chain of refusals)
        await _settle()
        assert not second.done()
        shares.end(conn)  # the connection's first call ends: the second refusal goes
        await asyncio.wait_for(second, 1)
        assert conn.refusing == 0 and not conn.waiting

    asyncio.run(main())


def test_a_held_refusal_goes_within_the_write_timeout() -> None:
    async def main() -> None:
        shares = Shares(max_streams=10, write_timeout=0.2)
        conn = shares.start("c")
        assert conn is not None and shares.start("c") is conn
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await shares.before_refusal(conn)
        assert 0.1 - 0.01 <= loop.time() - t0 <= 0.2 + 0.1  # half to all of it
        assert conn.refusing == 0 and not conn.waiting

    asyncio.run(main())


class Stream:
    """One call's stream as h2corn gives it: its message, then nothing until ``close()``
    (``http.disconnect``: its answer written, or the stream reset)."""

    def __init__(self, message: bytes) -> None:
        self.chunks = [message]
        self.closed = asyncio.Event()
        self.sent: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        if self.chunks:
            return {"type": "http.request", "body": self.chunks.pop(), "more_body": False}
        await self.closed.wait()
        return {"type": "http.disconnect"}

    async def send(self, event: dict[str, Any]) -> None:
        self.sent.append(event)

    def status(self) -> int | None:
        for event in self.sent:
            if event["type"] == "http.response.trailers":
                return int(dict(event["headers"])[b"grpc-status"])
        return None


async def _infer(request: Any, context: Any) -> Any:
    if request.model_name == "busy":  # admission sheds it, as the servicer does
        context.mark_shed()
        await context.abort(grpc.StatusCode.UNAVAILABLE, "over its admission limit")
    if request.model_name == "late":  # a queue policy's answer: sent when due
        await context.abort(grpc.StatusCode.UNAVAILABLE, "Request timeout expired")
    return pb.ModelInferResponse(model_name=request.model_name)


def test_through_the_app_an_unread_answer_holds_back_its_connections_refusals() -> None:
    handlers = {
        "ModelInfer": grpc.unary_unary_rpc_method_handler(
            _infer, pb.ModelInferRequest.FromString, pb.ModelInferResponse.SerializeToString
        )
    }

    async def main() -> None:
        shares = Shares(max_streams=10, write_timeout=5)
        app = GrpcApp(handlers, max_message_size=1 << 20, shares=shares)

        def call(model: str, client: tuple[str, int]) -> tuple[Stream, asyncio.Task[None]]:
            stream = Stream(frame(pb.ModelInferRequest(model_name=model).SerializeToString()))
            scope = {
                "type": "http",
                "path": "",
                "raw_path": b"/inference.GRPCInferenceService/ModelInfer",
                "headers": [(b"content-type", b"application/grpc")],
                "client": client,
            }
            return stream, asyncio.create_task(app(scope, stream.receive, stream.send))

        unread, answered = call("m", ("127.0.0.1", 1))
        await _settle()
        assert unread.status() == 0 and not answered.done()  # open until its stream ends
        assert shares.connections[("127.0.0.1", 1)].open == 1
        refused, refusing = call("busy", ("127.0.0.1", 1))
        alone, alone_task = call("busy", ("127.0.0.1", 2))  # another connection
        alone.closed.set()
        await asyncio.wait_for(alone_task, 1)
        assert alone.status() == grpc.StatusCode.UNAVAILABLE.value[0]  # at once
        assert refused.status() is None  # held back while the unread answer waits
        late, late_task = call("late", ("127.0.0.1", 1))
        late.closed.set()
        await asyncio.wait_for(late_task, 1)
        assert late.status() == grpc.StatusCode.UNAVAILABLE.value[0]  # not shed: at once
        unread.closed.set()
        await asyncio.wait_for(answered, 1)
        await _settle()
        assert refused.status() == grpc.StatusCode.UNAVAILABLE.value[0]
        refused.closed.set()
        await asyncio.wait_for(refusing, 1)
        assert not shares.connections

    asyncio.run(main())


def test_a_connection_that_does_not_read_its_answers_has_few_calls_computed_at_once() -> None:
    async def main() -> None:
        shares = Shares(max_streams=100, write_timeout=5, max_busy=8)
        conn = shares.start("c")
        assert conn is not None
        conn.reads = True
        for _ in range(8):
            shares.answered(conn)  # answers its client has not read
        for _ in range(UNREAD_BUSY):
            assert await asyncio.wait_for(shares.turn(conn), 1)
        late = asyncio.create_task(shares.turn(conn))
        await _settle()
        assert not late.done()  # UNREAD_BUSY turns, not max_busy
        shares.written(conn, 0.001)  # an answer is read: the turns are max_busy again
        await _settle()
        assert late.done() and late.result() and conn.busy == UNREAD_BUSY + 1

    asyncio.run(main())


def test_a_new_connection_has_few_turns_until_an_answer_of_it_is_written_in_time() -> None:
    async def main() -> None:
        shares = Shares(max_streams=100, write_timeout=2, max_busy=8)
        conn = shares.start("c")
        assert conn is not None
        for _ in range(UNREAD_BUSY):
            assert await asyncio.wait_for(shares.turn(conn), 1)
        late = asyncio.create_task(shares.turn(conn))
        await _settle()
        assert not late.done()
        shares.answered(conn)
        shares.written(conn, 1.5)  # ended only near the write timeout: not read
        await _settle()
        assert not late.done()
        shares.answered(conn)
        shares.written(conn, 0.01)  # written at once: a client that reads
        await _settle()
        assert late.done() and conn.busy == UNREAD_BUSY + 1

    asyncio.run(main())

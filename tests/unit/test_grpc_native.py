"""The native transport's gRPC over ASGI (:class:`GrpcApp`, :mod:`.framing`), driven as h2corn
drives it: each call a scope, the request body in chunks from ``receive``, what the app sends
recorded. What a client would see: the status and message trailers, the answers' frames."""

from __future__ import annotations

import asyncio
import gzip
import itertools
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from model_runtime.server.grpc.budget import CallBudget
from model_runtime.server.grpc.framing import GrpcAbort, MessageReader, frame, parse_timeout
from model_runtime.server.grpc.h2server import start_h2_listener
from model_runtime.server.grpc.health import HEALTH_PATH, HealthCheckRequest, HealthCheckResponse
from model_runtime.server.grpc.listensock import ListenerSettings
from model_runtime.server.grpc.native import GrpcApp
from model_runtime.server.security.restrict import GRPC_KEY_PREFIX, Restrictions
from model_runtime.server.triton import grpc_service_pb2 as pb

pytestmark = pytest.mark.timeout(10)

PATH = b"/inference.GRPCInferenceService/"


async def _echo(request: Any, context: Any) -> Any:
    if request.model_name == "fail":
        await context.abort(grpc.StatusCode.NOT_FOUND, "no model 'fail' \u2013 here")
    if request.model_name == "wait":
        await asyncio.Event().wait()
    return pb.ModelInferResponse(model_name=request.model_name, id=request.id)


async def _stream(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
    async for request in requests:
        yield pb.ModelStreamInferResponse(infer_response=pb.ModelInferResponse(id=request.id))


HANDLERS = {
    "ModelInfer": grpc.unary_unary_rpc_method_handler(
        _echo, pb.ModelInferRequest.FromString, pb.ModelInferResponse.SerializeToString
    ),
    "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(
        _stream, pb.ModelInferRequest.FromString, pb.ModelStreamInferResponse.SerializeToString
    ),
}


class Call:
    """One call through the app: ``chunks`` arrive one per ``receive()``, then the client
    waits (``disconnect``: it resets the stream instead)."""

    def __init__(self, chunks: list[bytes], *, disconnect: bool = False) -> None:
        self.chunks = list(chunks)
        self.reads = 0
        self.disconnect = disconnect
        self.sent: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        self.reads += 1
        if self.chunks:
            body = self.chunks.pop(0)
            return {"type": "http.request", "body": body, "more_body": bool(self.chunks)}
        if self.disconnect:
            return {"type": "http.disconnect"}
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def send(self, event: dict[str, Any]) -> None:
        self.sent.append(event)

    def status(self) -> tuple[int, str]:
        trailers = [e for e in self.sent if e["type"] == "http.response.trailers"]
        assert trailers, self.sent
        fields = dict(trailers[-1]["headers"])
        return int(fields[b"grpc-status"]), fields.get(b"grpc-message", b"").decode()

    def messages(self) -> list[bytes]:
        body = b"".join(e.get("body", b"") for e in self.sent if e["type"] == "http.response.body")
        out = []
        while body:
            n = int.from_bytes(body[1:5], "big")
            out.append(body[5 : 5 + n])
            body = body[5 + n :]
        return out


def run(
    app: GrpcApp,
    method: bytes,
    call: Call,
    headers: list[tuple[bytes, bytes]] | None = None,
    *,
    path: bytes | None = None,
) -> Call:
    scope = {
        "type": "http",
        "path": "",
        "raw_path": PATH + method if path is None else path,
        "headers": [(b"content-type", b"application/grpc"), *(headers or [])],
        "client": ("127.0.0.1", 5000),
    }
    asyncio.run(asyncio.wait_for(app(scope, call.receive, call.send), 5))
    return call


def app(**kw: Any) -> GrpcApp:
    return GrpcApp(HANDLERS, max_message_size=kw.pop("max_message_size", 1 << 20), **kw)


def request(name: str = "m", id_: str = "1") -> bytes:
    data: bytes = pb.ModelInferRequest(model_name=name, id=id_).SerializeToString()
    return data


def test_a_unary_call_is_answered_with_its_message_and_ok() -> None:
    # Split across chunks anywhere, the prefix included.
    data = frame(request(id_="a"))
    call = run(app(), b"ModelInfer", Call([data[:3], data[3:7], data[7:]]))
    assert call.status() == (0, "")
    (answer,) = call.messages()
    assert pb.ModelInferResponse.FromString(answer).id == "a"


def test_an_abort_is_the_status_and_a_percent_encoded_message() -> None:
    call = run(app(), b"ModelInfer", Call([frame(request("fail"))]))
    assert call.status() == (grpc.StatusCode.NOT_FOUND.value[0], "no model 'fail' %E2%80%93 here")


@pytest.mark.parametrize(
    ("method", "message"),
    [
        (b"Nope", "Method not found!"),
        (b"\xff\xfe", "Method not found!"),  # not UTF-8: that call only
    ],
)
def test_methods_not_served_are_unimplemented(method: bytes, message: str) -> None:
    call = run(app(), method, Call([frame(request())]))
    assert call.status() == (grpc.StatusCode.UNIMPLEMENTED.value[0], message)


def test_a_message_past_the_limit_is_refused_before_its_bytes_are_read() -> None:
    data = frame(b"x" * 5000)
    call = run(app(max_message_size=4096), b"ModelInfer", Call([data[:16], data[16:]]))
    assert call.status() == (8, "Received message larger than max (5000 vs. 4096)")
    assert call.reads == 1  # the rest was never taken from the stream


def test_a_big_message_past_the_bytes_budget_is_refused_before_its_bytes_are_read() -> None:
    budget = CallBudget(write_timeout=10, max_calls=10, max_bytes=40 << 10)
    data = frame(b"x" * (100 << 10))
    call = run(app(budget=budget), b"ModelInfer", Call([data[:16], data[16:]]))
    assert call.status()[0] == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    assert "bytes of calls in flight" in call.status()[1]
    assert call.reads == 1 and budget.refused_bytes == 1
    # Within it: counted while read, given back once handed to the call.
    data = frame(
        pb.ModelInferRequest(id="b", raw_input_contents=[b"x" * (70 << 10)]).SerializeToString()
    )
    call = run(app(budget=budget), b"ModelInfer", Call([data[:16], data[16:]]))
    assert call.status() == (0, "") and budget.bytes == 0


def test_gzip_requests_are_inflated_within_the_limit() -> None:
    packed = gzip.compress(request(id_="z"))
    data = b"\x01" + len(packed).to_bytes(4, "big") + packed
    call = run(app(), b"ModelInfer", Call([data]), [(b"grpc-encoding", b"gzip")])
    assert call.status()[0] == 0
    assert pb.ModelInferResponse.FromString(call.messages()[0]).id == "z"
    bomb = gzip.compress(b"\0" * (1 << 21))  # 2 MiB inflated, past the 1 MiB limit
    data = b"\x01" + len(bomb).to_bytes(4, "big") + bomb
    call = run(app(), b"ModelInfer", Call([data]), [(b"grpc-encoding", b"gzip")])
    assert call.status()[0] == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    call = run(app(), b"ModelInfer", Call([data]), [(b"grpc-encoding", b"br")])
    assert call.status()[0] == grpc.StatusCode.UNIMPLEMENTED.value[0]


def test_the_deadline_ends_the_call() -> None:
    call = run(app(), b"ModelInfer", Call([frame(request("wait"))]), [(b"grpc-timeout", b"20m")])
    assert call.status() == (grpc.StatusCode.DEADLINE_EXCEEDED.value[0], "Deadline Exceeded")


@pytest.mark.parametrize("leave", ["reset", "close"])
def test_a_client_that_resets_its_stream_or_leaves_cancels_the_call(leave: str) -> None:
    """Through h2corn on loopback, a grpcio client: the call being computed is cancelled as
    soon as its client resets the stream (``cancel()``) or closes the connection."""
    started = threading.Event()
    cancelled = asyncio.Event()

    async def wait(request: Any, context: Any) -> Any:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        raise AssertionError("unreachable")

    handlers = {
        "ModelInfer": grpc.unary_unary_rpc_method_handler(
            wait, pb.ModelInferRequest.FromString, pb.ModelInferResponse.SerializeToString
        )
    }

    def client(port: int) -> None:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        call = channel.unary_unary(
            PATH.decode() + "ModelInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelInferResponse.FromString,
        ).future(pb.ModelInferRequest(model_name="m"))
        assert started.wait(5)
        if leave == "reset":
            call.cancel()
        channel.close()

    async def main() -> float:
        settings = ListenerSettings(
            "127.0.0.1", 0, max_message_size=1 << 20, idle_timeout=30, max_streams=8,
            write_timeout=5, max_connections=8,
        )  # fmt: skip
        listener, port = await start_h2_listener(handlers, settings)
        try:
            await asyncio.to_thread(client, port)
            began = time.monotonic()
            await cancelled.wait()
            return time.monotonic() - began
        finally:
            await listener.stop(0)

    assert asyncio.run(asyncio.wait_for(main(), 8)) < 2.0  # at once, not at the bound


def test_restricted_groups_need_their_header() -> None:
    rules = Restrictions.parse(["inference:k=v"], kind="protocol", prefix=GRPC_KEY_PREFIX)
    call = run(app(restrictions=rules), b"ModelInfer", Call([frame(request())]))
    expected = f"This protocol is restricted, expecting header '{GRPC_KEY_PREFIX}k'"
    assert call.status() == (14, expected)
    header = [(GRPC_KEY_PREFIX.encode() + b"k", b"v")]
    call = run(app(restrictions=rules), b"ModelInfer", Call([frame(request())]), header)
    assert call.status() == (0, "")


def test_a_stream_answers_each_request_as_it_comes() -> None:
    data = frame(request(id_="1")) + frame(request(id_="2"))
    call = run(app(), b"ModelStreamInfer", Call([data[:20], data[20:]]))
    assert call.status() == (0, "")
    ids = [pb.ModelStreamInferResponse.FromString(m).infer_response.id for m in call.messages()]
    assert ids == ["1", "2"]


def test_grpc_timeout_values() -> None:
    assert parse_timeout(b"100m") == pytest.approx(0.1)
    assert parse_timeout(b"2S") == 2.0
    assert parse_timeout(None) is None
    with pytest.raises(GrpcAbort):
        parse_timeout(b"123456789S")


def test_a_stream_that_ends_inside_a_message_is_an_error() -> None:
    async def read() -> None:
        chunks = [frame(b"abcdef")[:7]]

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": chunks.pop(), "more_body": False}

        await MessageReader(receive, 100, None).next()

    with pytest.raises(GrpcAbort, match="ended in a message"):
        asyncio.run(read())


@pytest.mark.parametrize("cuts", [[], [3], [9], [12, 13], list(range(1, 40, 7))])
def test_messages_are_read_whole_and_in_order_however_the_body_is_cut(cuts: list[int]) -> None:
    zipped = gzip.compress(b"x" * 50)
    wire = frame(b"first") + frame(b"") + frame(b"third!")
    wire += b"\1" + len(zipped).to_bytes(4, "big") + zipped  # a compressed message
    bounds = [0, *cuts, len(wire)]
    chunks = [wire[a:b] for a, b in itertools.pairwise(bounds)]

    async def read() -> list[bytes | None]:
        call = Call(chunks, disconnect=True)
        reader = MessageReader(call.receive, 100, "gzip")
        return [await reader.next() for _ in range(5)]

    assert asyncio.run(read()) == [b"first", b"", b"third!", b"x" * 50, None]


def _health_app(ready: bool, **kw: Any) -> GrpcApp:
    async def server_ready(request: Any, context: Any) -> Any:
        return pb.ServerReadyResponse(ready=ready)

    handlers = {
        **HANDLERS,
        "ServerReady": grpc.unary_unary_rpc_method_handler(
            server_ready, pb.ServerReadyRequest.FromString, pb.ServerReadyResponse.SerializeToString
        ),
    }
    return GrpcApp(handlers, max_message_size=1 << 20, **kw)


@pytest.mark.parametrize(("ready", "status"), [(True, 1), (False, 2)])
def test_the_health_service_answers_the_server_readiness(ready: bool, status: int) -> None:
    check = frame(HealthCheckRequest(service="any").SerializeToString())
    call = run(_health_app(ready), b"", Call([check]), path=HEALTH_PATH + b"Check")
    assert call.status() == (0, "")
    assert HealthCheckResponse.FromString(call.messages()[0]).status == status  # SERVING: 1

    watch = run(_health_app(ready), b"", Call([check]), path=HEALTH_PATH + b"Watch")
    assert watch.status()[0] == grpc.StatusCode.UNIMPLEMENTED.value[0]


def test_the_health_service_is_in_the_health_group() -> None:
    restricted = _health_app(
        True,
        restrictions=Restrictions.parse(["health:who=me"], kind="protocol", prefix=GRPC_KEY_PREFIX),
    )
    check = frame(HealthCheckRequest().SerializeToString())
    call = run(restricted, b"", Call([check]), path=HEALTH_PATH + b"Check")
    assert call.status()[0] == grpc.StatusCode.UNAVAILABLE.value[0]
    header = [(GRPC_KEY_PREFIX.encode() + b"who", b"me")]
    call = run(restricted, b"", Call([check]), header, path=HEALTH_PATH + b"Check")
    assert HealthCheckResponse.FromString(call.messages()[0]).status == 1

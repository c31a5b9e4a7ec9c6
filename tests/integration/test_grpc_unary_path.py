"""ModelInfer by callbacks on the default gRPC transport (nghttp2, ``server/grpc/unary.py``),
through a real daemon: many calls in flight on one connection (more than its turns, so some
wait for one) all answered right and counted; a request whose DATA comes in a later read than
its HEADERS, and a big one sent in pieces, answered; a call reset in flight and a call whose
deadline passes while it waits for its turn do not stop the others."""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from model_runtime.server.triton import grpc_service_pb2 as pb
from tests.attack.grpc_wire import (
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    INFER_PATH,
    RST_STREAM,
    frame,
    frames_seen,
    grpc_headers,
    h2_connect,
    infer_message,
    literal,
)
from tests.integration.test_daemon_support import MODEL, Daemon, samples, start_daemon, stop_daemon

pytestmark = [pytest.mark.timeout(90)]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_daemon(tmp_path_factory.mktemp("unary_path"))
    yield d
    stop_daemon(d)


def _request(rows: int) -> pb.ModelInferRequest:
    pixels, _ = samples()
    data = pixels[:rows].astype(np.float32)
    request = pb.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="pixels", datatype="FP32", shape=list(data.shape))
    request.raw_input_contents.append(data.tobytes())
    return request


def _successes(daemon: Daemon) -> int:
    _, doc = daemon.get(f"/v2/models/{MODEL}/stats")
    return int(doc["model_stats"][0]["inference_stats"]["success"]["count"])


def test_many_calls_on_one_connection_are_all_answered_and_counted(daemon: Daemon) -> None:
    calls = 120  # past the connection's turns: the rest wait for one
    before = _successes(daemon)

    async def run() -> list[pb.ModelInferResponse]:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{daemon.grpc_port}") as channel:
            infer = channel.unary_unary(
                "/inference.GRPCInferenceService/ModelInfer",
                request_serializer=pb.ModelInferRequest.SerializeToString,
                response_deserializer=pb.ModelInferResponse.FromString,
            )
            pending = (infer(_request(1 + i % 3), timeout=30) for i in range(calls))
            return list(await asyncio.gather(*pending))

    answers = asyncio.run(run())
    for i, answer in enumerate(answers):
        assert answer.model_name == MODEL
        assert answer.outputs[0].shape[0] == 1 + i % 3
    assert _successes(daemon) - before == calls


def test_a_request_split_across_reads_is_answered(daemon: Daemon) -> None:
    headers = grpc_headers(INFER_PATH)
    small = infer_message(1)
    padded = _request(1)
    padded.id = "x" * (40 << 10)  # past what may wait unstarted: read as it comes
    body = padded.SerializeToString()
    big = b"\x00" + struct.pack(">I", len(body)) + body
    assert len(small) < 16 << 10 < len(big)
    sock = h2_connect(daemon.grpc_port, initial=frame(HEADERS, END_HEADERS, 1, headers))
    try:
        time.sleep(0.05)  # (its own read)
        sock.sendall(frame(DATA, END_STREAM, 1, small) + frame(HEADERS, END_HEADERS, 3, headers))
        for i in range(0, len(big), 8 << 10):
            end = END_STREAM if i + (8 << 10) >= len(big) else 0
            sock.sendall(frame(DATA, end, 3, big[i : i + (8 << 10)]))
            time.sleep(0.005)
        seen = frames_seen(sock, 3.0)
    finally:
        sock.close()
    assert (HEADERS, 1) in seen and (DATA, 1) in seen
    assert (HEADERS, 3) in seen and (DATA, 3) in seen


def test_each_header_block_is_read_for_its_own_calls(daemon: Daemon) -> None:
    """The fast path keeps its reading of a header block with the connection's cached block:
    a call whose block differs (a content type that is not gRPC's) on the same connection,
    between calls it takes, is not taken for theirs (the app answers it 415, no trailers)."""
    grpc_block = grpc_headers(INFER_PATH)
    plain = b"\x83\x86" + b"".join(
        literal(n, v)
        for n, v in [(b":path", INFER_PATH), (b":authority", b"x"),
                     (b"content-type", b"text/plain"), (b"te", b"trailers")]
    )  # fmt: skip
    message = infer_message(1)
    sock = h2_connect(daemon.grpc_port)
    try:
        for stream, block in ((1, grpc_block), (3, plain), (5, grpc_block)):
            sock.sendall(
                frame(HEADERS, END_HEADERS, stream, block)
                + frame(DATA, END_STREAM, stream, message)
            )
            time.sleep(0.05)  # (a read each)
        seen = frames_seen(sock, 2.0)
    finally:
        sock.close()
    # a gRPC answer: headers, message, trailers; the 415: one HEADERS (and an empty DATA)
    assert [seen.count((HEADERS, s)) for s in (1, 3, 5)] == [2, 1, 2]


def test_calls_reset_in_flight_leave_the_server_serving(daemon: Daemon) -> None:
    headers = grpc_headers(INFER_PATH)
    message = infer_message(8)
    opened = b"".join(
        frame(HEADERS, END_HEADERS, s, headers) + frame(DATA, END_STREAM, s, message)
        for s in range(1, 80, 2)
    )
    cancel = struct.pack(">I", 8)
    sock = h2_connect(daemon.grpc_port, initial=opened)
    try:
        sock.sendall(b"".join(frame(RST_STREAM, 0, s, cancel) for s in range(1, 80, 2)))
        frames_seen(sock, 0.3)
    finally:
        sock.close()
    with grpc.insecure_channel(f"127.0.0.1:{daemon.grpc_port}") as channel:
        infer = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelInferResponse.FromString,
        )
        assert infer(_request(2), timeout=10).model_name == MODEL
    # every call counted open on the connection has ended: nothing is left in flight
    _, doc = daemon.get(f"/v2/models/{MODEL}/stats")
    assert doc["model_stats"][0]["inference_stats"]["success"]["count"] > 0

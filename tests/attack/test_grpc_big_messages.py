"""Issue 41, attack 5: gRPC messages just under the message-size limit, many at once (the
issue's 16 x 60 MB, and 8 x 60 MB). Calls past the bytes budget are refused at once
(RESOURCE_EXHAUSTED) instead of held; but grpc.aio receives each message whole, in grpc's
buffers and then as a Python message, before any handler (or budget) sees it, and decodes it
on the event loop: the daemon's memory grows by the messages being received (8 x 60 MB: RSS
+1.9 GiB, HTTP p99 1 s on the 2-core test machine). Known to fail until the transport can
refuse bytes before they are buffered; run with --long."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import grpc
import pytest

from model_runtime.server.triton import grpc_service_pb2 as pb
from tests.attack.grpc_wire import MAX_RSS_GROWTH, Attack, assert_served, run_attack
from tests.integration.test_daemon_support import MODEL, Daemon, start_daemon, stop_daemon

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.slow,
    pytest.mark.long,
    pytest.mark.xfail(reason="grpc.aio buffers whole messages before a handler runs"),
]

MESSAGE = 60 << 20


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_daemon(tmp_path_factory.mktemp("big"))
    yield d
    stop_daemon(d)


def big_calls(daemon: Daemon, senders: int, codes: list[str]) -> Attack:
    """``senders`` clients, each sending MESSAGE-byte ModelInfer calls one after another."""
    body = pb.ModelInferRequest(
        model_name=MODEL,
        inputs=[
            pb.ModelInferRequest.InferInputTensor(name="pixels", datatype="FP32", shape=[1, 64])
        ],
        raw_input_contents=[b"\0" * MESSAGE],
    ).SerializeToString()

    def attack(stop: threading.Event, in_place: threading.Event) -> None:
        def send() -> None:
            options = [("grpc.max_send_message_length", -1)]
            with grpc.insecure_channel(f"127.0.0.1:{daemon.grpc_port}", options) as channel:
                call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
                while not stop.is_set():
                    try:
                        call(body, timeout=30)
                        codes.append("OK")
                    except grpc.RpcError as exc:
                        codes.append(exc.code().name)

        threads = [threading.Thread(target=send, daemon=True) for _ in range(senders)]
        for t in threads:
            t.start()
        in_place.set()
        for t in threads:
            t.join(60)

    return attack


@pytest.mark.parametrize("senders", [8, 16])
def test_big_messages_are_refused_past_the_budget_not_held(daemon: Daemon, senders: int) -> None:
    codes: list[str] = []
    client, growth = run_attack(daemon, big_calls(daemon, senders, codes), seconds=4.0)
    print({c: codes.count(c) for c in set(codes)}, f"RSS growth {growth >> 20} MiB")
    assert codes
    assert_served(client, growth, daemon)
    assert growth <= MAX_RSS_GROWTH

"""Issue 41, attack 5: gRPC messages just under the message-size limit, many at once (the
issue's 16 x 60 MB, and 8 x 60 MB), sent by another process (as an attacker on the host would:
in this one, its clients' copies of 60 MB under the GIL would slow the measured client, not the
daemon). The bytes in flight have a budget counted as a message is received: past it a call is
refused RESOURCE_EXHAUSTED when its length is known, before its bytes are read; an admitted one
is read into one buffer of its length and its tensors are views of it; run with --long."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from tests.attack.grpc_wire import MAX_RSS_GROWTH, Attack, assert_served, run_attack
from tests.integration.test_daemon_support import MODEL, Daemon, start_daemon, stop_daemon

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow, pytest.mark.long]

MESSAGE = 60 << 20

#: The attacker: ``senders`` threads, each sending MESSAGE-byte ModelInfer calls one after
#: another on its own channel until its stdin closes; prints "ready", then the codes' counts.
SENDERS = """
import collections, json, sys, threading
import grpc
from model_runtime.server.triton import grpc_service_pb2 as pb
port, senders, size, model = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
body = pb.ModelInferRequest(
    model_name=model,
    inputs=[pb.ModelInferRequest.InferInputTensor(name="pixels", datatype="FP32", shape=[1, 64])],
    raw_input_contents=[b"\\0" * size],
).SerializeToString()
codes, stop = collections.Counter(), threading.Event()
def send():
    options = [("grpc.max_send_message_length", -1)]
    with grpc.insecure_channel(f"127.0.0.1:{port}", options) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        while not stop.is_set():
            try:
                call(body, timeout=30)
                codes["OK"] += 1
            except grpc.RpcError as exc:
                codes[exc.code().name] += 1
threads = [threading.Thread(target=send, daemon=True) for _ in range(senders)]
for t in threads:
    t.start()
print("ready", flush=True)
sys.stdin.read()
stop.set()
for t in threads:
    t.join(60)
print(json.dumps(codes), flush=True)
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_daemon(tmp_path_factory.mktemp("big"))
    yield d
    stop_daemon(d)


def big_calls(daemon: Daemon, senders: int, codes: dict[str, int]) -> Attack:
    """``senders`` clients in another process, each sending MESSAGE-byte ModelInfer calls one
    after another; their status codes counted into ``codes``."""

    def attack(stop: threading.Event, in_place: threading.Event) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        args = [str(daemon.grpc_port), str(senders), str(MESSAGE), MODEL]
        with subprocess.Popen(
            [sys.executable, "-c", SENDERS, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        ) as proc:
            assert proc.stdin is not None and proc.stdout is not None
            try:
                assert proc.stdout.readline().strip() == "ready"
                in_place.set()
                stop.wait()
            finally:
                proc.stdin.close()
            codes.update(json.loads(proc.stdout.readline() or "{}"))
            proc.wait(60)

    return attack


@pytest.mark.parametrize("senders", [8, 16])
def test_big_messages_are_refused_past_the_budget_not_held(daemon: Daemon, senders: int) -> None:
    codes: dict[str, int] = {}
    client, growth = run_attack(daemon, big_calls(daemon, senders, codes), seconds=4.0)
    print(codes, f"RSS growth {growth >> 20} MiB")
    assert codes.get("RESOURCE_EXHAUSTED"), "nothing was refused past the budget"
    assert_served(client, growth, daemon)
    assert growth <= MAX_RSS_GROWTH

"""A closed loop is never refused, however slow the model (as Triton queues it): 48 clients,
each sending its next request when the last is answered, on a model whose every run takes
0.5 s (the fault plan's ``slow``), so what waits would take the replicas seconds to serve.
With the daemon's defaults every request is answered 200, over HTTP and gRPC; an open loop
past capacity is what admission refuses (tests/integration/test_daemon_overload.py)."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from test_daemon_support import MODEL, Daemon, infer_doc, running, samples
from tritonclient.utils import InferenceServerException

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

CLIENTS = 48
ROUNDS = 2


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with running(
        tmp_path_factory.mktemp("closed_loop"), "--fault-plan", "slow:every=1:seconds=0.5"
    ) as d:
        yield d


def _closed_loop(send: Callable[[], str], clients: int = CLIENTS) -> list[str]:
    """``clients`` threads, each calling ``send()`` ROUNDS times in a row; what each got."""
    got: list[str] = []

    def client() -> None:
        for _ in range(ROUNDS):
            got.append(send())

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got


def test_http_closed_loop_on_a_slow_model_is_served(daemon: Daemon) -> None:
    pixels, _ = samples()
    body = json.dumps(infer_doc(pixels[:1])).encode()
    local = threading.local()

    def send() -> str:
        if not hasattr(local, "conn"):
            local.conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=60)
        local.conn.request(
            "POST", f"/v2/models/{MODEL}/infer", body, {"Content-Type": "application/json"}
        )
        answer = local.conn.getresponse()
        text = answer.read()
        return "200" if answer.status == 200 else f"{answer.status} {text[:200]!r}"

    got = _closed_loop(send)
    assert [g for g in got if g != "200"] == []
    assert len(got) == CLIENTS * ROUNDS


def test_grpc_closed_loop_on_a_slow_model_is_served(daemon: Daemon) -> None:
    pixels, _ = samples()
    local = threading.local()

    def send() -> str:
        if not hasattr(local, "client"):
            local.client = grpcclient.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}")
        one = grpcclient.InferInput("pixels", [1, *pixels.shape[1:]], "FP32")
        one.set_data_from_numpy(np.ascontiguousarray(pixels[:1]))
        try:
            local.client.infer(MODEL, [one], client_timeout=60)
        except InferenceServerException as exc:
            return f"{exc.status()} {exc.message()[:200]}"
        return "OK"

    got = _closed_loop(send)
    assert [g for g in got if g != "OK"] == []

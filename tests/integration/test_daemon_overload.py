"""Overload at the real daemon, over loopback, with its defaults: once a model holds what it
can finish within its admission delay, a new infer request is refused before its body is read
or parsed (a 503 that names the model, with ``Retry-After``), counted, and logged as one
summary, never an access line per refusal; when the load goes, requests are served again.
gRPC requests are held to the same limit: one over it is UNAVAILABLE with the same message, and
the ones admitted are released when answered.

The load is held deterministically: requests whose body never finishes stay in flight at the
front end (reading their body), so the test fills the model's limit without timing anything.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from test_daemon_support import MODEL, Daemon, infer_doc, metric, running, samples, wait_for
from tritonclient.utils import InferenceServerException

pytestmark = [pytest.mark.timeout(60), pytest.mark.slow]
PATH = f"/v2/models/{MODEL}/infer"
MAX_HELD = 2000  # far above the limit measured here (~ a few hundred): the test's bound


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    # The defaults a user gets, but a tenth of the default admission delay: the limit (what
    # the model finishes within the delay) is then reached with tens of held requests, not
    # the thousand sockets the default would take. The rule under test is the same.
    with running(tmp_path_factory.mktemp("overload"), "--admission-delay", "0.1") as d:
        yield d


def _head(daemon: Daemon, length: int) -> bytes:
    return (
        f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1:{daemon.port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


def _connect(daemon: Daemon) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", daemon.port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # small writes, no 40 ms waits
    return sock


def _answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response with a Content-Length body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed after {data!r}"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    while len(body) < int(headers["content-length"]):
        body += sock.recv(65536)
    return int(lines[0].split(" ")[1]), headers, body


def _held(daemon: Daemon, body: bytes) -> socket.socket:
    """An infer request whose body stops one byte short: in flight until its socket closes."""
    sock = _connect(daemon)
    sock.sendall(_head(daemon, len(body)) + body[:-1])
    return sock


def _hold_until_refused(
    daemon: Daemon, body: bytes, probe: socket.socket, held: list[socket.socket]
) -> tuple[dict[str, str], dict[str, str]]:
    """Hold requests in flight (into ``held``) until ``probe`` is refused: the 503's headers
    and JSON body."""
    while len(held) < MAX_HELD:
        held.append(_held(daemon, body))
        # A body that is not JSON: admitted, it is parsed (400); refused, it is not (503).
        probe.sendall(_head(daemon, 10) + b"not json!!")
        status, headers, answer = _answer(probe)
        if status == 503:
            return headers, json.loads(answer)
        assert status == 400, answer
    raise AssertionError(f"no refusal with {len(held)} requests in flight")


def test_over_its_limit_a_request_is_refused_unread_counted_and_summarised(
    daemon: Daemon,
) -> None:
    pixels, _ = samples()
    doc = infer_doc(pixels[:1])
    body = json.dumps(doc).encode()
    for _ in range(30):  # the front end measures what the model finishes per second
        assert daemon.post(PATH, doc)[0] == 200
    probe = _connect(daemon)
    held: list[socket.socket] = []
    try:
        headers, doc_503 = _hold_until_refused(daemon, body, probe, held)
        assert headers["retry-after"] == "1"
        assert MODEL in doc_503["error"] and "admission limit" in doc_503["error"]
        refused_at = len(held)
        # Every further request is refused the same way, at once, on the same connection.
        t0 = time.monotonic()
        for _ in range(200):
            # Two bytes of the body are missing: the answer cannot have waited for the body.
            probe.sendall(_head(daemon, 10) + b"not json")
            status, _, again = _answer(probe)
            assert status == 503 and json.loads(again) == doc_503
            probe.sendall(b"!!")  # the rest, which the server discards (keep-alive)
        per_refusal = (time.monotonic() - t0) / 200
    finally:
        for sock in held:
            sock.close()
        probe.close()
    # The load is gone (the clients left): the model serves again.
    wait_for(lambda: daemon.post(PATH, doc)[0] == 200, 10, "service after the overload")
    _, text = daemon.get("/metrics")
    refused = metric(
        text, f'model_runtime_requests_refused_total{{model="{MODEL}",reason="overloaded"'
    )
    assert refused is not None and refused >= 201
    events = daemon.events()
    access = [e for e in events if e.get("event") == "http_request" and e["path"] == PATH]
    assert 503 not in {e["status"] for e in access}  # no line per refusal ...
    summaries = [e for e in events if e.get("event") == "requests_refused"]
    assert len(summaries) == 1 and summaries[0]["model"] == MODEL  # ... one summary per 10 s
    print(f"refused from {refused_at} in flight; {per_refusal * 1e6:.0f} us per refusal")


def _grpc_pixels(pixels: np.ndarray) -> list[grpcclient.InferInput]:
    inp = grpcclient.InferInput("pixels", list(pixels.shape), "FP32")
    inp.set_data_from_numpy(pixels)
    return [inp]


def test_grpc_requests_share_the_limit_and_are_released_when_answered(daemon: Daemon) -> None:
    pixels, _ = samples()
    doc = infer_doc(pixels[:1])
    body = json.dumps(doc).encode()
    inputs = _grpc_pixels(pixels[:1])
    with grpcclient.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}") as client:
        for _ in range(30):  # measured from gRPC and HTTP completions alike
            client.infer(MODEL, inputs)
            assert daemon.post(PATH, doc)[0] == 200
        _, before = daemon.get("/metrics")
        probe = _connect(daemon)
        held: list[socket.socket] = []
        try:
            _, doc_503 = _hold_until_refused(daemon, body, probe, held)
            # Over HTTP's limit, a gRPC request is over it too: refused before it is decoded.
            with pytest.raises(InferenceServerException) as refused:
                client.infer(MODEL, inputs)
            assert refused.value.status() == "StatusCode.UNAVAILABLE"
            assert refused.value.message() == doc_503["error"]
            limit = len(held)
        finally:
            for sock in held:
                sock.close()
            probe.close()
        wait_for(lambda: daemon.post(PATH, doc)[0] == 200, 10, "service after the overload")
        # Each admitted gRPC request leaves when answered: many times the limit, one at a
        # time, is never refused (a request never released would hold its place for good).
        for _ in range(4 * limit + 50):
            client.infer(MODEL, inputs)
        _, after = daemon.get("/metrics")
    line = f'model_runtime_requests_refused_total{{model="{MODEL}",reason="overloaded"'
    assert (metric(after, line) or 0) > (metric(before, line) or 0)
    # Refusals are summarised (requests_refused), never logged one by one as failures.
    assert not [e for e in daemon.events() if e.get("event") == "grpc_request_failed"]

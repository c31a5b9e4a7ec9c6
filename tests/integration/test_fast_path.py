"""Infer requests answered at the protocol level (model_runtime/server/http/fastpath.py) against the
real daemon: each is answered exactly as aiohttp's route answers the same request (status,
body, the headers a client reads), in order on a pipelining connection, logged and counted
like any other; a client that leaves mid-request costs nobody else anything.

The aiohttp route is reached with the same request made non-plain for the guard: the model's
name percent-encoded in the target (aiohttp decodes it; the protocol-level path leaves it)."""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Iterator

import numpy as np
import pytest
from test_daemon_support import (
    MODEL,
    Daemon,
    metric,
    read_raw_answer,
    samples,
    start_daemon,
    stop_daemon,
    wait_for,
)

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]
ATOL = 1e-4
FAST = "model_runtime_requests_answered_at_protocol_level_total"
#: Response headers a client reads (Date and Server are the server's own).
READ = ("content-type", "inference-header-content-length", "x-request-id", "retry-after")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_daemon(tmp_path_factory.mktemp("fast"))
    yield d
    stop_daemon(d)
    assert d.proc.returncode == 0


def _request(target: str, body: bytes, *headers: str) -> bytes:
    lines = [f"POST {target} HTTP/1.1", "Host: x", f"Content-Length: {len(body)}", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _exchange(daemon: Daemon, *requests: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """Write ``requests`` on one connection in one write (pipelined); read their answers."""
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=10) as sock:
        sock.sendall(b"".join(requests))
        buf = bytearray()
        return [read_raw_answer(sock, buf) for _ in requests]


def _fast_count(daemon: Daemon) -> float:
    status, text = daemon.get("/metrics")
    assert status == 200
    value = metric(text, FAST)
    assert value is not None, f"{FAST} is not in /metrics"
    return value


def _json_infer(pixels: np.ndarray, **extra: object) -> bytes:
    doc = {
        "inputs": [{"name": "pixels", "datatype": "FP32", "shape": list(pixels.shape),
                    "data": pixels.ravel().tolist()}],
        **extra,
    }  # fmt: skip
    return json.dumps(doc).encode()


def _binary_infer(pixels: np.ndarray) -> tuple[bytes, str]:
    header = json.dumps({
        "inputs": [{"name": "pixels", "datatype": "FP32", "shape": list(pixels.shape),
                    "parameters": {"binary_data_size": pixels.nbytes}}],
        "outputs": [{"name": "logits", "parameters": {"binary_data": True}}],
    }).encode()  # fmt: skip
    return header + pixels.astype(
        np.float32
    ).tobytes(), f"Inference-Header-Content-Length: {len(header)}"


def _cases() -> dict[str, tuple[str, bytes, tuple[str, ...]]]:
    """name -> (target suffix after the model name, body, extra headers)."""
    pixels, _ = samples()
    binary, binary_header = _binary_infer(pixels[:3])
    return {
        "json": ("/infer", _json_infer(pixels[:2]), ()),
        "binary": ("/infer", binary, (binary_header,)),
        "version": ("/versions/1/infer", _json_infer(pixels[:1]), ()),
        "unknown version": ("/versions/7/infer", _json_infer(pixels[:1]), ()),
        "bad datatype": ("/infer", _json_infer(pixels[:1]).replace(b"FP32", b"INT8"), ()),
        "bad json": ("/infer", b'{"inputs": [', ()),
        "bad header length": ("/infer", binary, ("Inference-Header-Content-Length: x",)),
        "header length past the body": (
            "/infer",
            binary,
            ("Inference-Header-Content-Length: 999999",),
        ),
        "unknown parameter": ("/infer", _json_infer(pixels[:1], parameters={"nope": 1}), ()),
    }


@pytest.mark.parametrize("case", list(_cases()))
def test_answered_at_the_protocol_level_exactly_as_aiohttp_answers(
    daemon: Daemon, case: str
) -> None:
    suffix, body, headers = _cases()[case]
    encoded = "%" + MODEL[0].encode().hex().upper() + MODEL[1:]  # aiohttp decodes it
    before = _fast_count(daemon)
    rid = f"case-{case.replace(' ', '-')}"
    (fast,) = _exchange(
        daemon, _request(f"/v2/models/{MODEL}{suffix}", body, f"X-Request-ID: {rid}", *headers)
    )
    assert _fast_count(daemon) == before + 1, "not answered at the protocol level"
    (slow,) = _exchange(
        daemon, _request(f"/v2/models/{encoded}{suffix}", body, f"X-Request-ID: {rid}", *headers)
    )
    assert _fast_count(daemon) == before + 1, "answered at the protocol level"
    assert fast[0] == slow[0], (fast, slow)
    assert fast[2] == slow[2]
    assert {k: fast[1].get(k) for k in READ} == {k: slow[1].get(k) for k in READ}
    assert fast[1]["x-request-id"] == rid
    assert "date" in fast[1]
    if case == "binary":
        _, logits = samples()
        json_length = int(fast[1]["inference-header-content-length"])
        got = np.frombuffer(fast[2][json_length:], dtype=np.float32).reshape(3, 10)
        np.testing.assert_allclose(got, logits[:3], atol=ATOL)


def test_pipelined_requests_are_answered_in_order(daemon: Daemon) -> None:
    pixels, logits = samples()
    before = _fast_count(daemon)
    target = f"/v2/models/{MODEL}/infer"
    answers = _exchange(
        daemon,
        *[
            _request(target, _json_infer(pixels[i : i + 1]), f"X-Request-ID: p{i}")
            for i in range(5)
        ],
    )
    assert [a[1]["x-request-id"] for a in answers] == [f"p{i}" for i in range(5)]
    for i, (status, _, body) in enumerate(answers):
        assert status == 200
        doc = json.loads(body)
        (out,) = [o for o in doc["outputs"] if o["name"] == "logits"]
        np.testing.assert_allclose(np.array(out["data"]), logits[i], atol=ATOL)
    assert _fast_count(daemon) == before + 5


def test_a_request_answered_at_the_protocol_level_is_logged_and_counted(daemon: Daemon) -> None:
    pixels, _ = samples()
    _, text = daemon.get("/metrics")
    served = metric(text, f'model_runtime_requests_total{{model="{MODEL}",outcome="success"')
    (answer,) = _exchange(
        daemon,
        _request(f"/v2/models/{MODEL}/infer", _json_infer(pixels[:1]), "X-Request-ID: logged-1"),
    )
    assert answer[0] == 200
    lines = [e for e in daemon.events() if e.get("request_id") == "logged-1"]
    assert [(e["event"], e["method"], e["path"], e["status"]) for e in lines] == [
        ("http_request", "POST", f"/v2/models/{MODEL}/infer", 200)
    ]
    _, text = daemon.get("/metrics")
    assert (
        metric(text, f'model_runtime_requests_total{{model="{MODEL}",outcome="success"')
        == (served or 0) + 1
    )


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon whose every device run first sleeps 0.3 s: a request stays in flight long
    enough to send more on its connection, or to leave, while it is answered."""
    d = start_daemon(tmp_path_factory.mktemp("slow"), "--fault-plan", "slow:every=1:seconds=0.3")
    yield d
    stop_daemon(d)


def _pending(daemon: Daemon) -> float:
    _, text = daemon.get("/metrics")
    return metric(text, f'model_runtime_pending_requests{{model="{MODEL}"') or 0.0


def test_bytes_that_arrive_while_a_request_is_answered_wait_their_turn(slow: Daemon) -> None:
    pixels, logits = samples()
    target = f"/v2/models/{MODEL}/infer"
    before = _fast_count(slow)
    with socket.create_connection(("127.0.0.1", slow.port), timeout=10) as sock:
        sock.sendall(_request(target, _json_infer(pixels[:1]), "X-Request-ID: first"))
        wait_for(lambda: _pending(slow) == 1, 10, "the first request to be in flight")
        sock.sendall(_request(target, _json_infer(pixels[1:2]), "X-Request-ID: second"))
        buf = bytearray()
        answers = [read_raw_answer(sock, buf) for _ in range(2)]
    assert [(a[0], a[1]["x-request-id"]) for a in answers] == [(200, "first"), (200, "second")]
    for i, (_, _, body) in enumerate(answers):
        (out,) = [o for o in json.loads(body)["outputs"] if o["name"] == "logits"]
        np.testing.assert_allclose(np.array(out["data"]), logits[i], atol=ATOL)
    assert _fast_count(slow) == before + 2


def test_a_client_that_leaves_mid_request_cancels_it_and_costs_others_nothing(
    slow: Daemon,
) -> None:
    pixels, logits = samples()
    request = _request(f"/v2/models/{MODEL}/infer", _json_infer(pixels[:1]), "X-Request-ID: gone")
    sock = socket.create_connection(("127.0.0.1", slow.port), timeout=10)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.sendall(request)
    wait_for(lambda: _pending(slow) == 1, 10, "the request to be in flight")
    sock.close()  # a reset while it is answered
    wait_for(lambda: _pending(slow) == 0, 10, "the request to be cancelled")
    gone = [e for e in slow.events() if e.get("request_id") == "gone"]
    assert [(e["event"], e["status"]) for e in gone if e["event"] == "http_request"] == [
        ("http_request", 499)
    ]
    (answer,) = _exchange(slow, _request(f"/v2/models/{MODEL}/infer", _json_infer(pixels[:1])))
    assert answer[0] == 200
    (out,) = [o for o in json.loads(answer[2])["outputs"] if o["name"] == "logits"]
    np.testing.assert_allclose(np.array(out["data"]), logits[0], atol=ATOL)


def test_a_bad_request_among_good_ones_in_one_read_fails_alone(daemon: Daemon) -> None:
    """Requests of one read, some of them bad (malformed JSON, a wrong datatype, an unknown
    model, a header length past the body): each bad one gets its own error, each good one its
    outputs, in order, and the connection serves on."""
    pixels, logits = samples()
    binary, binary_header = _binary_infer(pixels[3:4])
    target = f"/v2/models/{MODEL}/infer"
    int8 = _json_infer(pixels[:1]).replace(b"FP32", b"INT8")
    wanted = [
        (200, _request(target, _json_infer(pixels[0:1]), "X-Request-ID: a")),
        (400, _request(target, b'{"inputs": [', "X-Request-ID: b")),
        (200, _request(target, binary, binary_header, "X-Request-ID: c")),
        (400, _request(target, int8, "X-Request-ID: d")),
        (400, _request("/v2/models/nope/infer", _json_infer(pixels[:1]), "X-Request-ID: e")),
        (400, _request(target, binary, "Inference-Header-Content-Length: x", "X-Request-ID: f")),
        (200, _request(target, _json_infer(pixels[2:3]), "X-Request-ID: g")),
    ]  # fmt: skip
    answers = _exchange(daemon, *[r for _, r in wanted], *[r for _, r in wanted])
    assert [(a[0], a[1]["x-request-id"]) for a in answers] == 2 * [
        (status, rid) for (status, _), rid in zip(wanted, "abcdefg", strict=True)
    ]
    for status, _, body in answers:
        if status != 200:
            assert json.loads(body)["error"]  # each failure says why
    for i, row in ((0, 0), (6, 2), (7, 0), (13, 2)):  # the good JSON ones, both rounds
        (out,) = [o for o in json.loads(answers[i][2])["outputs"] if o["name"] == "logits"]
        np.testing.assert_allclose(np.array(out["data"]), logits[row], atol=ATOL)

"""Requests on which the protocol-level infer path (model_runtime/server/http/fastpath.py) answers
otherwise than aiohttp's route answers the same request, against the real daemon.

Each test sends the request twice on fresh connections: with the model's name plain in the
target (taken by the protocol-level path) and with its first letter percent-encoded (aiohttp
decodes it; the protocol-level path leaves it), and asks for the same answer. A fix may answer
these at the protocol level or hand them to aiohttp: either passes."""

from __future__ import annotations

import json
import random
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from test_daemon_support import (
    MODEL,
    Daemon,
    RawAnswer as Answer,
    metric,
    read_raw_answer,
    samples,
    start_daemon,
    stop_daemon,
)

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]
#: Response headers a client reads (Date and Server are the server's own).
READ = ("content-type", "inference-header-content-length", "x-request-id", "retry-after")
ENCODED = "%" + MODEL[0].encode().hex().upper() + MODEL[1:]  # aiohttp's route, not the fast path


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_daemon(tmp_path_factory.mktemp("attack"))
    yield d
    stop_daemon(d)


def _head(target: str, body: bytes, *headers: str, host: bool = True) -> bytes:
    lines = [f"POST {target} HTTP/1.1", *(["Host: x"] if host else [])]
    lines += [f"Content-Length: {len(body)}", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8") + body


def _ask(daemon: Daemon, request: bytes) -> Answer:
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=10) as sock:
        sock.sendall(request)
        return read_raw_answer(sock, bytearray())


def _both(daemon: Daemon, make: Callable[[str], bytes]) -> tuple[Answer, Answer]:
    """``make(model)`` -> request bytes; the answers with the name plain and encoded."""
    return _ask(daemon, make(MODEL)), _ask(daemon, make(ENCODED))


def _assert_same(fast: Answer, slow: Answer) -> None:
    assert (fast[0], fast[2][:300]) == (slow[0], slow[2][:300]), (fast, slow)
    assert {k: fast[1].get(k) for k in READ} == {k: slow[1].get(k) for k in READ}


def _json_infer(pixels: np.ndarray) -> bytes:
    doc = {"inputs": [{"name": "pixels", "datatype": "FP32", "shape": list(pixels.shape),
                       "data": pixels.ravel().tolist()}]}  # fmt: skip
    return json.dumps(doc).encode()


def _binary_infer(pixels: np.ndarray) -> tuple[bytes, int]:
    header = json.dumps({
        "inputs": [{"name": "pixels", "datatype": "FP32", "shape": list(pixels.shape),
                    "parameters": {"binary_data_size": pixels.nbytes}}],
        "outputs": [{"name": "logits", "parameters": {"binary_data": True}}],
    }).encode()  # fmt: skip
    return header + pixels.astype(np.float32).tobytes(), len(header)


# -- the same header twice: aiohttp's route reads the first, the fast path the last ---------------


def test_a_duplicate_inference_header_content_length_is_read_as_aiohttp_reads_it(
    daemon: Daemon,
) -> None:
    pixels, _ = samples()
    body, json_length = _binary_infer(pixels[:1])

    def make(model: str) -> bytes:
        return _head(
            f"/v2/models/{model}/infer",
            body,
            f"Inference-Header-Content-Length: {json_length}",
            "Inference-Header-Content-Length: 5",
            "X-Request-ID: dup-length",
        )

    _assert_same(*_both(daemon, make))


def test_a_duplicate_x_request_id_is_echoed_as_aiohttp_echoes_it(daemon: Daemon) -> None:
    pixels, _ = samples()
    body = _json_infer(pixels[:1])

    def make(model: str) -> bytes:
        return _head(f"/v2/models/{model}/infer", body, "X-Request-ID: one", "X-Request-ID: two")

    fast, slow = _both(daemon, make)
    assert fast[1]["x-request-id"] == slow[1]["x-request-id"], (fast[1], slow[1])


# -- targets and headers aiohttp's route does not serve ------------------------------------------


def test_an_empty_version_in_the_target_is_not_served(daemon: Daemon) -> None:
    """``/v2/models/m/versions//infer`` matches no route in aiohttp (404); the fast path took
    the empty version for "the one served" and answered 200."""
    pixels, _ = samples()
    body = _json_infer(pixels[:1])
    _assert_same(
        *_both(
            daemon,
            lambda m: _head(f"/v2/models/{m}/versions//infer", body, "X-Request-ID: empty-v"),
        )
    )


def test_an_empty_content_encoding_is_refused_as_aiohttp_refuses_it(daemon: Daemon) -> None:
    """aiohttp's route answers ``Content-Encoding:`` (empty) 501, an encoding Triton does not
    read; the fast path took it for identity and answered 200."""
    pixels, _ = samples()
    body = _json_infer(pixels[:1])
    _assert_same(
        *_both(
            daemon,
            lambda m: _head(
                f"/v2/models/{m}/infer", body, "Content-Encoding: ", "X-Request-ID: empty-ce"
            ),
        )
    )


def _bad_heads() -> dict[str, tuple[tuple[str, ...], bool, str]]:
    """name -> (extra header lines, whether a Host line is sent, what follows the model)."""
    many = tuple(f"X-Extra-{i}: a" for i in range(200))
    return {
        "no Host (RFC 9112 3.2: 400)": ((), False, "/infer"),
        "two Host lines": (("Host: y",), True, "/infer"),
        "a space in a header name": (("X Foo: bar",), True, "/infer"),
        "a parenthesis in a header name": (("X(Foo): bar",), True, "/infer"),
        "more headers than aiohttp takes": (many, True, "/infer"),
        "a tab in the target": ((), True, "/versions/1\t/infer"),
        "non-ASCII bytes in the target": ((), True, "/versions/\u0661/infer"),  # int() reads 1
    }


@pytest.mark.parametrize("case", list(_bad_heads()))
def test_a_head_aiohttp_rejects_is_not_answered_200(daemon: Daemon, case: str) -> None:
    """aiohttp's parser answers each of these 400; the fast path read them as plain and ran
    the request."""
    extra, host, suffix = _bad_heads()[case]
    pixels, _ = samples()
    body = _json_infer(pixels[:1])
    fast, slow = _both(daemon, lambda m: _head(f"/v2/models/{m}{suffix}", body, *extra, host=host))
    assert slow[0] == 400, slow
    assert fast[0] == slow[0], (fast, slow)


# -- aiohttp's keep-alive timer --------------------------------------------------------------------


@pytest.fixture
def short(tmp_path: Path) -> Iterator[Daemon]:
    """Keep-alive 0.3 s and device runs of 0.6 s: a request outlasts the keep-alive timeout
    (with the default 75 s, one that begins less than its own duration before the deadline
    does the same; this only makes it quick to reach). One test's own: at most two daemons
    run at once (the CPU device's lock), and each test below that starts one runs beside the
    module's ``daemon``."""
    d = start_daemon(
        tmp_path, "--keepalive-timeout", "0.3", "--fault-plan", "slow:every=1:seconds=0.6"
    )
    yield d
    stop_daemon(d)


@pytest.mark.parametrize("route", ["fast", "aiohttp"])
def test_a_request_in_flight_is_not_closed_by_the_keepalive_timeout(
    short: Daemon, route: str
) -> None:
    """aiohttp arms its keep-alive timer at connect and after each answer; it does not know
    of a request answered at the protocol level, sees the connection idle, and closes it
    under the request (the client gets no answer; the log says 499)."""
    pixels, logits = samples()
    model = MODEL if route == "fast" else ENCODED
    t0 = time.monotonic()
    answer = _ask(short, _head(f"/v2/models/{model}/infer", _json_infer(pixels[:1])))
    assert answer[0] == 200, answer
    assert time.monotonic() - t0 > 0.3  # it did outlast the keep-alive timeout
    (out,) = [o for o in json.loads(answer[2])["outputs"] if o["name"] == "logits"]
    np.testing.assert_allclose(np.array(out["data"]), logits[0], atol=1e-4)


# -- the guard's count of connections closed silent ----------------------------------------------


@pytest.fixture
def idle(tmp_path: Path) -> Iterator[Daemon]:
    """Keep-alive 0.5 s: a connection idle after its answer is closed soon (the default 75 s
    counts the same, only later). A test's own, as ``short``."""
    d = start_daemon(tmp_path, "--keepalive-timeout", "0.5")
    yield d
    stop_daemon(d)


def _silent_closed(daemon: Daemon) -> float:
    status, text = daemon.get("/metrics")
    assert status == 200
    value = metric(text, 'model_runtime_http_connections_closed_total{reason="silent"}')
    assert value is not None
    return value


def test_a_connection_idle_after_its_answer_is_not_counted_silent(idle: Daemon) -> None:
    """``model_runtime_http_connections_closed{reason="silent"}`` counts new connections that
    sent nothing; one answered at the protocol level, then idle for the keep-alive timeout,
    was counted there too (fast_done marks the connection fresh), one answered by aiohttp not."""
    pixels, _ = samples()
    for model in (ENCODED, MODEL):  # aiohttp's route, then the fast path
        before = _silent_closed(idle)
        with socket.create_connection(("127.0.0.1", idle.port), timeout=10) as sock:
            sock.sendall(_head(f"/v2/models/{model}/infer", _json_infer(pixels[:1])))
            assert read_raw_answer(sock, bytearray())[0] == 200
            assert sock.recv(1) == b"", "the idle connection was not closed"
        # The count is taken before the close (one loop callback): a scrape now sees it.
        assert _silent_closed(idle) == before, f"counted silent after {model}'s answer"


# -- aiohttp's route since the change ------------------------------------------------------------


def test_a_bad_header_length_on_aiohttps_route_leaves_no_coroutine_unawaited(
    daemon: Daemon,
) -> None:
    """``infer`` makes the ``read_body`` coroutine before ``answer_infer`` parses
    ``Inference-Header-Content-Length``; a bad one raises first and the coroutine is dropped:
    Python writes a ``RuntimeWarning`` (not JSON) into the daemon's JSON log."""
    pixels, _ = samples()
    body, _ = _binary_infer(pixels[:1])
    answer = _ask(
        daemon,
        _head(
            f"/v2/models/{ENCODED}/infer",
            body,
            "Inference-Header-Content-Length: x",
            "X-Request-ID: unawaited",
        ),
    )
    assert answer[0] == 400
    deadline = time.monotonic() + 10
    while not any(e.get("request_id") == "unawaited" for e in daemon.events()):
        assert time.monotonic() < deadline, "the request's access log line never came"
    assert "was never awaited" not in daemon.log_path.read_text(errors="replace")


# -- admission: a request taken at the protocol level always leaves ------------------------------


def test_clients_that_reset_with_a_request_held_do_not_leak_admission(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A client pipelines two infer requests and resets. When its first answer's task step
    and the reset fall in one loop iteration, ``fast_done`` hands the held second request to
    ``FastInfer.start`` (admitted: ``state.enter()``), then ``connection_lost`` cancels the new
    task before its first step: its coroutine never runs, so neither its ``finally``
    (``state.leave``, the access log line) nor anything else does. The model's front-end
    in-flight count keeps each such request for good; its rate, measured over time it looks
    busy, falls, and every request to it is refused 503 from then on (defaults; here after
    some 600 such clients and a few idle seconds)."""
    d = start_daemon(tmp_path_factory.mktemp("reset"))
    try:
        pixels, _ = samples()
        body = _json_infer(pixels[:1])
        target = f"/v2/models/{MODEL}/infer"
        two = _head(target, body, "X-Request-ID: reset-a") + _head(
            target, body, "X-Request-ID: reset-b"
        )
        before = _fast_taken(d)

        def client(n: int) -> None:
            rng = random.Random(n)
            for _ in range(n):
                sock = socket.create_connection(("127.0.0.1", d.port), timeout=5)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.sendall(two)
                until = time.perf_counter() + rng.uniform(0, 0.004)  # about one answer's time
                while time.perf_counter() < until:
                    pass
                sock.close()  # a reset

        threads = [threading.Thread(target=client, args=(200,)) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        taken = _fast_taken(d) - before
        # Every request taken at the protocol level ends with its access log line (200, or
        # 499 for a client gone); one without it never ran, and never left its admission.
        deadline = time.monotonic() + 10
        while True:
            logged = sum(
                1
                for e in d.events()
                if e.get("event") == "http_request"
                and str(e.get("request_id", "")).startswith("reset-")
            )
            if logged >= taken or time.monotonic() > deadline:
                break
        assert logged == taken, f"{taken - logged} of {taken} requests never ran"
        # What a user sees: the model keeps answering after idle spells.
        refused = []
        for _ in range(8):
            time.sleep(0.3)  # idle time, which the admission rate is measured over
            refused += [a for a in (_ask(d, _head(target, body)) for _ in range(12)) if a[0] != 200]
        assert not refused, refused[0]
    finally:
        stop_daemon(d)


def _fast_taken(daemon: Daemon) -> float:
    status, text = daemon.get("/metrics")
    assert status == 200
    value = metric(text, "model_runtime_requests_answered_at_protocol_level_total")
    assert value is not None
    return value

"""The heads of 200 answers on the protocol-level path (``FastInfer.ok_answer``), made of kept
pieces: each says its own body's length, request id, JSON length and the date of the second it
is written in, as a head made whole would."""

from __future__ import annotations

from typing import Any, cast

import pytest

from model_runtime.server.http.fastpath import FastInfer
from model_runtime.server.inference.plane import DataPlane

pytestmark = pytest.mark.timeout(10)


class _Clock:
    """The ``Date`` value, set by the test."""

    def __init__(self) -> None:
        self.value = b"Sun, 29 Nov 2026 11:00:00 GMT"

    def __call__(self) -> bytes:
        return self.value


def _fast() -> tuple[FastInfer, _Clock]:
    fast = FastInfer(cast(DataPlane, None), access_log=False)  # (heads need no plane)
    clock = _Clock()
    fast._date = cast(Any, clock)
    return fast, clock


def _head(answer: bytes | list[bytes]) -> tuple[bytes, dict[bytes, bytes], bytes]:
    """Status line, headers and body of one written answer."""
    whole = answer if isinstance(answer, bytes) else b"".join(answer)
    head, _, body = whole.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    headers = dict(line.split(b": ", 1) for line in lines)
    assert len(headers) == len(lines), "a header written twice"
    return status, headers, body


def test_each_answer_says_its_own_length_id_json_length_and_date() -> None:
    fast, clock = _fast()
    status, headers, body = _head(fast.ok_answer(b'{"a":1}', None, "r1"))
    assert status == b"HTTP/1.1 200 OK"
    assert headers == {
        b"Content-Type": b"application/json",
        b"Content-Length": b"7",
        b"X-Request-ID": b"r1",
        b"Date": clock.value,
    }
    assert body == b'{"a":1}'
    _, headers, body = _head(fast.ok_answer(b'{"b":2}xyzw', 7, "r2"))
    assert headers == {
        b"Content-Type": b"application/octet-stream",
        b"Content-Length": b"11",
        b"X-Request-ID": b"r2",
        b"Inference-Header-Content-Length": b"7",
        b"Date": clock.value,
    }
    assert body == b'{"b":2}xyzw'
    # Another length, another JSON length, of each kind: none takes a kept piece of another.
    _, headers, _ = _head(fast.ok_answer(b"{}", None, "r3"))
    assert (headers[b"Content-Length"], headers[b"X-Request-ID"]) == (b"2", b"r3")
    _, headers, _ = _head(fast.ok_answer(b'{"b":22}xyzw', 8, "r4"))
    assert headers[b"Content-Length"] == b"12"
    assert headers[b"Inference-Header-Content-Length"] == b"8"
    _, headers, _ = _head(fast.ok_answer(b'{"b":2}xyzw', 7, "r5"))
    assert headers[b"Inference-Header-Content-Length"] == b"7"
    _, headers, _ = _head(fast.ok_answer(b'{"c":33333}', None, "r6"))  # (as long as r2's)
    assert headers[b"Content-Type"] == b"application/json"
    assert b"Inference-Header-Content-Length" not in headers


def test_a_new_second_is_dated_anew() -> None:
    fast, clock = _fast()
    fast.ok_answer(b"{}", None, "r1")
    fast.ok_answer(b"{}ab", 2, "r2")
    clock.value = b"Sun, 29 Nov 2026 11:00:01 GMT"
    assert _head(fast.ok_answer(b"{}", None, "r3"))[1][b"Date"] == clock.value
    assert _head(fast.ok_answer(b"{}ab", 2, "r4"))[1][b"Date"] == clock.value


def test_a_large_body_is_written_apart_from_its_head() -> None:
    fast, _ = _fast()
    out = b"{}" + bytes(1 << 16)
    answer = fast.ok_answer(out, 2, "r1")
    assert isinstance(answer, list) and answer[1] is out  # not copied into the head
    assert _head(answer)[1][b"Content-Length"] == str(len(out)).encode()


def test_request_ids_are_the_clients_when_sane_else_new_16_hex_digits() -> None:
    from model_runtime.server.http.access import new_request_id

    assert new_request_id("client-7") == "client-7"
    made = [new_request_id(None), new_request_id("bad id\r\n"), new_request_id(None)]
    assert len(set(made)) == 3
    for rid in made:
        assert len(rid) == 16 and int(rid, 16) >= 0 and rid == rid.lower()

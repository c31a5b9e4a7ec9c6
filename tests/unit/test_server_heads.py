"""The plain request heads the connection guard reads itself (to refuse without aiohttp): what
is one, what is not (then aiohttp reads it), and no input that breaks the reader."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from model_runtime.server.http.heads import (
    MAX_HEAD_BYTES,
    Framer,
    chunked_over_length,
    plain_head,
)

pytestmark = pytest.mark.timeout(60)
MAX = 1 << 20


def _head(*lines: str, start: str = "POST /v2/models/m/infer HTTP/1.1") -> bytes:
    return ("\r\n".join([start, *lines]) + "\r\n\r\n").encode()


def test_a_plain_head_gives_target_head_size_and_body_size() -> None:
    head = _head("Host: x", "Content-Type: application/json", "Content-Length: 12")
    assert plain_head(head + b"{...body...}" + b"POST next", MAX) == (
        b"/v2/models/m/infer",
        len(head),
        12,
    )
    head = _head("host:x", "content-length:\t7 ")
    assert plain_head(head, MAX) == (b"/v2/models/m/infer", len(head), 7)


@pytest.mark.parametrize(
    "data",
    [
        _head("Host: x", "Content-Length: 3")[:-2],  # incomplete
        _head("Host: x"),  # no Content-Length
        _head("Content-Length: 3", "Content-Length: 3"),  # twice
        _head("Content-Length: +3"),
        _head("Content-Length: 3 4"),
        _head("Content-Length: 99999999999999999999"),
        _head(f"Content-Length: {MAX + 1}"),  # past the body limit: aiohttp answers 413
        _head("Content-Length: 3", "Transfer-Encoding: chunked"),
        _head("Content-Length: 3", "Expect: 100-continue"),
        _head("Content-Length: 3", "Upgrade: websocket"),
        _head("Content-Length: 3", "Connection: keep-alive, close"),
        _head("Content-Length : 3"),  # a blank before the colon
        _head(" Content-Length: 3"),  # obs-fold
        _head("Content-Length: 3", "no colon here"),
        _head("Content-Length: 3", start="POST /v2/models/m/infer HTTP/1.0"),
        _head("Content-Length: 3", start="post /v2/models/m/infer HTTP/1.1"),
        _head("Content-Length: 3", start="POST  /v2/models/m/infer HTTP/1.1"),
        _head("Content-Length: 3", start="GET /v2/models/m/infer HTTP/1.1"),
        _head("X: " + "y" * MAX_HEAD_BYTES, "Content-Length: 3"),  # too long
        _head("X: a\nTransfer-Encoding: chunked", "Content-Length: 3"),  # a bare LF
        _head("X: a\rb", "Content-Length: 3"),  # a bare CR
        _head("X: a\x00", "Content-Length: 3"),  # a control byte
        # What aiohttp's parser answers 400 (issue 31's attack): never read here.
        _head("Content-Length: 3"),  # no Host (RFC 9112 3.2)
        _head("Host: x", "Host: y", "Content-Length: 3"),  # two
        _head("Host: x", "X Foo: bar", "Content-Length: 3"),  # not a token
        _head("Host: x", "X(Foo): bar", "Content-Length: 3"),
        _head("Host: x", *[f"X-{i}: a" for i in range(64)], "Content-Length: 3"),  # too many
        _head(
            "Host: x", "Content-Length: 3", start="POST /v2/models/m/versions/1\t/infer HTTP/1.1"
        ),
        _head(
            "Host: x", "Content-Length: 3", start="POST /v2/models/m/versions/\u0661/infer HTTP/1.1"
        ),
    ],
)
def test_anything_else_is_left_to_aiohttp(data: bytes) -> None:
    assert plain_head(data, MAX) is None


@given(st.binary(max_size=600))
def test_no_bytes_break_the_reader(data: bytes) -> None:
    got = plain_head(data, MAX)
    if got is not None:
        target, head_size, body = got
        assert data[head_size - 4 : head_size] == b"\r\n\r\n"
        assert data.startswith(b"POST " + target + b" HTTP/1.1\r\n")
        assert 0 <= body <= MAX


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["content-length", "X-A", "Content-Type", "Connection", "Host"]),
            st.text(alphabet="0123456789 abcxyz,", max_size=8),
        ),
        max_size=5,
    ),
    st.binary(max_size=40),
)
def test_a_head_is_taken_only_with_one_content_length_of_digits(
    headers: list[tuple[str, str]], rest: bytes
) -> None:
    data = _head(*(f"{k}:{v}" for k, v in headers)) + rest
    got = plain_head(data, MAX)
    lengths = [v.strip(" ") for k, v in headers if k.lower() == "content-length"]
    closes = any(k == "Connection" and "close" in v for k, v in headers)
    hosts = sum(k == "Host" for k, _ in headers)
    plain = len(lengths) == 1 and lengths[0].isdigit() and len(lengths[0]) <= 18 and not closes
    plain = plain and hosts == 1
    assert (got is not None) == (plain and int(lengths[0]) <= MAX)
    if got is not None:
        assert got[2] == int(lengths[0])


_MESSAGES = st.sampled_from(
    [
        b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n",
        b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n{\r\n\r\n",
        b"POST /a HTTP/1.1\r\ncontent-length: 0\r\n\r\n",
        b"POST /b HTTP/1.0\r\nContent-Length: 3\r\nX: POST /c HTTP/1.1\r\n\r\nabc",
    ]
)


@given(st.lists(_MESSAGES, min_size=1, max_size=5), st.data())
def test_the_framer_knows_each_boundary_however_the_stream_is_cut(
    messages: list[bytes], data: st.DataObject
) -> None:
    stream = b"".join(messages)
    ends = {sum(len(m) for m in messages[: i + 1]) for i in range(len(messages))}
    cuts = sorted(data.draw(st.sets(st.integers(1, len(stream) - 1), max_size=6)))
    framer, told = Framer(), Framer()  # told: given what plain_head read, as the guard does
    for lo, hi in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        framer.feed(stream[lo:hi])
        assert framer.at_boundary == (hi in ends)
        told.feed(stream[lo:hi], plain_head(stream[lo:hi], MAX) if told.at_boundary else None)
        assert told.at_boundary == (hi in ends)


@given(st.binary(max_size=400), st.binary(max_size=100))
def test_no_bytes_break_the_framer_and_chunked_is_lost_for_good(junk: bytes, more: bytes) -> None:
    framer = Framer()
    framer.feed(junk)
    framer.feed(more)  # whatever it says, it says it without raising
    chunked = Framer()
    chunked.feed(b"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunked.feed(b"0\r\n\r\n" + junk)
    assert chunked.lost and not chunked.at_boundary


def test_a_head_read_before_is_held_to_each_callers_body_limit() -> None:
    head = b"POST /v2/models/m/infer HTTP/1.1\r\nHost: h\r\nContent-Length: 7\r\n\r\n"
    assert plain_head(head, MAX) == (b"/v2/models/m/infer", len(head), 7)
    assert plain_head(head, 6) is None  # the same bytes, a smaller limit
    assert plain_head(b"xx" + head, MAX, 2) == (b"/v2/models/m/infer", len(head), 7)


def test_a_chunked_head_with_a_content_length_is_read_by_its_chunks_then_closed() -> None:
    """L0_http test_content_encoding_chunked_manually: ``requests`` sends a body of bytes with
    the caller's ``Transfer-Encoding: chunked`` and its own ``Content-Length``. The transfer
    coding decides (RFC 9112 §6.3), the connection closes after the answer (no smuggling)."""
    body = b"3\r\nabc\r\n0\r\n\r\n"
    head = _head(
        "Host: x", "Content-Length: 13", "Transfer-Encoding: chunked", "Connection: keep-alive"
    )
    assert chunked_over_length(head + body) == (
        _head("Host: x", "Transfer-Encoding: chunked", "Connection: close") + body
    )
    both = _head("Host: x", "transfer-encoding: gzip, chunked", "content-length: 13")
    assert chunked_over_length(both) == _head(
        "Host: x", "transfer-encoding: gzip, chunked", "Connection: close"
    )
    for head in (
        _head("Host: x", "Transfer-Encoding: chunked"),  # no length to drop: aiohttp reads it
        _head("Host: x", "Content-Length: 13", "X-Note: chunked"),  # not chunked
        _head("Host: x", "Transfer-Encoding: chunked, gzip", "Content-Length: 13"),  # not last
        _head("Host: x", "Transfer-Encoding: chunked", "Content-Length: 13")[:-2],  # incomplete
    ):
        assert chunked_over_length(head) is None, head

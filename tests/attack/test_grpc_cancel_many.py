"""Rapid reset's limit on the nghttp2 transport counts what an attacker does, not what a client
whose deadline passed does: 200 calls open for a while and cancelled at once keep their
connection (no GOAWAY, the next call on it is answered), while 200 calls reset as soon as they
are opened end it (GOAWAY ENHANCE_YOUR_CALM). Real daemon, raw HTTP/2 frames."""

from __future__ import annotations

import struct
from collections.abc import Iterator

import pytest

from tests.attack.grpc_wire import (
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    INFER_PATH,
    RST_STREAM,
    frame,
    frames_seen,
    goaway_code,
    grpc_headers,
    h2_connect,
    infer_message,
)
from tests.integration.test_daemon_support import Daemon, start_daemon, stop_daemon

pytestmark = [pytest.mark.timeout(60)]

CALLS = 200
CANCEL = struct.pack(">I", 8)
ENHANCE_YOUR_CALM = 0xB


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_daemon(tmp_path_factory.mktemp("cancel_many"), "--grpc-transport", "nghttp2")
    yield d
    stop_daemon(d)


def _opened(first: int) -> tuple[list[int], bytes]:
    """The stream ids of CALLS calls whose request is still coming (headers, no end)."""
    ids = list(range(first, first + 2 * CALLS, 2))
    headers = grpc_headers(INFER_PATH)
    return ids, b"".join(frame(HEADERS, END_HEADERS, s, headers) for s in ids)


def _resets(ids: list[int]) -> bytes:
    return b"".join(frame(RST_STREAM, 0, s, CANCEL) for s in ids)


def test_a_client_cancelling_its_calls_at_once_keeps_its_connection(daemon: Daemon) -> None:
    ids, opened = _opened(1)
    sock = h2_connect(daemon.grpc_port, initial=opened)
    try:
        frames_seen(sock, 0.3)  # the calls are open a while (the client's deadline to come)
        last = ids[-1] + 2
        sock.sendall(
            _resets(ids)
            + frame(HEADERS, END_HEADERS, last, grpc_headers(INFER_PATH))
            + frame(DATA, END_STREAM, last, infer_message())
        )
        seen = frames_seen(sock, 2.0)
    finally:
        sock.close()
    assert GOAWAY not in {kind for kind, _ in seen}, seen[:20]
    assert (HEADERS, last) in seen  # the next call on the connection is answered


def test_calls_reset_as_they_open_end_the_connection(daemon: Daemon) -> None:
    ids, opened = _opened(1)
    sock = h2_connect(daemon.grpc_port, initial=opened + _resets(ids))
    try:
        code = goaway_code(sock, 3.0)
    finally:
        sock.close()
    assert code == ENHANCE_YOUR_CALM

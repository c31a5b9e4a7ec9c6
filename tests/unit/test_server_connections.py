"""Connection limits over loopback sockets: slow request heads are cut off while the server
keeps serving, idle keep-alive connections close, a connection past the limit gets a 503, and
HTTP/2 or garbage on the HTTP port costs one warning line, never a traceback.

Most tests shorten the timeouts to keep the suite fast; ``test_the_defaults_*`` pin the
defaults a user gets, and the one ``slow`` test runs them for real."""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import structlog
from aiohttp import web

from model_runtime.server.connections import (
    FD_RESERVE,
    H2_PREFACE,
    ConnectionLimits,
    GuardedAppRunner,
    default_max_connections,
    high_water,
)

pytestmark = pytest.mark.timeout(60)
GOOD = b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n"


@asynccontextmanager
async def guarded(limits: ConnectionLimits) -> AsyncIterator[tuple[int, GuardedAppRunner]]:
    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/ok", ok)
    runner = GuardedAppRunner(app, limits=limits, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield site.port, runner
    finally:
        await runner.cleanup()


async def _get(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(GOOD)
    head = await reader.readuntil(b"\r\n\r\n")
    writer.close()
    return head


async def _closed_by_server(reader: asyncio.StreamReader) -> float:
    """Read until EOF (or reset); return when it came."""
    try:
        while await reader.read(1024):
            pass
    except ConnectionError:
        pass
    return time.monotonic()


def test_the_defaults_close_slow_heads_within_30_s_and_bound_connections() -> None:
    limits = ConnectionLimits()
    assert limits.header_timeout <= 30
    assert limits.keepalive_timeout <= 120
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = default_max_connections()
    assert 16 <= limit <= 4096
    if soft != resource.RLIM_INFINITY and soft - FD_RESERVE >= 16:
        assert limit <= soft - FD_RESERVE  # never more connections than descriptors to hold them


async def test_dribbled_heads_are_closed_and_the_server_keeps_serving() -> None:
    async with guarded(ConnectionLimits(header_timeout=0.5)) as (port, runner):
        conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(40)]
        t0 = time.monotonic()
        for _, writer in conns:
            writer.write(b"GET /ok HTTP/1.1\r\n")

        async def dribble(writer: asyncio.StreamWriter) -> None:
            for i in range(30):  # one header line every 0.1 s: never a complete head
                if writer.is_closing():
                    return
                writer.write(b"X-Slow-%d: 1\r\n" % i)
                await asyncio.sleep(0.1)

        tasks = [asyncio.ensure_future(dribble(w)) for _, w in conns]
        # While they dribble, a well-behaved client is served at once, more than once.
        for _ in range(3):
            assert (await asyncio.wait_for(_get(port), 2)).startswith(b"HTTP/1.1 200")
            await asyncio.sleep(0.1)
        closed = await asyncio.wait_for(
            asyncio.gather(*(_closed_by_server(r) for r, _ in conns)), 5
        )
        assert max(closed) - t0 < 0.5 + 1.0  # the timeout, plus scheduling slack
        assert min(closed) - t0 >= 0.45  # and not before it
        assert runner.guard.header_timeouts == 40
        assert not runner.guard.open
        for t in tasks:
            t.cancel()
        for _, w in conns:
            w.close()
        assert (await _get(port)).startswith(b"HTTP/1.1 200")


async def test_a_later_request_head_gets_the_same_timeout() -> None:
    async with guarded(ConnectionLimits(header_timeout=0.3, keepalive_timeout=30)) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(GOOD)
        await reader.readuntil(b"ok")
        await asyncio.sleep(0.5)  # idle (keep-alive): not a head, no header timeout
        writer.write(GOOD)
        assert (await reader.readuntil(b"ok")).startswith(b"HTTP/1.1 200")
        t0 = time.monotonic()
        writer.write(b"GET /ok HTTP/1.1\r\n")  # then nothing more
        assert await asyncio.wait_for(_closed_by_server(reader), 3) - t0 < 1.3
        writer.close()


async def test_an_idle_keepalive_connection_is_closed() -> None:
    async with guarded(ConnectionLimits(keepalive_timeout=0.5)) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(GOOD)
        await reader.readuntil(b"ok")
        t0 = time.monotonic()
        closed = await asyncio.wait_for(_closed_by_server(reader), 5)
        assert 0.4 <= closed - t0 < 2.0
        writer.close()


async def test_past_the_connection_limit_a_client_gets_503_then_service_again() -> None:
    async with guarded(ConnectionLimits(max_connections=5)) as (port, runner):
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(5)]
        for _, writer in held:  # each in the middle of a request head: none is idle
            writer.write(b"GET /ok HTTP/1.1\r\n")
        for _ in range(50):
            if len(runner.guard.open) == 5:
                break
            await asyncio.sleep(0.02)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        answer = await asyncio.wait_for(reader.read(), 5)  # then the server closes
        assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
        assert b"Retry-After: 1\r\n" in answer and b"too many connections (limit 5)" in answer
        assert runner.guard.refused == 1
        assert runner.guard.idle_closed == 0
        writer.close()
        held[0][1].close()
        await asyncio.wait_for(_closed_by_server(held[0][0]), 5)
        for _ in range(50):  # the server sees the close
            if len(runner.guard.open) < 5:
                break
            await asyncio.sleep(0.02)
        assert (await _get(port)).startswith(b"HTTP/1.1 200")
        for _, w in held[1:]:
            w.close()


async def test_near_the_limit_the_longest_idle_keepalive_connection_makes_room() -> None:
    # A limit of 8 (high water 7) so that a handful of sockets reach it; the default is
    # thousands (test_the_defaults_*).
    limits = ConnectionLimits(max_connections=8)
    assert high_water(8) == 7
    async with guarded(limits) as (port, runner):
        held = [await _keep_alive(port) for _ in range(7)]  # answered, then idle (75 s)
        assert len(runner.guard.idle) == 7
        # The second one is busy again (a head under way): never closed to make room.
        held[1][1].write(b"GET /ok HTTP/1.1\r\n")
        for _ in range(100):  # until the server has read it
            if len(runner.guard.idle) == 6:
                break
            await asyncio.sleep(0.01)
        # Two new clients are served (and stay); for each, the longest idle one was closed.
        new = [await asyncio.wait_for(_keep_alive(port), 5) for _ in range(2)]
        assert runner.guard.refused == 0
        assert runner.guard.idle_closed == 2
        await asyncio.wait_for(_closed_by_server(held[0][0]), 5)
        await asyncio.wait_for(_closed_by_server(held[2][0]), 5)
        # The busy one finishes its request on its connection; the others still answer.
        held[1][1].write(b"Host: x\r\n\r\n")
        assert (await asyncio.wait_for(held[1][0].readuntil(b"ok"), 5)).startswith(b"HTTP/1.1 200")
        for reader, writer in held[3:] + new:
            writer.write(GOOD)
            assert (await asyncio.wait_for(reader.readuntil(b"ok"), 5)).startswith(b"HTTP/1.1 200")
        for _, w in held + new:
            w.close()


async def _keep_alive(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection with one request answered, left open (keep-alive)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(GOOD)
    assert (await reader.readuntil(b"ok")).startswith(b"HTTP/1.1 200")
    return reader, writer


async def test_http2_on_the_http_port_gets_goaway_and_one_warning_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with guarded(ConnectionLimits()) as (port, _):
        with structlog.testing.capture_logs() as events, caplog.at_level(logging.DEBUG):
            frames = []
            for _ in range(3):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(H2_PREFACE + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
                frames.append(await asyncio.wait_for(reader.read(), 5))
                writer.close()
            assert (await _get(port)).startswith(b"HTTP/1.1 200")
    for data in frames:
        assert data[3] == 0x04  # SETTINGS, the server preface
        goaway = data[9:]
        assert goaway[3] == 0x07 and int.from_bytes(goaway[13:17], "big") == 0x0D
        assert b"HTTP/1.1" in goaway[17:]
    warnings = [e for e in events if e["log_level"] == "warning"]
    assert [e["event"] for e in warnings] == ["http2_preface_refused"]  # rate-limited: one
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


async def test_a_garbage_request_line_is_a_400_and_a_warning_not_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with guarded(ConnectionLimits()) as (port, _):
        with structlog.testing.capture_logs() as events, caplog.at_level(logging.DEBUG):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /ok HTTP/1.1\r\nBad Header Line\r\n\r\n")
            answer = await asyncio.wait_for(reader.read(), 5)
            writer.close()
    assert answer.startswith(b"HTTP/1.1 400") or answer.startswith(b"HTTP/1.0 400")
    assert [e["event"] for e in events if e["log_level"] == "warning"] == ["bad_http_request"]
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


@pytest.mark.slow
async def test_slow_heads_are_closed_within_30_s_with_the_defaults() -> None:
    async with guarded(ConnectionLimits()) as (port, runner):
        conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(24)]
        t0 = time.monotonic()
        for _, writer in conns:
            writer.write(b"GET /ok HTTP/1.1\r\nX-A: 1\r\n")
        assert (await _get(port)).startswith(b"HTTP/1.1 200")
        closed = await asyncio.wait_for(
            asyncio.gather(*(_closed_by_server(r) for r, _ in conns)), 35
        )
        assert max(closed) - t0 <= 30
        assert runner.guard.header_timeouts == 24
        for _, w in conns:
            w.close()


def test_the_daemon_raises_its_open_file_limit_to_the_hard_limit() -> None:
    """A server may hold what the hard limit allows: a process started with a low soft limit
    gets the hard one (in a child process, so this test's own limits stay as they are)."""
    import subprocess
    import sys

    script = (
        "import resource\n"
        "from model_runtime.server.connections import raise_open_file_limit\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))\n"
        "before, after = raise_open_file_limit()\n"
        "now = resource.getrlimit(resource.RLIMIT_NOFILE)[0]\n"
        "print(before, after, now, hard)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    before, after, now, hard = (int(v) for v in done.stdout.split())
    assert before == min(256, hard) and now == after
    assert after == hard or hard == -1

"""Near the connection limit, slow clients make room first (issue 41): a head arriving for
the pressure header timeout or more is closed before a connection idle in keep-alive, and a
head under way before a connection that became idle after it began; a client that sends
whole requests keeps its connection."""

from __future__ import annotations

import asyncio

import pytest
from test_server_connections import GOOD, _keep_alive, guarded

from model_runtime.server.http.guard import ConnectionLimits

pytestmark = pytest.mark.timeout(30)


async def _slow(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /ok HTTP/1.1\r\n")  # a head that never ends
    await writer.drain()
    return reader, writer


async def _wait(predicate: object, what: str) -> None:
    for _ in range(500):
        if predicate():  # type: ignore[operator]
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


async def test_near_the_limit_slow_heads_make_room_before_a_client_that_sends_whole_requests() -> (
    None
):
    # A limit of 16 (high water 15) so that a handful of sockets reach it, and heads late
    # after 0.3 s under pressure (default 1 s) so that the test takes a second.
    assert ConnectionLimits().pressure_header_timeout == 1.0
    limits = ConnectionLimits(max_connections=16, pressure_header_timeout=0.3)
    async with guarded(limits) as (port, runner):
        guard = runner.guard
        slow = [await _slow(port) for _ in range(10)]
        await _wait(lambda: len(guard.heads) == 10, "ten heads under way")
        # A client that sends whole requests, on one keep-alive connection (idle between).
        good = await _keep_alive(port)
        more = [await _slow(port) for _ in range(4)]  # 15 open: the high water
        await _wait(lambda: len(guard.heads) == 14, "fourteen heads under way")
        # New clients, before the heads are late: the heads under way since before the good
        # connection was idle make room, not it.
        new = [await asyncio.wait_for(_keep_alive(port), 5) for _ in range(3)]
        assert guard.slow_closed == 3 and guard.idle_closed == 0
        for reader, _ in slow[:3]:
            assert await asyncio.wait_for(reader.read(), 5) == b""  # closed, oldest first
        assert guard.refused == 0
        for reader, writer in [good, *new]:
            writer.write(GOOD)
            assert (await asyncio.wait_for(reader.readuntil(b"ok"), 5)).startswith(b"HTTP/1.1 200")
        for _, w in [*slow, *more, good, *new]:
            w.close()


async def test_near_the_limit_a_late_head_goes_before_a_connection_idle_longer() -> None:
    # As above: a limit of 16, heads late after 0.3 s.
    limits = ConnectionLimits(max_connections=16, pressure_header_timeout=0.3)
    async with guarded(limits) as (port, runner):
        guard = runner.guard
        good = await _keep_alive(port)  # idle before any head begins
        slow = [await _slow(port) for _ in range(14)]  # 15 open: the high water
        await _wait(lambda: len(guard.heads) == 14, "fourteen heads under way")
        await asyncio.sleep(0.3)  # the heads are late now
        new = [await asyncio.wait_for(_keep_alive(port), 5) for _ in range(3)]
        assert guard.slow_closed == 3 and guard.idle_closed == 0 and guard.refused == 0
        for reader, writer in [good, *new]:
            writer.write(GOOD)
            assert (await asyncio.wait_for(reader.readuntil(b"ok"), 5)).startswith(b"HTTP/1.1 200")
        for _, w in [*slow, good, *new]:
            w.close()

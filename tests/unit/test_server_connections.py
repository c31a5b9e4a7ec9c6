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

from model_runtime.server.http.connection import H2_PREFACE
from model_runtime.server.http.guard import ADMITTED, ConnectionLimits, high_water
from model_runtime.server.http.heads import Framer
from model_runtime.server.http.runner import GuardedAppRunner
from model_runtime.server.security.fdlimit import FD_RESERVE, default_max_connections

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


async def test_a_new_connection_that_sends_nothing_is_idle_not_slow() -> None:
    # A pool opened ahead of use (proxies, load balancers pre-connect) is idle: it stays past
    # the header timeout and is closed after the idle one; its first byte starts a head's
    # timeout.
    limits = ConnectionLimits(header_timeout=0.2, keepalive_timeout=1.0)
    async with guarded(limits) as (port, runner):
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        t0 = time.monotonic()
        await asyncio.sleep(0.5)  # past the header timeout: still open, and it serves
        idle[0][1].write(GOOD)
        assert (await idle[0][0].readuntil(b"ok")).startswith(b"HTTP/1.1 200")
        idle[1][1].write(b"GET /ok HTTP/1.1\r\n")  # a head begun: its own timeout now
        t1 = time.monotonic()
        assert await asyncio.wait_for(_closed_by_server(idle[1][0]), 3) - t1 < 0.2 + 0.5
        closed = await asyncio.wait_for(_closed_by_server(idle[2][0]), 5)
        assert 0.9 <= closed - t0 < 2.0
        assert runner.guard.idle_timeouts == 1 and runner.guard.header_timeouts == 1
        for _, writer in idle:
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
        held = []
        for _ in range(5):  # each in the middle of a request head (none is idle) ...
            held.append(await asyncio.open_connection("127.0.0.1", port))
            held[-1][1].write(b"GET /ok HTTP/1.1\r\n")
            for _ in range(50):  # ... once the server has its first bytes
                if not runner.guard.idle:
                    break
                await asyncio.sleep(0.02)
        assert len(runner.guard.open) == 5
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
        "from model_runtime.server.security.fdlimit import raise_open_file_limit\n"
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


# -- early refusals ---------------------------------------------------------------------------

REFUSED_503 = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nfull"


@asynccontextmanager
async def refusing(
    admission: bool = True,
) -> AsyncIterator[tuple[int, GuardedAppRunner, list[str]]]:
    """A guarded server whose ``head_admission`` refuses POSTs to ``/full`` (``admission``
    False: none); the app answers every POST it sees (``/full`` too) with 200 and the path,
    and lists the paths in ``seen``."""
    seen: list[str] = []
    entered, gate = asyncio.Event(), asyncio.Event()

    async def echo(request: web.Request) -> web.Response:
        await request.read()
        if request.path == "/slow":  # held until the test opens the gate
            entered.set()
            await gate.wait()
        seen.append(request.path)
        return web.Response(text=request.path)

    app = web.Application()
    app.router.add_post("/{tail:.*}", echo)
    runner = GuardedAppRunner(app, limits=ConnectionLimits(header_timeout=5), access_log=None)
    if admission:
        runner.guard.head_admission = lambda target: REFUSED_503 if target == b"/full" else None
    runner.gates = (entered, gate)  # type: ignore[attr-defined]
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield site.port, runner, seen
    finally:
        await runner.cleanup()


def _post(path: str, body: bytes, *extra: str) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: x", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def _response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    while head.startswith(b"HTTP/1.1 1"):  # 100 Continue
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    lines = head.decode().split("\r\n")
    length = next(int(x.split(":")[1]) for x in lines if x.lower().startswith("content-length"))
    body = await asyncio.wait_for(reader.readexactly(length), 5)
    return int(lines[0].split()[1]), body


async def test_a_request_the_guard_refuses_is_answered_from_its_head_and_its_body_skipped() -> None:
    async with refusing() as (port, runner, seen):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_post("/a", b"first"))
        assert await _response(reader) == (200, b"/a")
        # Refused as soon as the head is in, before any of the body arrived ...
        writer.write(_post("/full", b"0123456789")[:-10])
        assert await _response(reader) == (503, b"full")
        # ... whose bytes, when they come (in pieces), are skipped: the next request is read
        # from the right place, on the same connection.
        writer.write(b"01234")
        await asyncio.sleep(0)
        writer.write(b"56789" + _post("/b", b"second"))
        assert await _response(reader) == (200, b"/b")
        # Refused again with head and body in one piece, and then one with a body in the
        # same write as the next request.
        writer.write(_post("/full", b"x" * 100))
        assert await _response(reader) == (503, b"full")
        writer.write(_post("/full", b"y") + _post("/c", b"third"))
        assert await _response(reader) == (503, b"full")
        assert await _response(reader) == (200, b"/c")
        writer.close()
    assert seen == ["/a", "/b", "/c"]  # the app never saw a refused request
    assert runner.guard.early_refused == 3


async def test_heads_the_guard_does_not_read_plainly_go_to_the_app() -> None:
    async def case(port: int, *writes: bytes) -> list[tuple[int, bytes]]:
        """On a new connection after one request (aiohttp then waits for the next), send
        ``writes`` (a pause between them) and read the answers."""
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_post("/a", b"1"))
        await _response(reader)
        for i, data in enumerate(writes):
            if i:
                await asyncio.sleep(0.05)
            writer.write(data)
        answers = [await _response(reader) for _ in range(b"".join(writes).count(b"POST "))]
        writer.close()
        return answers

    full = [(200, b"/full")]
    async with refusing() as (port, runner, seen):
        assert await case(port, _post("/full", b"1", "Connection: close")) == full
        assert await case(port, _post("/full", b"1", "Expect: 100-continue")) == full
        assert (
            await case(port, b"POST /full HTTP/1.0\r\nHost: x\r\nContent-Length: 1\r\n\r\n1")
            == full
        )
        chunked = b"POST /full HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        chunked += b"1\r\nx\r\n0\r\n\r\n"
        assert await case(port, chunked) == full
        # A head that comes in two pieces (the guard reads whole heads only).
        whole = _post("/full", b"2")
        assert await case(port, whole[:10], whole[10:]) == full
        # Pipelined behind a request aiohttp holds: answered in order, by aiohttp.
        assert await case(port, _post("/b", b"3") + _post("/full", b"4")) == [
            (200, b"/b"),
            *full,
        ]
        # Sent while aiohttp is still working on the connection's last request: it waits its
        # turn there, so answers keep their order.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        entered, gate = runner.gates  # type: ignore[attr-defined]
        writer.write(_post("/slow", b"5"))
        await asyncio.wait_for(entered.wait(), 5)
        writer.write(_post("/full", b"6"))
        conn = list(runner.guard.open.values())[-1]  # the newest
        for _ in range(500):  # until aiohttp has parsed it (or the guard took it)
            if conn._inner._messages or runner.guard.early_refused:
                break
            await asyncio.sleep(0.01)
        gate.set()
        assert [await _response(reader) for _ in range(2)] == [(200, b"/slow"), *full]
        writer.close()
    assert runner.guard.early_refused == 0
    assert seen.count("/full") == 7


async def test_a_refused_body_that_never_comes_is_cut_off_by_the_header_timeout() -> None:
    async with refusing() as (port, runner, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_post("/a", b"1"))
        await _response(reader)
        runner.guard.limits = ConnectionLimits(header_timeout=0.2)
        t0 = time.monotonic()
        writer.write(_post("/full", b"never sent")[:-10])
        assert await _response(reader) == (503, b"full")
        closed = await asyncio.wait_for(_closed_by_server(reader), 5)
        assert closed - t0 < 3
        writer.close()


async def test_a_split_inside_a_head_is_never_read_as_a_new_head() -> None:
    # R1's header value looks like a request line; the stream is cut right before it. The
    # guard must not take the rest of R1's head for a request of its own.
    async with refusing() as (port, runner, seen):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_post("/warm", b"0"))
        await _response(reader)
        r1 = b"POST /a HTTP/1.1\r\nHost: x\r\nX-Note: POST /full HTTP/1.1\r\n"
        r1 += b"Content-Length: 3\r\n\r\nabc"
        stream = _post("/first", b"1") + r1 + _post("/b", b"")
        cut = stream.index(b"X-Note: ") + len(b"X-Note: ")
        writer.write(stream[:cut])
        for _ in range(250):  # until the server has read the first part
            if "/first" in seen:
                break
            await asyncio.sleep(0.01)
        writer.write(stream[cut:])
        answers = [await _response(reader) for _ in range(3)]
        assert answers == [(200, b"/first"), (200, b"/a"), (200, b"/b")]
        writer.close()
    assert runner.guard.early_refused == 0


async def test_a_head_that_starts_like_http2_gets_the_header_timeout() -> None:
    async with guarded(ConnectionLimits(header_timeout=0.3, keepalive_timeout=30)) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"P")  # "PRI * HTTP/2.0" or "POST": the sniff waits for more
        t0 = time.monotonic()
        assert await asyncio.wait_for(_closed_by_server(reader), 5) - t0 < 0.3 + 1.0
        writer.close()


async def test_refusals_a_client_does_not_read_wait_their_turn() -> None:
    # A client that sends refusable requests and never reads its answers: past what the
    # socket holds, refusals stop being written ahead, and reading stops (aiohttp's
    # backpressure), so the server holds no growing pile of answers.
    async with refusing() as (port, runner, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_post("/warm", b"0"))
        await _response(reader)
        batch = _post("/full", b"x" * 200) * 256
        sent = 0
        while sent < (64 << 20):
            writer.write(batch)
            try:
                await asyncio.wait_for(writer.drain(), 1.0)
            except TimeoutError:
                break  # the server stopped reading: what we wanted to see
            sent += len(batch)
        assert sent < (64 << 20)
        conn = list(runner.guard.open.values())[-1]
        assert conn._transport is not None
        assert conn._transport.get_write_buffer_size() < (4 << 20)
        writer.transport.abort()


class _Ticket:
    """An admission given by ``head_admission``: counts how often it was given back."""

    def __init__(self) -> None:
        self.withdrawn = 0
        self.given_back = asyncio.Event()

    def withdraw(self) -> None:
        self.withdrawn += 1
        self.given_back.set()


async def test_an_admission_goes_with_its_request_or_is_given_back() -> None:
    tickets: list[_Ticket] = []
    carried: list[object] = []

    def admit(target: bytes) -> _Ticket:
        tickets.append(_Ticket())
        return tickets[-1]

    async def echo(request: web.Request) -> web.Response:
        carried.append(request.get(ADMITTED))
        await request.read()
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/{tail:.*}", echo)
    runner = GuardedAppRunner(app, limits=ConnectionLimits(header_timeout=5), access_log=None)
    runner.guard.head_admission = admit
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", site.port)
        writer.write(_post("/a", b"x"))  # admitted from its head: the app gets the admission
        assert await _response(reader) == (200, b"ok")
        assert carried == [tickets[0]] and tickets[0].withdrawn == 0
        # A head aiohttp rejects (a bracket in a header name) is not plain: no admission is
        # taken for it, and aiohttp answers it 400.
        writer.write(_post("/b", b"x", "Bad(Name: v"))
        assert (await _response(reader))[0] == 400
        await _closed_by_server(reader)
    finally:
        await runner.cleanup()
    assert len(tickets) == 1 and len(carried) == 1


@pytest.mark.parametrize("admission", [True, False], ids=["head-admission", "none"])
async def test_a_next_head_begun_while_a_request_runs_gets_the_header_timeout(
    admission: bool,
) -> None:
    # A client pipelines the start of its next head while the server still works on a request:
    # once that one is answered, the rest of the head must come within the header timeout,
    # not the 75 s keep-alive.
    async with refusing(admission) as (port, runner, _):
        entered, gate = runner.gates  # type: ignore[attr-defined]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_post("/a", b"1"))
        await _response(reader)
        runner.guard.limits = ConnectionLimits(header_timeout=0.2)
        writer.write(_post("/slow", b"2"))
        await asyncio.wait_for(entered.wait(), 5)
        fed = asyncio.Event()

        class Watched(Framer):  # tells when the connection got bytes
            __slots__ = ()

            def feed(self, data: bytes, plain: tuple[bytes, int, int] | None = None) -> None:
                super().feed(data, plain)
                fed.set()

        conn = next(iter(runner.guard.open.values()))
        conn._framer = Watched()  # at a boundary, as the one it replaces
        writer.write(b"POST /b HTTP/1.1\r\n")  # then nothing more
        await asyncio.wait_for(fed.wait(), 5)  # the server has it while /slow still runs
        assert conn._framer.mid_head
        gate.set()
        assert await _response(reader) == (200, b"/slow")
        t0 = time.monotonic()
        assert await asyncio.wait_for(_closed_by_server(reader), 5) - t0 < 3
        assert runner.guard.header_timeouts == 1
        writer.close()


@pytest.mark.parametrize("admission", [True, False], ids=["head-admission", "none"])
async def test_the_rest_of_an_unread_body_after_its_answer_leaves_the_connection_idle(
    admission: bool,
) -> None:
    # The app answered without reading the body (405 here); the body's bytes that come after
    # are not a head: the connection stays in keep-alive, open past the header timeout.
    async with refusing(admission) as (port, runner, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_post("/a", b"1"))
        await _response(reader)
        runner.guard.limits = ConnectionLimits(header_timeout=0.2)
        writer.write(b"PUT /a HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n01234")
        assert (await _response(reader))[0] == 405
        writer.write(b"56789")
        await asyncio.sleep(0.6)  # three header timeouts: still open, and it serves
        writer.write(_post("/b", b"2"))
        assert await _response(reader) == (200, b"/b")
        assert runner.guard.header_timeouts == 0
        writer.close()


def test_descriptors_are_shared_with_grpc_and_http_keeps_its_cap() -> None:
    from model_runtime.server.security.fdlimit import DescriptorShares

    # The soft limit the daemon usually runs with (raised to a large hard limit): HTTP's cap,
    # and more than that for gRPC.
    big = DescriptorShares.of_limit(1 << 20)
    assert big.http == 4096 and big.grpc >= 4096
    # The default 1,024 (not raised): a quarter of what is left for gRPC, the rest HTTP's.
    small = DescriptorShares.of_limit(1024)
    assert small.grpc == (1024 - FD_RESERVE) // 4
    assert small.http + small.grpc + FD_RESERVE == 1024

"""A client that pipelines requests, or does not take its answers, or sends bodies past the
memory budget, in process over a fake runner with the daemon's guard and protocol-level path
(issue 41): pipelined requests are answered in order, each read where it lies in the bytes
that came (never from a copy of all that followed it); what a connection sends ahead is
bounded; answers not taken within the write timeout end the connection (while they wait they
are charged to the memory budget); a body not in hand past the budget is refused at once, on
either path, and its bytes are given back."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from test_fast_path_bodies import BODY, _answer, _answer_with_head, guarded

from model_runtime.server.http import connection as client_connection, pipelined
from model_runtime.server.http.guard import ConnectionLimits

pytestmark = pytest.mark.timeout(30)
INFER = "/v2/models/fake/infer"
ENCODED = "/v2/models/%66ake/infer"  # aiohttp's route, not the protocol-level path


def _request(rid: str = "", body: bytes = BODY, target: str = INFER) -> bytes:
    extra = f"X-Request-ID: {rid}\r\n" if rid else ""
    head = f"POST {target} HTTP/1.1\r\nHost: x\r\n{extra}Content-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


async def test_pipelined_requests_are_answered_in_order_each_read_where_it_lies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    read_from: list[bytes] = []  # every buffer a head was read from (kept: ids stay unique)
    real = client_connection.plain_head

    def spy(data: bytes, max_body: int, *start: int) -> Any:
        read_from.append(data)
        return real(data, max_body, *start)

    monkeypatch.setattr(client_connection, "plain_head", spy)
    n = 300
    async with guarded(tmp_path) as (port, fast):
        before = fast.taken
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"".join(_request(f"r{i}") for i in range(n)))  # one write, ~60 KB
        for i in range(n):
            status, head, _ = await _answer_with_head(reader)
            assert status == 200
            assert f"X-Request-ID: r{i}\r\n".encode() in head  # in order
        writer.close()
        assert fast.taken - before > n * 0.9  # answered at the protocol level
    # Each head was read where it lay: in the few buffers the bytes came in, not in a copy
    # of everything after the request before it (one per request: the cost of the N-th
    # request grew with what the client had sent).
    assert len({id(b) for b in read_from}) < 20, len(read_from)


async def test_a_pipelining_client_is_not_read_past_the_hold_limit(tmp_path: Path) -> None:
    async with guarded(tmp_path) as (port, fast):
        fast.fake.gate = gate = asyncio.Event()  # the first request waits
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        n = 5000  # ~800 KB sent ahead of the first answer
        writer.write(b"".join(_request(f"r{i}") for i in range(n)))
        await asyncio.wait_for(fast.took.wait(), 10)
        (conn,) = fast.guard.open.values()
        for _ in range(500):  # until the server stops reading it
            if conn._paused:
                break
            await asyncio.sleep(0.01)
        assert conn._paused
        # Held: the hold limit, and what the read that passed it brought (256 KiB at most).
        assert conn._held.size <= pipelined._HOLD_LIMIT + (256 << 10)
        gate.set()
        for i in range(n):  # then all of them are read and answered, in order
            status, head, _ = await _answer_with_head(reader)
            assert status == 200 and f"X-Request-ID: r{i}\r\n".encode() in head
        writer.close()


async def test_answers_not_taken_within_the_write_timeout_end_the_connection(
    tmp_path: Path,
) -> None:
    # 0.5 s instead of the default 30 s, so the test takes a second.
    assert ConnectionLimits().write_timeout == 30.0
    limits = ConnectionLimits(write_timeout=0.5)
    rows = [[float(i)] * 4 for i in range(64)]
    body = json.dumps(
        {"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [64, 4], "data": rows}]}
    ).encode()
    async with guarded(tmp_path, limits) as (port, fast):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        request = _request(body=body)
        ended = False
        charged = 0  # the answers waiting, charged to the memory budget
        for _ in range(20000):  # sent and never read, until the server ends it
            charged = max(charged, fast.guard.budget.in_use)
            writer.write(request * 10)
            try:
                await asyncio.wait_for(writer.drain(), 0.05)
            except TimeoutError:
                pass  # it stopped reading us: its answers wait in its buffers
            except ConnectionError:
                ended = True
                break
            if fast.guard.write_timeouts:
                break
        for _ in range(300):
            if fast.guard.write_timeouts:
                break
            await asyncio.sleep(0.01)
        assert fast.guard.write_timeouts == 1 or ended
        assert fast.guard.write_timeouts == 1
        assert charged >= 64 << 10  # past the write buffer's high-water mark
        for _ in range(300):
            if not fast.guard.budget.in_use:
                break
            await asyncio.sleep(0.01)
        assert fast.guard.budget.in_use == 0  # given back with the connection
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            while True:  # what it sent before, then the end
                await asyncio.wait_for(_answer(reader), 5)
        writer.close()
        # The server serves on.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_request())
        assert (await _answer(reader))[0] == 200
        writer.close()


@pytest.mark.parametrize("target", [INFER, ENCODED], ids=["protocol-level", "aiohttp"])
async def test_a_body_past_the_memory_budget_is_refused_at_once_and_given_back(
    tmp_path: Path, target: str
) -> None:
    # A budget of 1,000 bytes (the default is 256 MiB) so that small bodies reach it.
    limits = ConnectionLimits(memory_budget=1000)
    body = BODY + b" " * (600 - len(BODY))  # two of them are past the budget
    request = _request(body=body, target=target)
    async with guarded(tmp_path, limits) as (port, fast):
        budget = fast.guard.budget
        first = await asyncio.open_connection("127.0.0.1", port)
        first[1].write(request[:-10])  # its body not all in: it holds 600 bytes
        for _ in range(500):
            if budget.in_use:
                break
            await asyncio.sleep(0.01)
        assert budget.in_use == 600
        second = await asyncio.open_connection("127.0.0.1", port)
        second[1].write(request[:-10])
        status, head, answer = await _answer_with_head(second[0])  # at once
        assert status == 503 and b"Retry-After: 1\r\n" in head
        assert "memory budget (0 MiB)" in json.loads(answer)["error"]
        assert budget.refused == 1
        first[1].write(request[-10:])
        assert (await _answer(first[0]))[0] == 200
        for _ in range(500):
            if not budget.in_use:
                break
            await asyncio.sleep(0.01)
        assert budget.in_use == 0  # given back
        # The refused request's body is skipped (or its connection closed by aiohttp) ...
        if target == INFER:
            second[1].write(request[-10:] + request)
            assert (await _answer(second[0]))[0] == 200
        second[1].close()
        # ... and the budget serves the next one.
        third = await asyncio.open_connection("127.0.0.1", port)
        third[1].write(request)
        assert (await _answer(third[0]))[0] == 200
        for _, w in (first, third):
            w.close()

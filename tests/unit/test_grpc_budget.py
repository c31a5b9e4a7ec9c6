"""The gRPC call budget: a connection whose answer is not written within the write timeout is
refused new calls at once, and what it held is freed when it closes; past the bytes budget a
connection that already holds calls is refused at once. The clock is the test's: the sweep
runs when the test says."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from model_runtime.runner import ModelRunnerConfig
from model_runtime.server.grpc.budget import CALL_OVERHEAD, CallBudget
from model_runtime.server.grpc.server import GrpcLimits, call_budget, start_grpc_server
from model_runtime.server.inference.plane import DataPlane, ServerOptions
from model_runtime.server.repository.repository import ModelRepository
from tests.attack.grpc_wire import (
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    PREFACE,
    frame,
    grpc_headers,
    settings,
)

pytestmark = pytest.mark.timeout(30)

LIVE = b"/inference.GRPCInferenceService/ServerMetadata"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@asynccontextmanager
async def serving(tmp_path: Path, budget: CallBudget) -> AsyncIterator[int]:
    repo = ModelRepository(ModelRunnerConfig(batching_dim=0), directory=tmp_path)
    repo.scan()
    async with repo:
        server = DataPlane(repo, ServerOptions())
        grpc_server, port = await start_grpc_server(server, "127.0.0.1", 0, budget=budget)
        try:
            yield port
        finally:
            await grpc_server.stop(None)


async def zero_window_calls(port: int, streams: int) -> tuple[Any, Any]:
    """A connection with a zero window and ``streams`` ServerMetadata calls on it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    message = b"\x00" + struct.pack(">I", 0)
    calls = b"".join(
        frame(HEADERS, END_HEADERS, s, grpc_headers(LIVE)) + frame(DATA, END_STREAM, s, message)
        for s in range(1, 2 * streams, 2)
    )
    writer.write(PREFACE + settings(initial_window_size=0) + calls)
    await writer.drain()
    return reader, writer


async def frames_until(reader: Any, kind: int) -> list[tuple[int, int, int]]:
    """Frames (type, flags, stream) read until one of ``kind``."""
    seen: list[tuple[int, int, int]] = []
    while not seen or seen[-1][0] != kind:
        head = await reader.readexactly(9)
        await reader.readexactly(int.from_bytes(head[:3], "big"))
        seen.append((head[3], head[4], int.from_bytes(head[5:9], "big")))
    return seen


async def until(condition: Any) -> None:
    while not condition():  # noqa: ASYNC110 - grpc's callbacks change it; no event to wait on
        await asyncio.sleep(0.01)


async def test_a_connection_whose_answer_is_not_written_in_time_is_refused_new_calls(
    tmp_path: Path,
) -> None:
    clock = Clock()
    limits = GrpcLimits()
    budget = CallBudget(
        write_timeout=limits.write_timeout,
        max_calls=limits.max_calls,
        max_bytes=limits.max_bytes_in_flight,
        clock=clock,
    )
    async with serving(tmp_path, budget) as port:
        reader, writer = await zero_window_calls(port, 1)
        await until(lambda: budget.unsent)  # answered; the answer waits on the window
        assert budget.bytes > CALL_OVERHEAD
        clock.now += limits.write_timeout - 0.1
        budget.sweep()
        assert not budget.stalled  # not yet
        clock.now += 0.1
        budget.sweep()
        assert budget.timed_out == 1 and budget.stalled
        await frames_until(reader, HEADERS)  # the first answer's head
        writer.write(frame(HEADERS, END_HEADERS, 3, grpc_headers(LIVE)))
        writer.write(frame(DATA, END_STREAM, 3, b"\x00" + struct.pack(">I", 0)))
        _kind, flags, stream = (await asyncio.wait_for(frames_until(reader, HEADERS), 5))[-1]
        assert (stream, flags & END_STREAM) == (3, END_STREAM)  # refused: trailers only
        assert budget.refused_stalled == 1
        writer.close()
        await until(lambda: not budget.calls)  # the connection gone, what it held is free
        assert budget.bytes == 0 and not budget.stalled and not budget.unsent


async def test_past_the_bytes_budget_a_connection_holding_calls_is_refused(
    tmp_path: Path,
) -> None:
    # A budget of three calls' overhead (the default's 128 MiB would take 30,000 calls).
    budget = call_budget(GrpcLimits(max_bytes_in_flight=3 * CALL_OVERHEAD))
    async with serving(tmp_path, budget) as port:
        reader, writer = await zero_window_calls(port, 4)
        seen = await asyncio.wait_for(frames_until(reader, HEADERS), 5)
        refused: list[int] = []
        while len(refused) < 2:  # trailers-only answers: HEADERS ending their stream
            _kind, flags, stream = (await asyncio.wait_for(frames_until(reader, HEADERS), 5))[-1]
            if flags & END_STREAM:
                refused.append(stream)
        assert budget.refused_bytes == 2 and len(budget.unsent) == 2
        assert seen
        writer.close()


def test_calls_taken_by_callbacks_are_refused_past_each_limit() -> None:
    """The nghttp2 transport's ModelInfer by callbacks (``try_enter``, ``computed``): a call is
    taken only within every limit, and nothing is counted when it is not (it then goes the
    app's way, which refuses it); an answer past the bytes budget is refused uncounted."""
    o = CALL_OVERHEAD
    budget = CallBudget(write_timeout=1.0, max_calls=2, max_bytes=3 * o, clock=Clock())
    assert budget.try_enter("a", o) and budget.try_enter("a", o)
    assert not budget.try_enter("b", o)  # two calls being computed: max_calls
    assert (budget.computing, budget.bytes, budget.calls) == (2, 2 * o, {"a": 2})
    # An answer that would pass the budget while its connection holds another call: refused.
    why = budget.computed("a", 2 * o)
    assert why is not None and "bytes of calls in flight" in why
    assert (budget.computing, budget.bytes) == (1, 2 * o)
    assert budget.computed("a", o // 2) is None  # within the budget: counted
    assert (budget.computing, budget.bytes) == (0, 2 * o + o // 2)
    assert not budget.try_enter("a", o)  # the bytes, with another call of its own held
    assert budget.try_enter("b", 2 * o)  # a lone connection: up to twice the budget
    budget.computed("b", 0)
    budget.leave("b", 2 * o)
    budget.leave("a", o)
    budget.leave("a", o + o // 2)
    assert (budget.computing, budget.bytes, budget.calls) == (0, 0, {})


async def test_a_stalled_connection_is_not_taken_by_callbacks() -> None:
    """An answer of connection ``s`` not written within the write timeout stalls it: its next
    call is not taken (the app refuses it), another connection's is."""
    clock = Clock()
    budget = CallBudget(write_timeout=1.0, max_calls=8, max_bytes=1 << 20, clock=clock)
    assert budget.try_enter("s", CALL_OVERHEAD)
    budget.computed("s", 100)
    budget.hold_unsent("answer", "s", now=123.0)  # (the budget's own clock counts, not this)
    clock.now = 1.5
    budget.sweep()
    assert not budget.try_enter("s", CALL_OVERHEAD)
    assert budget.try_enter("t", CALL_OVERHEAD)
    budget.written("answer")
    assert budget.try_enter("s", CALL_OVERHEAD)

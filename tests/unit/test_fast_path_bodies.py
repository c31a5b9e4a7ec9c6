"""Bodies that do not come whole with their head, on the protocol-level path
(model_runtime/server/http/fastpath.py), in process over a fake runner with the daemon's guard: a
body in several reads is awaited and answered there; one that never comes is the same 408 as
aiohttp's route gives, and the connection closes; a request answered before its body is in
(an unknown version) has the rest of its body skipped, and the connection serves on."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp import web
from test_server_app import FakeRunner, W

from model_runtime.runner_config import ModelRunnerConfig
from model_runtime.server.http.fastpath import FastInfer
from model_runtime.server.http.guard import ConnectionGuard, ConnectionLimits
from model_runtime.server.http.routes import HttpFrontEnd
from model_runtime.server.http.runner import GuardedAppRunner
from model_runtime.server.inference.plane import DataPlane, ServerOptions
from model_runtime.server.repository.repository import ModelRepository
from model_runtime.server.serving import RunnerLike

pytestmark = pytest.mark.timeout(20)


class NotedFast(FastInfer):
    """The protocol-level path, noting when it took a request (``took``)."""

    guard: ConnectionGuard
    fake: FakeRunner

    def __init__(self, plane: DataPlane) -> None:
        super().__init__(plane, access_log=False)
        self.took = asyncio.Event()

    def start(self, *args: Any) -> Any:
        task = super().start(*args)
        if task is not None:
            self.took.set()
        return task


@asynccontextmanager
async def guarded(
    tmp_path: Path, limits: ConnectionLimits | None = None, **options: Any
) -> AsyncIterator[tuple[int, NotedFast]]:
    """The fake model served as the daemon serves: the guard, admission at the head, and the
    protocol-level path. Yields the port and the path."""
    (tmp_path / "fake.mrx").write_bytes(b"")
    fake = FakeRunner()

    def factory(path: Path, config: ModelRunnerConfig) -> RunnerLike:
        return fake

    repo = ModelRepository(
        ModelRunnerConfig(batching_dim=0), directory=tmp_path, runner_factory=factory
    )
    repo.scan()
    async with repo:
        await repo.load("fake")
        plane = DataPlane(repo, ServerOptions(access_log=False, **options))
        runner = GuardedAppRunner(
            HttpFrontEnd(plane).app(), limits=limits, handler_cancellation=True, access_log=None
        )
        runner.guard.head_admission = plane.admission.at_head
        fast = runner.guard.fast = NotedFast(plane)
        fast.guard, fast.fake = runner.guard, fake  # for tests that look inside
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            # The model's admission state is made by its first answer (through aiohttp).
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_head("/v2/models/fake/infer", len(BODY)) + BODY)
            assert (await _answer(reader))[0] == 200
            writer.close()
            fast.took.clear()
            yield port, fast
        finally:
            await runner.cleanup()


ROWS = np.arange(8, dtype=np.float32).reshape(2, 4)
BODY = json.dumps(
    {"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [2, 4],
                 "data": ROWS.ravel().tolist()}]}
).encode()  # fmt: skip


def _head(target: str, length: int) -> bytes:
    return f"POST {target} HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n".encode()


async def _answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    status, _, body = await _answer_with_head(reader)
    return status, body


async def _answer_with_head(reader: asyncio.StreamReader) -> tuple[int, bytes, bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    body = await asyncio.wait_for(reader.readexactly(length), 10)
    return int(head.split()[1]), head, body


async def test_a_body_in_several_reads_is_awaited_and_answered_here(tmp_path: Path) -> None:
    async with guarded(tmp_path) as (port, fast):
        before = fast.taken
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_head("/v2/models/fake/infer", len(BODY)) + BODY[:10])
        await asyncio.wait_for(fast.took.wait(), 10)  # taken from its head alone
        for i in range(10, len(BODY), 7):  # the rest in small pieces
            writer.write(BODY[i : i + 7])
            await writer.drain()
        status, body = await _answer(reader)
        assert status == 200, body
        (logits,) = [o for o in json.loads(body)["outputs"] if o["name"] == "logits"]
        np.testing.assert_allclose(np.array(logits["data"]).reshape(2, 3), ROWS @ W)
        writer.write(_head("/v2/models/fake/infer", len(BODY)) + BODY)  # and the next one
        assert (await _answer(reader))[0] == 200
        assert fast.taken == before + 2
        writer.close()


@pytest.mark.parametrize("target", ["/v2/models/fake/infer", "/v2/models/%66ake/infer"])
async def test_a_body_that_never_comes_is_a_408_and_the_connection_closes(
    tmp_path: Path, target: str
) -> None:
    """The same answer whether the protocol-level path (plain target) or aiohttp's route
    (percent-encoded) waited for it. (aiohttp's route keeps the connection open after it.)"""
    async with guarded(tmp_path, body_timeout=0.3) as (port, fast):
        before = fast.taken
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_head(target, len(BODY)) + BODY[:10])
        status, head, body = await _answer_with_head(reader)
        assert b"\r\nConnection: close\r\n" in head  # a pooling client must not reuse it
        assert (status, json.loads(body)) == (
            408,
            {"error": "the request body did not arrive within 0.3 s"},
        )
        here = target == "/v2/models/fake/infer"
        assert fast.taken == before + here
        if here:  # its body's rest would be read as a next request: the connection closes
            assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()


async def test_an_answer_before_the_body_skips_its_rest_and_the_connection_serves_on(
    tmp_path: Path,
) -> None:
    async with guarded(tmp_path) as (port, fast):
        before = fast.taken
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_head("/v2/models/fake/versions/9/infer", len(BODY)) + BODY[:10])
        status, body = await _answer(reader)  # answered without its body
        assert status == 404, body
        writer.write(BODY[10:] + _head("/v2/models/fake/infer", len(BODY)) + BODY)
        status, body = await _answer(reader)
        assert status == 200, body
        assert fast.taken == before + 2
        writer.close()


async def test_aiohttps_keepalive_close_still_comes_after_a_request_answered_here(
    tmp_path: Path,
) -> None:
    """aiohttp's keep-alive timer, put off while a request is answered here, closes the
    connection again once aiohttp has answered the next request and it idles."""
    limits = ConnectionLimits(keepalive_timeout=0.3)
    async with guarded(tmp_path, limits=limits) as (port, fast):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_head("/v2/models/fake/infer", len(BODY)) + BODY[:10])
        await asyncio.wait_for(fast.took.wait(), 10)
        # Not ordering: long enough for aiohttp's timer (due 0.3 s after the connection
        # opened) to fire while this request waits for its body.
        await asyncio.sleep(0.5)
        writer.write(BODY[10:])
        assert (await _answer(reader))[0] == 200
        writer.write(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")  # aiohttp's
        assert (await _answer(reader))[0] == 200
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed when idle
        writer.close()

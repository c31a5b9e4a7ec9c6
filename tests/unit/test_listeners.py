"""The daemon's listeners are supervised: a gRPC server killed on purpose, or an HTTP site
closed on purpose, is started again on the same port and serves; while it is down, readiness
says not ready and why (over the other protocol)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from aiohttp.test_utils import TestClient, TestServer

from model_runtime.runner import ModelRunnerConfig
from model_runtime.server.daemon.listeners import SupervisedListener
from model_runtime.server.grpc.server import start_grpc_server
from model_runtime.server.http.routes import HttpFrontEnd
from model_runtime.server.http.runner import GuardedAppRunner, start_site
from model_runtime.server.inference.plane import DataPlane, ServerOptions
from model_runtime.server.repository.repository import ModelRepository
from model_runtime.server.triton import grpc_service_pb2 as pb, grpc_service_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(30)


async def ready_over_grpc(port: int) -> bool:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
        answer = await stub.ServerReady(pb.ServerReadyRequest(), timeout=5)
        return bool(answer.ready)


async def test_a_killed_grpc_listener_comes_back_and_is_not_ready_meanwhile(
    tmp_path: Path,
) -> None:
    repo = ModelRepository(ModelRunnerConfig(batching_dim=0), directory=tmp_path)
    repo.scan()
    async with repo:
        server = DataPlane(repo, ServerOptions())
        async with TestClient(TestServer(HttpFrontEnd(server).app())) as http:
            changes: asyncio.Queue[str | None] = asyncio.Queue()
            restart = asyncio.Event()  # the test says when the restart may bind
            starts = 0

            async def start(port: int) -> tuple[Any, int]:
                nonlocal starts
                starts += 1
                if starts > 1:
                    await restart.wait()
                return await start_grpc_server(server, "127.0.0.1", port)

            def changed(reason: str | None) -> None:
                server.listener_changed("grpc", reason)
                changes.put_nowait(reason)

            listener = SupervisedListener(start, changed)
            port = await listener.start(0)
            try:
                assert await ready_over_grpc(port)
                await listener.server.stop(None)  # killed on purpose
                reason = await changes.get()
                assert reason is not None and "gRPC listener stopped" in reason
                down = await http.get("/v2/health/ready")
                assert down.status == 503
                assert (await down.json())["error"] == reason
                restart.set()
                assert await changes.get() is None
                assert listener.restarts == 1 and listener.port == port
                assert await ready_over_grpc(port)  # the same port serves again
                assert (await http.get("/v2/health/ready")).status == 200
            finally:
                await listener.stop(None)


async def test_a_closed_http_site_comes_back_on_its_port_and_grpc_says_not_ready_meanwhile(
    tmp_path: Path,
) -> None:
    repo = ModelRepository(ModelRunnerConfig(batching_dim=0), directory=tmp_path)
    repo.scan()
    async with repo:
        plane = DataPlane(repo, ServerOptions())
        runner = GuardedAppRunner(HttpFrontEnd(plane).app())
        await runner.setup()
        grpc_server, grpc_port = await start_grpc_server(plane, "127.0.0.1", 0)
        changes: asyncio.Queue[str | None] = asyncio.Queue()
        restart = asyncio.Event()
        starts = 0

        async def start(port: int) -> tuple[Any, int]:
            nonlocal starts
            starts += 1
            if starts > 1:
                await restart.wait()
            return await start_site(runner, "127.0.0.1", port)

        def changed(reason: str | None) -> None:
            plane.listener_changed("http", reason)
            changes.put_nowait(reason)

        listener = SupervisedListener(start, changed, name="HTTP")
        port = await listener.start(0)
        try:
            # One connection per request: a closed site ends once its last connection is
            # gone, and a keep-alive one in the client's pool would hold that off for the
            # pool's 15 s.
            connector = aiohttp.TCPConnector(force_close=True)
            async with aiohttp.ClientSession(connector=connector) as session:
                url = f"http://127.0.0.1:{port}/v2/health/ready"
                assert (await session.get(url)).status == 200
                site = listener.server.site
                assert site._server is not None
                site._server.close()  # closed on purpose
                reason = await changes.get()
                assert reason is not None and "HTTP listener stopped" in reason
                assert not await ready_over_grpc(grpc_port)  # readiness says so meanwhile
                restart.set()
                assert await changes.get() is None
                assert listener.restarts == 1 and listener.port == port
                assert (await session.get(url)).status == 200  # the same port serves again
                assert await ready_over_grpc(grpc_port)
        finally:
            await listener.stop(None)
            await grpc_server.stop(None)
            await runner.cleanup()

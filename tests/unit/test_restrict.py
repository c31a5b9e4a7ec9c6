"""Restricted API groups (issue 35): Triton's flags and answers, and no route or RPC of the daemon
reachable without the key when its group is restricted. The routes and methods are walked
from the HTTP router and the gRPC service's descriptor, not from a list kept by hand."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from aiohttp.test_utils import TestClient, TestServer

from model_runtime.errors import ConfigurationError
from model_runtime.server.grpc.server import start_grpc_server
from model_runtime.server.grpc.service import UNSUPPORTED_METHODS
from model_runtime.server.http.routes import HttpFrontEnd
from model_runtime.server.security.restrict import (
    GROUPS,
    GRPC_GROUPS,
    GRPC_KEY_PREFIX,
    Restriction,
    Restrictions,
)
from model_runtime.server.security.tls import check_exposure, is_loopback
from model_runtime.server.triton import grpc_service_pb2 as pb
from tests.unit.test_server_app import serving

ALL = ",".join(GROUPS)
SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]


def test_flags_parse_as_tritons() -> None:
    r = Restrictions.parse(
        ["inference,health:Token=s3cret", "model-repository:admin=x:y"], kind="api"
    )
    assert r.get("inference") == r.get("health") == Restriction("token", "s3cret")
    assert r.get("model-repository") == Restriction("admin", "x:y")
    assert r.get("metadata") is None and bool(r)
    assert not Restrictions.parse([], kind="api")
    g = Restrictions.parse(["inference:k=v"], kind="protocol", prefix=GRPC_KEY_PREFIX)
    assert g.get("inference") == Restriction("triton-grpc-protocol-k", "v")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["inference"], "restricted api option format is '<apis>:<key>=<value>'"),
        (["inference:k"], "format"),
        (["inference:k="], "format"),
        ([":k=v"], "format"),
        (["infer:k=v"], "unknown restricted api 'infer'"),
        (["inference:k=v", "health,inference:j=w"],
         "restricted api 'inference' can not be specified in multiple config groups"),
    ],
)  # fmt: skip
def test_bad_flags_stop_the_start(flags: list[str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        Restrictions.parse(flags, kind="api")


def test_the_value_must_match_exactly() -> None:
    rule = Restriction("k", "secret")
    assert rule.allows("secret")
    assert not any(rule.allows(v) for v in (None, "", "Secret", "secret ", "secre", "secrets"))


def _url(canonical: str) -> str:
    fill = {"{name}": "fake", "{version}": "1", "{region}": "r", "{action}": "status"}
    for field, value in fill.items():
        canonical = canonical.replace(field, value)
    return canonical


async def test_every_http_route_is_refused_without_the_key_when_its_group_is(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path) as (_, _, plain):
        server = HttpFrontEnd(
            plain,
            restrictions=Restrictions.parse([f"{ALL}:k=v"], kind="api"),
        )
        app = server.app()
        routes = [r for r in app.router.routes() if r.method != "HEAD"]
        assert len(routes) >= 20
        # Every route of the router has its group (the table is the routes' own).
        assert {r: server.route_groups.get(r) for r in routes if r not in server.route_groups} == {}
        async with TestClient(TestServer(app)) as client:
            for route in routes:
                url = _url(route.resource.canonical if route.resource else "")
                resp = await client.request(route.method, url, json={})
                assert resp.status == 403, (route.method, url, resp.status)
                assert await resp.json() == {
                    "error": "This API is restricted, expecting header 'k'"
                }, url
                resp = await client.request(route.method, url, json={}, headers={"K": "v"})
                assert resp.status != 403, (route.method, url)
            metrics = await (await client.get("/metrics", headers={"k": "v"})).text()
        refused = [
            line for line in metrics.splitlines()
            if line.startswith("model_runtime_requests_restricted_total{")
        ]  # fmt: skip
        assert sum(float(line.rsplit(" ", 1)[1]) for line in refused) == len(routes)
        assert 'group="model-repository",protocol="http"' in "".join(refused)


async def test_only_the_restricted_groups_are_closed(tmp_path: Path) -> None:
    async with serving(tmp_path) as (_, _, plain):
        rules = Restrictions.parse(["model-repository:admin=yes"], kind="api")
        server = HttpFrontEnd(plain, restrictions=rules)
        async with TestClient(TestServer(server.app())) as client:
            resp = await client.post("/v2/repository/models/fake/unload")
            assert resp.status == 403
            assert (await client.get("/v2/models/fake/ready")).status == 200  # nothing changed
            assert (await client.get("/v2/health/ready")).status == 200
            assert (await client.get("/v2/models/fake")).status == 200


async def test_every_grpc_method_is_refused_without_the_key_when_its_group_is(
    tmp_path: Path,
) -> None:
    # Every method the daemon answers (its servicer's, and those it refuses by name) has its
    # group.
    served = {m.name for m in SERVICE.methods} | set(UNSUPPORTED_METHODS)
    assert served <= set(GRPC_GROUPS), served - set(GRPC_GROUPS)
    rules = Restrictions.parse([f"{ALL}:k=v"], kind="protocol", prefix=GRPC_KEY_PREFIX)
    async with serving(tmp_path) as (_, _, server):
        grpc_server, port = await start_grpc_server(server, "127.0.0.1", 0, restrictions=rules)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                for name in sorted(served):
                    method = _Method(name, name == "ModelStreamInfer")
                    code, message = await _call(channel, method)
                    assert (code, message) == (
                        grpc.StatusCode.UNAVAILABLE,
                        "This protocol is restricted, expecting header 'triton-grpc-protocol-k'",
                    ), method.name
                    code, message = await _call(
                        channel, method, metadata=(("triton-grpc-protocol-k", "v"),)
                    )
                    assert "restricted" not in message, method.name
        finally:
            await grpc_server.stop(None)


@dataclass(frozen=True)
class _Method:
    name: str
    client_streaming: bool


async def _call(channel: Any, method: _Method, metadata: Any = ()) -> tuple[Any, str]:
    path = f"/inference.GRPCInferenceService/{method.name}"
    try:
        if method.client_streaming:
            call = channel.stream_stream(path)(iter([b""]), metadata=metadata, timeout=5)
            async for _ in call:
                pass
        else:
            await channel.unary_unary(path)(b"", metadata=metadata, timeout=5)
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


def test_loopback_hosts() -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.9.9.9", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.1", "example.com"))


def test_an_exposed_daemon_with_an_open_repository_api_does_not_start() -> None:
    open_ = Restrictions()
    http = Restrictions.parse(["model-repository:k=v"], kind="api")
    grpc_ = Restrictions.parse(["model-repository:k=v"], kind="protocol", prefix="p-")
    with pytest.raises(ConfigurationError) as info:
        check_exposure("0.0.0.0", "explicit", open_, grpc_)
    assert "--http-restricted-api=model-repository:<header>=<secret>" in str(info.value)
    assert "--grpc-restricted-protocol" not in str(info.value)
    with pytest.raises(ConfigurationError, match="--grpc-restricted-protocol=model-repository"):
        check_exposure("10.1.2.3", "poll", http, open_)
    check_exposure("0.0.0.0", "explicit", http, grpc_)  # restricted on both: starts
    check_exposure("0.0.0.0", "none", open_, open_)  # the container's default: starts
    check_exposure("127.0.0.1", "explicit", open_, open_)  # loopback: starts
    check_exposure("0.0.0.0", "explicit", open_, open_, allow_unrestricted=True)


def test_client_shared_memory_off_loopback_needs_its_group_restricted() -> None:
    open_ = Restrictions()
    shm = Restrictions.parse(["shared-memory:k=v"], kind="api")
    shm_grpc = Restrictions.parse(["shared-memory:k=v"], kind="protocol", prefix="p-")
    with pytest.raises(ConfigurationError) as info:
        check_exposure("0.0.0.0", "none", open_, shm_grpc, client_shm=True)
    assert "--allow-client-shm lets any client map this machine's shared memory" in str(info.value)
    assert "--http-restricted-api=shared-memory:<header>=<secret>" in str(info.value)
    check_exposure("0.0.0.0", "none", shm, shm_grpc, client_shm=True)
    check_exposure("127.0.0.1", "none", open_, open_, client_shm=True)
    check_exposure("0.0.0.0", "none", open_, open_, client_shm=False)


def test_restrictions_and_tls_are_refused_with_ray_where_they_would_hold_nowhere() -> None:
    from model_runtime.server.daemon.options import options_from_args
    from model_runtime.server.daemon.serve import build_parser

    args = build_parser().parse_args(["--ray", "--http-restricted-api", "inference:k=v"])
    with pytest.raises(ConfigurationError, match="--http-restricted-api: not with --ray"):
        options_from_args(args)

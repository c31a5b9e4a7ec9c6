"""Who may do what: Triton's restricted API groups, checked in one place per protocol.

An operator restricts groups of the API to requests that carry a header with an exact value,
with Triton's flags and syntax (``--http-restricted-api=<api>[,<api>...]:<key>=<value>``,
``--grpc-restricted-protocol=<protocol>[,...]:<key>=<value>``, repeatable, a group in one rule
at most). The groups are Triton's (:data:`GROUPS`); every HTTP route and every gRPC method of
the daemon belongs to exactly one (:data:`GRPC_GROUPS`, and the routes' own table in
:mod:`model_runtime.server.http.routes`), and a test walks the router and the service's descriptor
so
that none is left out. A request of a restricted group without the exact value is refused
before anything else looks at it, in Triton's words: over HTTP 403 ``This API is restricted,
expecting header 'KEY'``; over gRPC UNAVAILABLE ``This protocol is restricted, expecting header
'triton-grpc-protocol-KEY'`` (Triton prefixes the gRPC key so). Refusals are counted in
``model_runtime_requests_restricted_total`` by protocol and group.

Where Triton has no group for a route of ours, it is put with its kind: ``/metrics`` (Triton
serves it on a port of its own) is ``statistics``.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from model_runtime.errors import ConfigurationError

__all__ = [
    "GROUPS",
    "GRPC_GROUPS",
    "GRPC_KEY_PREFIX",
    "Restriction",
    "RestrictionCounter",
    "Restrictions",
    "grpc_interceptor",
    "grpc_refusal",
    "http_middleware",
]

#: Triton's restricted API groups (``RESTRICTED_CATEGORY_NAMES``).
GROUPS = (
    "health",
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
)
#: Triton's prefix of a gRPC restriction's key (``kRestrictedProtocolHeaderTemplate``).
GRPC_KEY_PREFIX = "triton-grpc-protocol-"
_SERVICE = "/inference.GRPCInferenceService/"
#: Every method of Triton's ``GRPCInferenceService`` -> its group (as Triton's gRPC server).
GRPC_GROUPS: dict[str, str] = {
    "ServerLive": "health",
    "ServerReady": "health",
    "ModelReady": "health",
    "ServerMetadata": "metadata",
    "ModelMetadata": "metadata",
    "ModelInfer": "inference",
    "ModelStreamInfer": "inference",
    "ModelConfig": "model-config",
    "ModelStatistics": "statistics",
    "RepositoryIndex": "model-repository",
    "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    "SystemSharedMemoryStatus": "shared-memory",
    "SystemSharedMemoryRegister": "shared-memory",
    "SystemSharedMemoryUnregister": "shared-memory",
    "CudaSharedMemoryStatus": "shared-memory",
    "CudaSharedMemoryRegister": "shared-memory",
    "CudaSharedMemoryUnregister": "shared-memory",
    "TraceSetting": "trace",
    "LogSettings": "logging",
}


@dataclass(frozen=True, slots=True)
class Restriction:
    """A request of the group must carry header ``key`` with exactly ``value``."""

    key: str
    value: str

    def allows(self, value: str | None) -> bool:
        """Whether a request whose header ``key`` is ``value`` (None: absent) may pass
        (compared in constant time: the value is a secret)."""
        return value is not None and hmac.compare_digest(value.encode(), self.value.encode())


class Restrictions:
    """One protocol's restricted groups (empty: nothing is restricted)."""

    __slots__ = ("_rules",)

    def __init__(self, rules: Mapping[str, Restriction] | None = None) -> None:
        self._rules = dict(rules or {})

    @classmethod
    def parse(cls, flags: Iterable[str], *, kind: str, prefix: str = "") -> Restrictions:
        """Rules from Triton-style flag values ``<group>[,<group>...]:<key>=<value>``;
        ``kind`` is Triton's word in its errors (``api``, ``protocol``), ``prefix`` is put
        before each key (gRPC's :data:`GRPC_KEY_PREFIX`).

        Raises:
            ConfigurationError: a malformed value, an unknown group, or a group in two rules.
        """
        rules: dict[str, Restriction] = {}
        for flag in flags:
            groups, colon, setting = flag.partition(":")
            key, eq, value = setting.partition("=")
            if not colon or not eq or not groups or not key.strip() or not value:
                raise ConfigurationError(
                    f"restricted {kind} option format is '<{kind}s>:<key>=<value>', got {flag!r}"
                )
            for group in (g.strip() for g in groups.split(",")):
                if group not in GROUPS:
                    known = ", ".join(GROUPS)
                    raise ConfigurationError(
                        f"unknown restricted {kind} '{group}' (one of: {known})"
                    )
                if group in rules:
                    raise ConfigurationError(
                        f"restricted {kind} '{group}' can not be specified in multiple config "
                        "groups"
                    )
                rules[group] = Restriction(prefix + key.strip().lower(), value)
        return cls(rules)

    def __bool__(self) -> bool:
        return bool(self._rules)

    def get(self, group: str) -> Restriction | None:
        """The restriction on ``group`` (None: it is open)."""
        return self._rules.get(group)

    def refuses(self, group: str, header: Callable[[str], str | None]) -> str | None:
        """The header a request of ``group`` lacks (``header(name)`` reads its headers), or
        None when it may pass."""
        rule = self._rules.get(group)
        if rule is None or rule.allows(header(rule.key)):
            return None
        return rule.key


class RestrictionCounter:
    """``model_runtime_requests_restricted_total{protocol, group}``: requests refused for a
    missing or wrong restriction header."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.counter = Counter(
            "model_runtime_requests_restricted",
            "Requests refused for lack of a restricted API group's header",
            ["protocol", "group"],
            registry=registry,
        )

    def refused(self, protocol: str, group: str | None) -> None:
        """Count one refusal."""
        self.counter.labels(protocol, group or "unknown").inc()


def http_middleware(
    restrictions: Restrictions, counter: RestrictionCounter, group_of: Callable[[Any], str | None]
) -> Any:
    """The HTTP listener's check (an aiohttp middleware, the first one): ``group_of(request)``
    is its route's group (None: no route of ours, answered 404 with nothing run)."""

    @web.middleware
    async def restricted(request: web.Request, handler: Any) -> web.StreamResponse:
        group = group_of(request)
        missing = None if group is None else restrictions.refuses(group, request.headers.get)
        if missing is None:
            response: web.StreamResponse = await handler(request)
            return response
        counter.refused("http", group)
        body = orjson.dumps({"error": f"This API is restricted, expecting header '{missing}'"})
        return web.Response(status=403, body=body, content_type="application/json")

    return restricted


def grpc_interceptor(
    restrictions: Restrictions, counter: RestrictionCounter
) -> grpc.aio.ServerInterceptor:
    """The gRPC listener's check: every call's method is looked up in :data:`GRPC_GROUPS`
    and refused, before its handler runs, without the group's header."""
    return _Interceptor(restrictions, counter)


class _Interceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(self, restrictions: Restrictions, counter: RestrictionCounter) -> None:
        self._restrictions = restrictions
        self._counter = counter

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        method: str = details.method
        if not self._restrictions or not method.startswith(_SERVICE):
            return await continuation(details)  # another service's: not found, nothing run
        metadata = dict(details.invocation_metadata or ())
        refused = grpc_refusal(self._restrictions, method.removeprefix(_SERVICE), metadata.get)
        if refused is None:
            return await continuation(details)
        message, group = refused
        self._counter.refused("grpc", group)
        return _refusing(await continuation(details), message)


def grpc_refusal(
    restrictions: Restrictions, name: str, header: Callable[[str], str | None]
) -> tuple[str, str | None] | None:
    """Why a call of the service's method ``name`` whose metadata ``header`` reads is refused,
    and its group (None: allowed). A method with no group is closed, not open."""
    group = GRPC_GROUPS.get(name)
    if group is None:
        return f"This protocol is restricted: method '{name}' has no API group", None
    missing = restrictions.refuses(group, header)
    if missing is None:
        return None
    return f"This protocol is restricted, expecting header '{missing}'", group


def _refusing(handler: Any, message: str) -> Any:
    """A handler of the same shape as ``handler`` that answers UNAVAILABLE ``message``."""

    async def unary(request: Any, context: Any) -> None:
        await context.abort(grpc.StatusCode.UNAVAILABLE, message)

    async def stream(request_iterator: Any, context: Any) -> None:
        await context.abort(grpc.StatusCode.UNAVAILABLE, message)

    if handler is None or handler.request_streaming or handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(stream)
    return grpc.unary_unary_rpc_method_handler(
        unary,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )

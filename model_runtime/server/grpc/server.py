"""Start and stop the daemon's gRPC listener (grpc.aio, on the daemon's event loop).

Its limits mirror the HTTP listener's: a message larger than the daemon's body-size limit is
refused by grpcio itself (RESOURCE_EXHAUSTED) before a handler runs; idle connections close
after the keep-alive timeout; each connection may carry a bounded number of concurrent streams;
unary calls are under a :class:`~model_runtime.server.grpc.budget.CallBudget` (calls being
computed, bytes in flight, a write timeout; past a limit a call is refused at once with
RESOURCE_EXHAUSTED, never queued), so a flood costs refusals, not memory.
"""

from __future__ import annotations

import asyncio
import resource
from dataclasses import dataclass
from typing import Any

import grpc

from model_runtime.server.grpc.budget import CallBudget, quiet_unwritten_answers
from model_runtime.server.grpc.guard import install_method_guard
from model_runtime.server.grpc.h2server import H2Listener, start_h2_listener
from model_runtime.server.grpc.listensock import ListenerSettings
from model_runtime.server.grpc.ngserver import NgListener, start_nghttp2_listener
from model_runtime.server.grpc.service import InferenceServicer, UnsupportedMethods
from model_runtime.server.inference.plane import DataPlane
from model_runtime.server.security.fdlimit import FD_RESERVE
from model_runtime.server.security.restrict import Restrictions, grpc_interceptor
from model_runtime.server.security.tls import TLSFiles
from model_runtime.server.triton import grpc_service_pb2_grpc as pb_grpc

__all__ = [
    "REGISTERED_METHODS",
    "TRANSPORTS",
    "GrpcLimits",
    "call_budget",
    "grpc_max_connections",
    "service_handlers",
    "start_grpc_server",
    "start_native_grpc_server",
]

#: The gRPC transports: ``nghttp2`` (libnghttp2 on the event loop, :mod:`.ngserver`: the
#: daemon's default), ``native`` (h2corn, :mod:`.h2server`) and ``aio`` (grpcio's asyncio).
TRANSPORTS = ("nghttp2", "native", "aio")


#: The methods registered with grpc.aio (see :func:`start_grpc_server`): the per-request one.
REGISTERED_METHODS = ("ModelInfer",)


class _Capture:
    """Stands in for a server to take what the generated ``add_..._to_server`` registers."""

    def __init__(self) -> None:
        self.generic: tuple[Any, ...] = ()
        self.service = ""
        self.handlers: dict[str, Any] = {}

    def add_generic_rpc_handlers(self, handlers: tuple[Any, ...]) -> None:
        self.generic = tuple(handlers)

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        self.service, self.handlers = service, dict(handlers)


def service_handlers(servicer: InferenceServicer) -> tuple[str, dict[str, Any], tuple[Any, ...]]:
    """The service's name, its method handlers by method name, and the generic handler(s)
    that find every method by its full name, as the generated code makes them."""
    capture = _Capture()
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, capture)  # type: ignore[no-untyped-call]
    return capture.service, capture.handlers, capture.generic


@dataclass(frozen=True, slots=True)
class GrpcLimits:
    """Limits of the gRPC listener: ``max_message_size`` bytes per received message (answers
    are as large as the model makes them), ``idle_timeout`` seconds before an idle connection
    closes, ``max_streams`` concurrent calls per connection (HTTP/2 streams); for unary calls
    (:class:`~model_runtime.server.grpc.budget.CallBudget`): ``max_calls`` calls being
    computed in the server, ``write_timeout`` seconds for an answer to be written,
    ``max_bytes_in_flight`` bytes of calls in flight. ``max_connections``: open connections
    (past it grpc closes a new one at once; None: :func:`grpc_max_connections` of no HTTP
    share)."""

    max_message_size: int = 64 << 20
    idle_timeout: float = 75.0
    max_streams: int = 256
    max_calls: int = 4096
    write_timeout: float = 10.0
    max_bytes_in_flight: int = 128 << 20
    max_connections: int | None = None


async def start_grpc_server(
    plane: DataPlane,
    host: str,
    port: int,
    limits: GrpcLimits | None = None,
    restrictions: Restrictions | None = None,
    credentials: Any = None,
    reuse_port: bool = False,
    budget: CallBudget | None = None,
) -> tuple[Any, int]:
    """Start a grpc.aio server of ``plane``'s models on ``host:port`` (0: a free port);
    return it and the port it is bound to. Stop it with ``await grpc_server.stop(grace)``.
    ``restrictions``: its restricted API groups (Triton's --grpc-restricted-protocol),
    checked by an interceptor before any handler runs. ``credentials``: grpcio's server
    credentials for TLS (None: plaintext). ``reuse_port``: bind with SO_REUSEPORT, so that
    other daemons may share the port (off: a port in use is an error, as for HTTP).
    ``budget``: what unary calls may hold (None: a new one of ``limits``); the server keeps it
    as its ``budget`` attribute.

    Raises:
        OSError: the address cannot be bound.
    """
    limits = limits or GrpcLimits()
    max_connections = limits.max_connections or grpc_max_connections(0)
    install_method_guard(asyncio.get_running_loop())  # a bad method name costs its call only
    quiet_unwritten_answers()
    interceptor = grpc_interceptor(restrictions or Restrictions(), plane.restricted)
    grpc_server = grpc.aio.server(
        interceptors=[interceptor] if restrictions else [],  # none: no cost per call
        options=[
            ("grpc.max_receive_message_length", limits.max_message_size),
            ("grpc.max_send_message_length", -1),  # answers are as large as the model makes them
            ("grpc.max_concurrent_streams", limits.max_streams),
            ("grpc.max_connection_idle_ms", int(limits.idle_timeout * 1000)),
            ("grpc.so_reuseport", 1 if reuse_port else 0),
            ("grpc.max_allowed_incoming_connections", max_connections),
        ],
        # Not grpc's own limit, which counts calls whose answers wait on their client: the
        # budget's (calls being computed; bytes held until written).
        maximum_concurrent_rpcs=None,
    )
    budget = budget or call_budget(limits)
    service, handlers, _ = service_handlers(InferenceServicer(plane))
    handlers = {name: _budgeted(handler, budget) for name, handler in handlers.items()}
    generic = (grpc.method_handlers_generic_handler(service, handlers),)
    # Only the hot method is registered: grpc.aio's accept loop waits on one pending call
    # per registered method (asyncio.wait over all of them) for every call it accepts, so
    # each registered method costs every call; the others are found by the generic handler.
    grpc_server.add_registered_method_handlers(
        service, {m: handlers[m] for m in REGISTERED_METHODS}
    )
    grpc_server.add_generic_rpc_handlers(generic)
    # Triton's methods we lack (shared memory, streaming) say so instead of "Method not found!".
    grpc_server.add_generic_rpc_handlers((UnsupportedMethods(),))
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        if credentials is None:
            bound = grpc_server.add_insecure_port(address)
        else:
            bound = grpc_server.add_secure_port(address, credentials)
    except RuntimeError as exc:  # grpcio reports a failed bind as RuntimeError
        raise OSError(f"cannot bind gRPC to {address}: {exc}") from exc
    if bound == 0:
        raise OSError(f"cannot bind gRPC to {address}")
    await grpc_server.start()
    grpc_server.budget = budget
    return grpc_server, bound


async def start_native_grpc_server(
    plane: DataPlane,
    host: str,
    port: int,
    limits: GrpcLimits | None = None,
    restrictions: Restrictions | None = None,
    tls: TLSFiles | None = None,
    reuse_port: bool = False,
    budget: CallBudget | None = None,
    backlog: int = 2048,
    transport: str = "nghttp2",
) -> tuple[H2Listener | NgListener, int]:
    """:func:`start_grpc_server`'s service, limits and budget on a native transport
    (``transport``: ``nghttp2``, :mod:`.ngserver`, with ``ModelInfer`` by callbacks,
    :mod:`.unary`; ``native``, h2corn, :mod:`.h2server`): every method on one port.
    ``tls``: the listener's TLS files (None: plaintext).

    Raises:
        OSError: the address cannot be bound.
    """
    limits = limits or GrpcLimits()
    budget = budget or call_budget(limits)
    servicer = InferenceServicer(plane)
    _, handlers, _ = service_handlers(servicer)
    handlers = {name: _budgeted(handler, budget) for name, handler in handlers.items()}
    # The hot method on the wire's bytes: parsed once, serialized once, sized by length.
    handlers["ModelInfer"] = grpc.unary_unary_rpc_method_handler(
        budget.wrap(servicer.model_infer_wire, len)
    )
    settings = ListenerSettings(
        host,
        port,
        max_message_size=limits.max_message_size,
        idle_timeout=limits.idle_timeout,
        max_streams=limits.max_streams,
        write_timeout=limits.write_timeout,
        max_connections=limits.max_connections or grpc_max_connections(0),
        restrictions=restrictions,
        counter=plane.restricted,
        tls=tls,
        reuse_port=reuse_port,
        backlog=backlog,
        budget=budget,
    )
    listener: H2Listener | NgListener
    if transport == "nghttp2":  # ModelInfer by callbacks where it can
        listener, bound = await start_nghttp2_listener(handlers, settings, plane)
    else:
        listener, bound = await start_h2_listener(handlers, settings)
    listener.budget = budget
    return listener, bound


def grpc_max_connections(http_connections: int, cap: int = 4096) -> int:
    """gRPC's connection limit: ``cap``, or what the soft open-file limit leaves once the
    daemon's own reserve and HTTP's ``http_connections`` are counted (at least 16), so that
    neither protocol takes the descriptors the other needs."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return cap
    return max(16, min(cap, soft - FD_RESERVE - http_connections))


def call_budget(limits: GrpcLimits) -> CallBudget:
    """A :class:`CallBudget` of ``limits``."""
    return CallBudget(
        write_timeout=limits.write_timeout,
        max_calls=limits.max_calls,
        max_bytes=limits.max_bytes_in_flight,
    )


def _budgeted(handler: Any, budget: CallBudget) -> Any:
    """``handler`` with its unary behaviour under ``budget`` (streaming ones as they are)."""
    if handler.request_streaming or handler.response_streaming:
        return handler
    return handler._replace(unary_unary=budget.wrap(handler.unary_unary))

"""Start and stop the daemon's gRPC listener (grpc.aio, on the daemon's event loop).

Its limits mirror the HTTP listener's: a message larger than the daemon's body-size limit is
refused by grpcio itself (RESOURCE_EXHAUSTED) before a handler runs; idle connections close
after the keep-alive timeout; each connection may carry a bounded number of concurrent streams
and the server a bounded number of calls in flight (past it a call is refused at once with
RESOURCE_EXHAUSTED, never queued), so a flood costs refusals, not memory.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import grpc

from model_runtime.server.app import InferenceServer
from model_runtime.server.grpc.guard import install_method_guard
from model_runtime.server.grpc.service import InferenceServicer, UnsupportedMethods
from model_runtime.server.restrict import Restrictions, grpc_interceptor
from model_runtime.server.triton import grpc_service_pb2_grpc as pb_grpc

__all__ = ["REGISTERED_METHODS", "GrpcLimits", "service_handlers", "start_grpc_server"]


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
    closes, ``max_streams`` concurrent calls per connection (HTTP/2 streams), ``max_calls``
    calls in flight in the server."""

    max_message_size: int = 64 << 20
    idle_timeout: float = 75.0
    max_streams: int = 256
    max_calls: int = 4096


async def start_grpc_server(
    server: InferenceServer,
    host: str,
    port: int,
    limits: GrpcLimits | None = None,
    restrictions: Restrictions | None = None,
    credentials: Any = None,
    reuse_port: bool = False,
) -> tuple[Any, int]:
    """Start a grpc.aio server of ``server``'s models on ``host:port`` (0: a free port);
    return it and the port it is bound to. Stop it with ``await grpc_server.stop(grace)``.
    ``restrictions``: its restricted API groups (Triton's --grpc-restricted-protocol),
    checked by an interceptor before any handler runs. ``credentials``: grpcio's server
    credentials for TLS (None: plaintext). ``reuse_port``: bind with SO_REUSEPORT, so that
    other daemons may share the port (off: a port in use is an error, as for HTTP).

    Raises:
        OSError: the address cannot be bound.
    """
    limits = limits or GrpcLimits()
    install_method_guard(asyncio.get_running_loop())  # a bad method name costs its call only
    interceptor = grpc_interceptor(restrictions or Restrictions(), server.restricted)
    grpc_server = grpc.aio.server(
        interceptors=[interceptor] if restrictions else [],  # none: no cost per call
        options=[
            ("grpc.max_receive_message_length", limits.max_message_size),
            ("grpc.max_send_message_length", -1),  # answers are as large as the model makes them
            ("grpc.max_concurrent_streams", limits.max_streams),
            ("grpc.max_connection_idle_ms", int(limits.idle_timeout * 1000)),
            ("grpc.so_reuseport", 1 if reuse_port else 0),
        ],
        maximum_concurrent_rpcs=limits.max_calls,
    )
    service, handlers, generic = service_handlers(InferenceServicer(server))
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
    return grpc_server, bound

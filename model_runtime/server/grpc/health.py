"""gRPC's standard health service, ``grpc.health.v1.Health/Check``, as Triton answers it.

Kubernetes' gRPC probes and ``grpc_health_probe`` call it. As Triton does, the answer is the
server's readiness (SERVING when ``ServerReady`` says ready, NOT_SERVING otherwise) whatever
service the request names; it is in the ``health`` API group; ``Watch`` is not served. The two
messages are built here from their field numbers (``grpcio-health-checking`` is not a
dependency), in a descriptor pool of their own.
"""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from model_runtime.server.triton import grpc_service_pb2 as pb

__all__ = ["HEALTH_PATH", "HealthCheckRequest", "HealthCheckResponse", "health_check_handler"]

#: The ``:path`` prefix of the health service.
HEALTH_PATH = b"/grpc.health.v1.Health/"


def _messages() -> tuple[Any, Any]:
    f = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name="model_runtime/grpc/health.proto", package="grpc.health.v1", syntax="proto3"
    )
    request = proto.message_type.add(name="HealthCheckRequest")
    request.field.add(name="service", number=1, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    response = proto.message_type.add(name="HealthCheckResponse")
    status = response.enum_type.add(name="ServingStatus")
    for number, name in enumerate(("UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN")):
        status.value.add(name=name, number=number)
    response.field.add(
        name="status", number=1, type=f.TYPE_ENUM, label=f.LABEL_OPTIONAL,
        type_name=".grpc.health.v1.HealthCheckResponse.ServingStatus",
    )  # fmt: skip
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    request_class, response_class = (
        message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{proto.package}.{name}"))
        for name in ("HealthCheckRequest", "HealthCheckResponse")
    )
    return request_class, response_class


HealthCheckRequest, HealthCheckResponse = _messages()
_SERVING, _NOT_SERVING = 1, 2


def health_check_handler(ready: Any) -> Any:
    """``Check``'s method handler over ``ready``, the service's ``ServerReady`` handler."""

    async def check(request: Any, context: Any) -> Any:
        answer = await ready.unary_unary(pb.ServerReadyRequest(), context)
        return HealthCheckResponse(status=_SERVING if answer.ready else _NOT_SERVING)

    return grpc.unary_unary_rpc_method_handler(
        check, HealthCheckRequest.FromString, HealthCheckResponse.SerializeToString
    )

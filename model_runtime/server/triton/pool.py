"""The descriptor pool of our Triton protobuf messages.

Our generated ``*_pb2`` modules register their files here instead of protobuf's default pool:
``tritonclient.grpc`` registers Triton's own ``model_config.proto`` and ``grpc_service.proto``
(the same package, ``inference``, and the same message names) in the default pool, and one
process (a test, an application that embeds the runtime and talks to another server) may hold
both. Two pools keep the two sets of classes apart; on the wire they are the same messages.
``generate.sh`` rewrites protoc's ``_descriptor_pool.Default()`` into :data:`POOL`.
"""

from __future__ import annotations

from google.protobuf import descriptor_pool

__all__ = ["POOL"]

POOL = descriptor_pool.DescriptorPool()

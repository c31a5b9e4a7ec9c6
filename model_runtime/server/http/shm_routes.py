"""Triton's shared memory routes over HTTP, answered from the :mod:`.shm` registry::

    GET  /v2/systemsharedmemory[/region/{name}]/status
    POST /v2/systemsharedmemory/region/{name}/register     {"key", "offset", "byte_size"}
    POST /v2/systemsharedmemory[/region/{name}]/unregister
    ... and the same under /v2/cudasharedmemory, answered as Triton built without GPUs answers

A status is a JSON list of ``{"name", "key", "offset", "byte_size"}`` (CUDA: always empty); a
register or unregister answers 200 with an empty body. A status asked for with POST, or the
others with GET, is 405 ``Method Not Allowed``. Errors are Triton's texts and codes (raised by
the registry, answered by the server's middleware through
:func:`~model_runtime.server.answers.status_of`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any

import orjson
from aiohttp import web

from model_runtime.errors import ProtocolError, SharedMemoryArgumentError
from model_runtime.server.answers import HTTPError
from model_runtime.server.tensors.shm import SharedMemoryRegistry

__all__ = ["SharedMemoryRoutes"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_ACTION = "{action:status|register|unregister}"
_U64 = 2**64 - 1


class SharedMemoryRoutes:
    """The HTTP handlers of Triton's system and CUDA shared memory extensions."""

    def __init__(self, registry: SharedMemoryRegistry) -> None:
        self.registry = registry

    def routes(self) -> list[tuple[str, str, Handler]]:
        """(method, path, handler) for the application's router."""
        out: list[tuple[str, str, Handler]] = []
        for kind, handler in (("system", self.system), ("cuda", self.cuda)):
            for base in (f"/v2/{kind}sharedmemory", f"/v2/{kind}sharedmemory/region/{{region}}"):
                out += [(method, f"{base}/{_ACTION}", handler) for method in ("GET", "POST")]
        return out

    async def system(self, request: web.Request) -> web.Response:
        """Status, register or unregister system shared memory regions.

        Raises:
            HTTPError: 405 for the wrong method.
            ProtocolError: a register body that is not JSON, lacks ``key`` or ``byte_size``, or
                has a value of the wrong type.
            SharedMemoryError: what the registry refuses (Triton's texts and codes).
        """
        action, region = _action(request)
        registry = self.registry
        if action == "status":
            return _json([asdict(s) for s in registry.status(region)])
        if action == "unregister":
            registry.unregister(region)
            return _ok()
        registry.check_enabled()  # Triton's order: refused before the body is read
        if not region:
            raise SharedMemoryArgumentError(
                "'region name' is necessary to register system shared memory region"
            )
        doc = _body(await request.read())
        if "key" not in doc:
            raise ProtocolError("Shared memory register request has no 'key' field")
        if "byte_size" not in doc:
            raise ProtocolError("Shared memory register request has no 'byte_size' field")
        key = doc["key"]
        if not isinstance(key, str):
            raise ProtocolError("Unable to parse 'key': expected a string")
        offset, byte_size = _u64(doc, "offset"), _u64(doc, "byte_size")
        registry.register(region, key, offset, byte_size)
        return _ok()

    async def cuda(self, request: web.Request) -> web.Response:
        """CUDA shared memory: no region is ever registered (this server has no GPUs).

        Raises:
            HTTPError: 405 for the wrong method.
            SharedMemoryError: a register, or a status of a name (Triton's texts and codes).
        """
        action, region = _action(request)
        if action == "status":
            return _json(self.registry.cuda_status(region))
        if action == "register":
            self.registry.cuda_register(region)
        self.registry.cuda_unregister(region)
        return _ok()


def _action(request: web.Request) -> tuple[str, str]:
    action = request.match_info["action"]
    if (action == "status") != (request.method == "GET"):
        raise HTTPError(405, "Method Not Allowed", "method_not_allowed")
    return action, request.match_info.get("region", "")


def _body(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        return {}
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"the register request is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ProtocolError("a register request is a JSON object: key, offset, byte_size")
    return doc


def _u64(doc: dict[str, Any], field: str) -> int:
    value = doc.get(field, 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _U64:
        raise ProtocolError(f"Unable to parse '{field}': expected an unsigned 64-bit integer")
    return value


def _json(doc: Any) -> web.Response:
    return web.Response(body=orjson.dumps(doc), content_type="application/json")


def _ok() -> web.Response:
    return web.Response(content_type="application/json")

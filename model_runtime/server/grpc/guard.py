"""Keep a call whose method name is not UTF-8 from stopping grpc.aio's server.

grpc.aio's accept loop (``AioServer._server_main_loop``) decodes the ``:path`` of each call to
an unregistered method with ``bytes.decode()`` and, on a ``UnicodeDecodeError``, ends; its
crash handler then shuts the whole server down. One HEADERS frame would close the port for
every client. :func:`install_method_guard` puts a check between grpc's accept of such a call
and that loop: a call whose method name does not decode is dropped (grpc cancels it: its
client's stream is reset) and reported to the loop as a failed accept, which the loop
survives (it asks grpc for the next call). Calls to registered methods never reach the check.

The check is a task factory on the event loop, because grpc.aio gives no hook before its
loop reads the name; it recognises grpc's accept coroutine by its qualified name and passes
every other coroutine through unchanged. ``tests/attack/test_grpc_bad_path.py`` fails if a
grpcio upgrade moves the accept out of its reach.
"""

from __future__ import annotations

import asyncio
import ctypes
from collections.abc import Coroutine, Generator
from typing import Any

import grpc
from grpc._cython import cygrpc

from model_runtime.server.observability.ratelog import RateLimitedLog

__all__ = ["ACCEPT_QUALNAME", "VERIFIED_GRPCIO", "MethodGuard", "install_method_guard"]

#: The qualified name of grpc.aio's coroutine that accepts a call to an unregistered method.
ACCEPT_QUALNAME = "AioServer._request_call"

_AcceptFailed: type[Exception] = cygrpc._RequestCallError


class MethodGuard:
    """The check installed on one event loop: counts the calls it dropped."""

    def __init__(self) -> None:
        self.dropped = 0
        self._log = RateLimitedLog("grpc_call_dropped_bad_method_name")

    async def checked(self, accept: Coroutine[Any, Any, Any]) -> Any:
        """Await grpc's accept; give its call on if its method name is UTF-8.

        Raises:
            cygrpc._RequestCallError: the name is not UTF-8 (the call is dropped).
        """
        rpc_state = await accept
        method = _method_name(rpc_state)
        try:
            method.decode()
        except UnicodeDecodeError:
            self.dropped += 1
            self._log(method=repr(method[:64]))
            del rpc_state  # grpc cancels a call no one holds: its stream is reset
            raise _AcceptFailed() from None
        return rpc_state


# ``RPCState`` keeps the method name in a C struct Python cannot read: a ``grpc_slice`` at
# byte 32 of the object (PyObject head 16, Cython's vtable 8, ``grpc_call*`` 8), which is
# either refcounted (refcount pointer, length, bytes pointer) or inlined (NULL, a length byte,
# up to 23 bytes). Read only for grpcio versions whose layout was checked.
_SLICE_OFFSET = 32
_INLINED_MAX = 23
_LONGEST_NAME = 1 << 16
VERIFIED_GRPCIO = ("1.85.",)


def _method_name(rpc_state: Any) -> bytes:
    at = id(rpc_state) + _SLICE_OFFSET
    refcount, length, data = (ctypes.c_size_t * 3).from_address(at)
    if refcount == 0:
        length = ctypes.c_uint8.from_address(at + 8).value
        return ctypes.string_at(at + 9, min(length, _INLINED_MAX))
    if not data or length > _LONGEST_NAME:
        return b""
    return ctypes.string_at(data, length)


def install_method_guard(loop: asyncio.AbstractEventLoop) -> MethodGuard | None:
    """Install the check on ``loop`` (once; later calls return the same guard), keeping any
    task factory already there for every task. None: this grpcio's layout is not one checked
    (:data:`VERIFIED_GRPCIO`); the listener's supervision restarts a server that stops."""
    if not grpc.__version__.startswith(VERIFIED_GRPCIO):
        return None
    existing = getattr(loop, "_model_runtime_method_guard", None)
    if isinstance(existing, MethodGuard):
        return existing
    guard = MethodGuard()
    previous = loop.get_task_factory()

    def factory(
        loop: asyncio.AbstractEventLoop,
        coro: Generator[Any, None, Any] | Coroutine[Any, Any, Any],
        **kwargs: Any,
    ) -> asyncio.Future[Any]:
        if getattr(coro, "__qualname__", None) == ACCEPT_QUALNAME:
            coro = guard.checked(coro)  # type: ignore[arg-type]
        if previous is not None:
            return previous(loop, coro, **kwargs)  # type: ignore[arg-type]
        return asyncio.Task(coro, loop=loop, **kwargs)  # type: ignore[arg-type]

    loop.set_task_factory(factory)  # type: ignore[arg-type]
    loop._model_runtime_method_guard = guard  # type: ignore[attr-defined]
    return guard

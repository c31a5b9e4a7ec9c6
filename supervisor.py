"""The runtime's supervision tree (DESIGN §3): the process-wide root and what hangs under it.

The generic OTP machinery (strategies, restart types, intensity, backoff) lives in
:mod:`actors.supervision`; its names are re-exported here so ``from supervisor import ChildSpec``
keeps working. :class:`Runtime` is the process-wide root: one per event loop, hosted in a task
of its own, with the DeviceManager actor and one supervisor per model under it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import ClassVar

import anyio
import structlog

from actors.actor import ActorRef
from actors.device.manager_actor import DeviceManagerActor
from actors.device.messages import DeviceManagerMessage
from actors.supervision import (
    Backoff,
    Child,
    ChildInfo,
    ChildSpec,
    ChildState,
    EventKind,
    Restart,
    Strategy,
    Supervisor,
    SupervisorEvent,
)
from model_runtime.errors import ActorStoppedError

__all__ = [
    "Backoff",
    "Child",
    "ChildInfo",
    "ChildSpec",
    "ChildState",
    "EventKind",
    "Restart",
    "Runtime",
    "Strategy",
    "Supervisor",
    "SupervisorEvent",
]


# -- the process-wide root ------------------------------------------------------------------

log = structlog.get_logger(__name__)

#: Seconds a model subtree may take to stop when it is removed (its facade drained it first).
_MODEL_SHUTDOWN = 60.0


class Runtime:
    """The root of the runtime's tree on one event loop (DESIGN.md §3)::

        Runtime (root, one_for_one)
         ├─ device-manager     the DeviceManager actor
         └─ model ...          one supervisor per ModelRunner (temporary: never restarted)

    The root runs in a task of its own on the event loop, outside every caller's task, so a
    runner may be started in one task and stopped in another, and a failure inside the tree
    never reaches a caller's task: a model subtree that gives up is reported to its facade
    (``on_exit``), which answers its callers with typed errors. Facades are clients:
    :meth:`acquire` returns the loop's root (starting it on first use) and :meth:`release`
    gives it back; the root stops when its last client has released it. All of this happens on
    the loop's own thread, so the count needs no lock; synchronous callers reach the tree
    through one shared blocking portal (:mod:`model_runtime.blocking`).
    """

    _roots: ClassVar[dict[asyncio.AbstractEventLoop, Runtime]] = {}

    def __init__(self) -> None:
        self.supervisor = Supervisor(
            "runtime",
            [ChildSpec("device-manager", DeviceManagerActor)],
            strategy=Strategy.ONE_FOR_ONE,
            on_event=self._on_event,
        )
        self._clients = 0
        self._ready = anyio.Event()
        self._done = anyio.Event()
        self._error: BaseException | None = None
        self._on_exit: dict[str, Callable[[BaseException | None], None]] = {}
        self._task: asyncio.Task[None] | None = None

    # -- clients -------------------------------------------------------------------------------

    @classmethod
    async def acquire(cls) -> Runtime:
        """The root of the running event loop, started if need be; call :meth:`release` once
        for every acquire.

        Raises:
            SupervisorEscalationError: the root could not start.
        """
        loop = asyncio.get_running_loop()
        root = cls._roots.get(loop)
        if root is None:
            root = cls._roots[loop] = cls()
            root._task = loop.create_task(root._host(loop), name="model-runtime-root")
        root._clients += 1
        try:
            await root._ready.wait()
            if root._error is not None:
                raise root._error
        except BaseException:
            await root.release()
            raise
        return root

    async def release(self) -> None:
        """Give the root back; the last client stops it (and waits for it to stop).

        Raises:
            nothing: cancelling the caller only stops the waiting.
        """
        self._clients -= 1
        if self._clients > 0:
            return
        for loop, root in list(Runtime._roots.items()):
            if root is self:  # a later acquire starts a fresh root
                del Runtime._roots[loop]
        with anyio.CancelScope(shield=True):
            await self.supervisor.stop()
            await self._done.wait()

    @classmethod
    def running(cls) -> Runtime | None:
        """The running event loop's root, if it has one (for inspection)."""
        return cls._roots.get(asyncio.get_running_loop())

    # -- models ------------------------------------------------------------------------------

    async def add_model(
        self,
        model_id: str,
        model: Supervisor,
        on_exit: Callable[[BaseException | None], None] | None = None,
    ) -> None:
        """Start ``model``'s subtree under the root; ``on_exit`` hears if it ends by itself.

        Raises:
            SupervisorEscalationError: the subtree could not start (not added).
            ValueError: a model with that id is in the tree.
        """
        spec = ChildSpec(model_id, lambda: model, Restart.TEMPORARY, shutdown=_MODEL_SHUTDOWN)
        if on_exit is not None:
            self._on_exit[model_id] = on_exit
        try:
            await self.supervisor.start_child(spec)
        except BaseException:
            self._on_exit.pop(model_id, None)
            raise

    async def remove_model(self, model_id: str) -> None:
        """Stop ``model_id``'s subtree (each child within its shutdown) and forget it.

        Raises:
            nothing: a model that is not in the tree (or a root that stopped) is ignored.
        """
        self._on_exit.pop(model_id, None)
        with anyio.CancelScope(shield=True):
            try:
                await self.supervisor.delete_child(model_id)
            except (KeyError, ActorStoppedError):
                pass

    @property
    def device_manager(self) -> ActorRef[DeviceManagerMessage]:
        """The DeviceManager actor (its current incarnation).

        Raises:
            ActorStoppedError: it is being restarted, or the root has stopped.
        """
        ref: ActorRef[DeviceManagerMessage] = self.supervisor.ref("device-manager")
        return ref

    def models(self) -> list[ChildInfo]:
        """The model subtrees under the root (the device manager excluded)."""
        return [c for c in self.supervisor.children() if c.id != "device-manager"]

    # -- the host ----------------------------------------------------------------------------

    async def _host(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            async with anyio.create_task_group() as tg:
                await tg.start(self.supervisor.run)
                self._ready.set()
        except Exception as exc:  # the root itself gave up: every model is gone
            self._error = exc
            log.error("runtime_root_failed", error=repr(exc))
        finally:
            if Runtime._roots.get(loop) is self:
                del Runtime._roots[loop]
            for on_exit in self._on_exit.values():
                on_exit(self._error or ActorStoppedError("the runtime root stopped"))
            self._on_exit.clear()
            self._ready.set()
            self._done.set()

    def _on_event(self, event: SupervisorEvent) -> None:
        if event.kind == "child_exited":
            on_exit = self._on_exit.pop(event.child_id, None)
            if on_exit is not None:
                on_exit(event.reason)

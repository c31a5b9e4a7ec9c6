"""The DeviceManager actor: the process-wide :class:`DeviceManager` in the supervisor tree.

Attaching may wait (per the wait strategy), so each ``Attach`` runs as a task: the actor keeps
answering ``ListDevices`` and other attaches meanwhile. Devices it hands out belong to the asker
(normally a Device actor, which detaches on stop); the manager does not detach them when it
stops, so restarting it does not pull devices from under running replicas.

It also owns one Device actor per attached device that sessions share (``OpenDevice`` /
``CloseDevice``, counted per user): the seed's sessions time-share a device, through that
actor's single worker thread. A Device actor that dies is forgotten (its users see
``ActorStoppedError`` and may open it again); it never takes the manager down.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc

from actors.actor import ActorRef, Envelope, Stop
from actors.clock import Clock
from actors.device._deferred import DeferringActor
from actors.device.actor import Device
from actors.device.manager import AttachedDevice, DeviceManager
from actors.device.messages import (
    Attach,
    CloseDevice,
    DetachDevice,
    DeviceManagerMessage,
    ListDevices,
    OpenDevice,
)
from model_runtime.errors import (
    ActorStoppedError,
    DeviceNotFoundError,
    DeviceStateError,
    DeviceUnavailableError,
)

__all__ = ["DeviceManagerActor"]


@dataclass(slots=True)
class _Shared:
    ref: ActorRef[Any]
    users: int


class DeviceManagerActor(DeferringActor[DeviceManagerMessage]):
    """Wraps a :class:`DeviceManager` (default: from the environment) as an actor."""

    def __init__(
        self,
        manager: DeviceManager | None = None,
        *,
        clock: Clock | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(name or "device-manager", clock=clock)
        self.manager = manager if manager is not None else DeviceManager(clock=self.clock)
        self._shared: dict[int, _Shared] = {}  # id(AttachedDevice) -> its Device actor

    async def _dispatch(self, envelope: Envelope) -> None:
        message = envelope.message
        match message:
            case Attach():
                await self.defer(envelope, lambda: self._attach(message))
            case _:
                await super()._dispatch(envelope)

    async def handle(self, message: DeviceManagerMessage) -> Any:
        match message:
            case ListDevices():
                return self.manager.list_devices()
            case DetachDevice(device):
                device.detach()
                return None
            case OpenDevice(device):
                return await self._open(device)
            case CloseDevice(device):
                await self._close(device)
                return None
        return await super().handle(message)

    async def _open(self, device: AttachedDevice) -> ActorRef[Any]:
        shared = self._shared.get(id(device))
        if shared is not None and shared.ref.is_alive:
            shared.users += 1
            return shared.ref
        if not device.is_attached:
            raise DeviceStateError(f"{device!r} is detached")
        actor = Device(
            device, replica=0, detach_on_stop=False, clock=self.clock, name=f"device-{device.id}"
        )
        tg = await self.task_group()
        ref: ActorRef[Any] = await tg.start(self._host, actor, device)
        self._shared[id(device)] = _Shared(ref, 1)
        return ref

    async def _host(
        self, actor: Any, device: AttachedDevice, *, task_status: anyio.abc.TaskStatus[Any]
    ) -> None:
        """Run one shared Device actor; its death is its users' business, not the manager's."""
        try:
            await actor.run(task_status=task_status)
        except Exception as exc:
            self.log.warning("shared_device_died", device=device.id, error=repr(exc))
        finally:
            shared = self._shared.get(id(device))
            if shared is not None and not shared.ref.is_alive:
                del self._shared[id(device)]

    async def _close(self, device: AttachedDevice) -> None:
        shared = self._shared.get(id(device))
        if shared is None:
            return
        shared.users -= 1
        if shared.users > 0:
            return
        del self._shared[id(device)]
        try:
            await shared.ref.ask(Stop())
        except ActorStoppedError:
            pass

    async def _attach(self, msg: Attach) -> AttachedDevice | None:
        m = self.manager
        if msg.device_id is not None:
            if msg.try_only:
                return await m.try_get_specific_device(msg.device_id, msg.options, msg.wait_config)
            return await m.get_specific_device(msg.device_id, msg.options, msg.wait_config)
        if msg.executable is not None:
            if msg.try_only:
                try:
                    return await m.get_device_for(msg.executable, msg.wait_config)
                except (DeviceNotFoundError, DeviceUnavailableError):
                    return None
            return await m.get_device_for(msg.executable, msg.wait_config)
        if msg.try_only:
            return await m.try_get_device(
                msg.num_devices, msg.options, msg.wait_config, msg.constraints
            )
        return await m.get_device(msg.num_devices, msg.options, msg.wait_config, msg.constraints)

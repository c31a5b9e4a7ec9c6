"""The DeviceManager actor: the process-wide :class:`DeviceManager` in the supervisor tree.

Attaching may wait (per the wait strategy), so each ``Attach`` runs as a task: the actor keeps
answering ``ListDevices`` and other attaches meanwhile. Devices it hands out belong to the asker
(normally a Device actor, which detaches on stop); the manager does not detach them when it
stops, so restarting it does not pull devices from under running replicas.
"""

from __future__ import annotations

from typing import Any

from actors.actor import Envelope
from actors.clock import Clock
from actors.device._deferred import DeferringActor
from actors.device.manager import AttachedDevice, DeviceManager
from actors.device.messages import Attach, DetachDevice, DeviceManagerMessage, ListDevices
from model_runtime.errors import DeviceNotFoundError, DeviceUnavailableError

__all__ = ["DeviceManagerActor"]


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
        return await super().handle(message)

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

"""The device layer: inventory, exclusive attach, wait strategies, backends, faults, actors.

Entry points: :class:`DeviceManager` (find/attach/create devices), :class:`Device` (the actor
that runs an executable on one attached device), :class:`FaultPlan` (make devices fail on
purpose), and the messages in :mod:`actors.device.messages`.
"""

from actors.device.actor import Device, DeviceCrash
from actors.device.backends import Backend, CpuBackend, IpuModelBackend, RunAborted, make_backend
from actors.device.faults import FaultInjector, FaultKind, FaultPlan, FaultRule
from actors.device.inventory import DeviceSpec, load_inventory, parse_devices
from actors.device.locks import DeviceLock, LockHolder
from actors.device.manager import AttachedDevice, DeviceInfo, DeviceManager
from actors.device.manager_actor import DeviceManagerActor
from actors.device.messages import (
    Attach,
    Detach,
    DetachDevice,
    DeviceStatus,
    GetStatus,
    ListDevices,
    LoadExecutable,
    Reset,
    RunMain,
    RunPrograms,
    RunSave,
    Unload,
)
from actors.device.wait import DeviceConstraints, DeviceWaitConfig, DeviceWaitStrategy

__all__ = [
    "Attach",
    "AttachedDevice",
    "Backend",
    "CpuBackend",
    "Detach",
    "DetachDevice",
    "Device",
    "DeviceConstraints",
    "DeviceCrash",
    "DeviceInfo",
    "DeviceLock",
    "DeviceManager",
    "DeviceManagerActor",
    "DeviceSpec",
    "DeviceStatus",
    "DeviceWaitConfig",
    "DeviceWaitStrategy",
    "FaultInjector",
    "FaultKind",
    "FaultPlan",
    "FaultRule",
    "GetStatus",
    "IpuModelBackend",
    "ListDevices",
    "LoadExecutable",
    "LockHolder",
    "Reset",
    "RunAborted",
    "RunMain",
    "RunPrograms",
    "RunSave",
    "Unload",
    "load_inventory",
    "make_backend",
    "parse_devices",
]

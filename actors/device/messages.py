"""Messages of the Device actor and the DeviceManager actor (frozen dataclasses, slots).

Device actor (:class:`~actors.device.actor.Device`), with what an ``ask`` answers:

=========================================  ==================================================
``LoadExecutable(executable, frozen)``      ``None`` once loaded (load programs run)
``RunMain(batches)``                        ``list[dict[str, ndarray]]``: user outputs per batch
``RunSave()``                               ``dict[str, ndarray]``: variable name -> copy
``RunPrograms(program_ids, batches)``       ``list[ProgramResult]``: one per program id
``Reset(variables)``                        ``None`` once reset (reloaded, variables restored)
``Unload()``                                ``None``
``Detach()``                                ``None`` (unloads, releases the device)
``GetStatus()``                             :class:`DeviceStatus` (answered even mid-run)
=========================================  ==================================================

DeviceManager actor (:class:`~actors.device.manager_actor.DeviceManagerActor`):
``Attach(...)`` -> ``AttachedDevice | None``, ``DetachDevice(device)`` -> ``None``,
``ListDevices()`` -> ``list[DeviceInfo]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np

from actors.device.wait import DeviceConstraints, DeviceWaitConfig

if TYPE_CHECKING:
    from actors.device.manager import AttachedDevice
    from model_runtime.executable import Executable

__all__ = [
    "Attach",
    "CloseDevice",
    "Detach",
    "DetachDevice",
    "DeviceManagerMessage",
    "DeviceMessage",
    "DeviceState",
    "DeviceStatus",
    "GetStatus",
    "ListDevices",
    "LoadExecutable",
    "OpenDevice",
    "ProgramResult",
    "Reset",
    "RunMain",
    "RunPrograms",
    "RunSave",
    "Unload",
]

Batch = Mapping[str, np.ndarray]
#: What one program of :class:`RunPrograms` gives back: load None, main the per-batch outputs,
#: save the variables.
ProgramResult = list[dict[str, np.ndarray]] | dict[str, np.ndarray] | None
DeviceState = Literal["empty", "loaded", "running", "resetting", "broken", "detached"]


# -- Device actor ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LoadExecutable:
    """Load ``executable`` and run its load programs; ``frozen_inputs`` override anchors once."""

    executable: Executable
    frozen_inputs: Mapping[str, np.ndarray] | None = None


@dataclass(frozen=True, slots=True)
class RunMain:
    """Run the main program once per batch (``len(batches) == device_iterations``).

    ``probe``: a warm-up or probe run of the session, not a served batch: the fault plan
    neither counts nor faults it (its ``at=N`` is the N-th served run); a broken device still
    fails it.
    """

    batches: tuple[Batch, ...]
    probe: bool = False
    #: Caller memory for the outputs, one mapping per batch (see ``Backend.run_main``).
    into: tuple[Batch, ...] | None = None


@dataclass(frozen=True, slots=True)
class RunSave:
    """Run the save programs: copies of the variables' current values."""


@dataclass(frozen=True, slots=True)
class RunPrograms:
    """Run programs by id, in order (main programs take ``batches``)."""

    program_ids: tuple[int, ...]
    batches: tuple[Batch, ...] = ()


@dataclass(frozen=True, slots=True)
class Reset:
    """Abort any run, drop device state, reload, re-run load programs, restore ``variables``."""

    variables: Mapping[str, np.ndarray] | None = None


@dataclass(frozen=True, slots=True)
class Unload:
    """Forget the executable (runs then fail with DeviceStateError until the next load)."""


@dataclass(frozen=True, slots=True)
class Detach:
    """Abort any run, unload and release the device; later runs fail with DeviceStateError."""


@dataclass(frozen=True, slots=True)
class GetStatus:
    """Ask for a :class:`DeviceStatus` (answered at once, even while a run hangs)."""


@dataclass(frozen=True, slots=True)
class DeviceStatus:
    """A device's heartbeat: state, progress counters and the in-flight run's start.

    Times are the actor clock's ``monotonic()``. ``run_started_at`` is set while a program runs
    (``None`` when idle): ``now - run_started_at`` past a deadline means a hang.
    """

    device: int
    replica: int
    state: DeviceState
    runs_completed: int
    last_progress: float
    run_started_at: float | None
    error: str | None = None


DeviceMessage = (
    LoadExecutable | RunMain | RunSave | RunPrograms | Reset | Unload | Detach | GetStatus
)


# -- DeviceManager actor --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Attach:
    """Attach a device: ``device_id`` for a specific one, ``executable`` for its target, else
    any of ``num_devices``. ``try_only``: answer ``None`` instead of not found / unavailable."""

    num_devices: int = 1
    options: Mapping[str, str] | None = None
    wait_config: DeviceWaitConfig = field(default_factory=DeviceWaitConfig)
    constraints: DeviceConstraints = field(default_factory=DeviceConstraints)
    device_id: int | None = None
    executable: Executable | None = None
    try_only: bool = False


@dataclass(frozen=True, slots=True)
class DetachDevice:
    """Release ``device`` (idempotent)."""

    device: AttachedDevice


@dataclass(frozen=True, slots=True)
class ListDevices:
    """The inventory and who holds each device."""


@dataclass(frozen=True, slots=True)
class OpenDevice:
    """(ask) The Device actor of the attached ``device``: the manager's one actor per device,
    started on first use and shared by every session on that device (answers its ref)."""

    device: AttachedDevice


@dataclass(frozen=True, slots=True)
class CloseDevice:
    """(ask) One user of ``device``'s actor is done; the last one stops it (the device stays
    attached: detaching is its holder's)."""

    device: AttachedDevice


DeviceManagerMessage = Attach | DetachDevice | ListDevices | OpenDevice | CloseDevice

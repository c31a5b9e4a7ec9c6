"""The DeviceManager (seed: ``model_runtime::DeviceManager``): find, attach and create devices.

A plain class with an async API (waiting sleeps on an injected :class:`~actors.clock.Clock`, so
tests drive it with a fake clock); :class:`~actors.device.manager_actor.DeviceManagerActor` wraps
it for the supervisor tree.

Sharing (DESIGN.md §5): attaching is exclusive across processes (:mod:`.locks`); inside one
process a shareable device (:attr:`~actors.device.inventory.DeviceSpec.shareable`: every cpu
device unless configured ``exclusive``) may be attached any number of times, by replicas of one
model or of several. The process takes the device's OS lock once, at the first attachment, and
gives it back at the last detach (a reference count kept per lock directory and device id,
process-wide, so every :class:`DeviceManager` of the process agrees). Each attachment is its own
:class:`AttachedDevice`, detached once (idempotent) and owned by whoever asked for it (normally
a replica's Device actor, with its own worker thread). ipu-model devices and ``exclusive`` cpu
devices stay exclusive inside the process too. Placement (:meth:`DeviceManager.get_device`,
:meth:`DeviceManager.get_device_for`) takes the least-loaded device: fewest attachments in this
process, then lowest id. A device another process holds is never shared: the wait strategies
apply to it as before, and a shareable device this process already holds needs no waiting.

IPU versions, as the seed words them (two calls, two answers for "no IPU"):

* :meth:`DeviceManager.hardware_version` is ``DeviceManager::ipuHardwareVersion``: the
  architecture version of the IPUs in the system (here: the inventory's ipu-model devices),
  ``-1`` if there are IPUs but their architecture is unknown (here: ipu-model devices of more
  than one version, so no single answer), ``0`` if there is no IPU (a cpu-only inventory).
* :meth:`AttachedDevice.ipu_version` is ``Device::ipuVersion``: the device's architecture
  version "or -1 if unknown". A cpu device is not an IPU, so it has no known IPU architecture:
  ``-1``. (Its :class:`~actors.device.inventory.DeviceSpec` and an executable's ``Target`` store
  ``0`` for cpu: that is a data field meaning "not an IPU", not the seed's call.)

Where the seed takes a ``popef::Model``, these calls take an
:class:`~model_runtime.executable.Executable` (its ``metadata.target``): :meth:`get_device_for`,
:meth:`try_get_device_for`, and the model forms of :meth:`get_specific_device`,
:meth:`try_get_specific_device`, :meth:`create_ipu_model_device` and
:meth:`create_small_ipu_model_device`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import overload

import structlog

from actors.clock import Clock, SystemClock
from actors.device.attachment import HOLDINGS, AttachedDevice, releaser
from actors.device.inventory import SMALL_IPU_TILES, DeviceSpec, ipu_model_spec, load_inventory
from actors.device.locks import LockHolder, default_lock_dir, read_holder
from actors.device.wait import DeviceConstraints, DeviceWaitConfig, DeviceWaitStrategy
from model_runtime.errors import ConfigurationError, DeviceNotFoundError, DeviceUnavailableError
from model_runtime.executable import Executable, Target

__all__ = ["AttachedDevice", "DeviceInfo", "DeviceManager"]

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """One line of :meth:`DeviceManager.list_devices`: the device, who holds it (or None) and
    how many attachments this process has on it."""

    spec: DeviceSpec
    holder: LockHolder | None
    attachments: int = 0


class DeviceManager:
    """Select, attach and create devices (see the module docstring).

    ``inventory`` defaults to :func:`~actors.device.inventory.load_inventory` (environment,
    config file, one cpu device per core); ``lock_dir`` to
    :func:`~actors.device.locks.default_lock_dir`.

    Raises:
        ConfigurationError: (constructor) a malformed inventory configuration.
    """

    def __init__(
        self,
        inventory: Sequence[DeviceSpec] | None = None,
        *,
        lock_dir: str | Path | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.inventory: tuple[DeviceSpec, ...] = tuple(
            load_inventory() if inventory is None else inventory
        )
        ids = [s.id for s in self.inventory]
        if len(set(ids)) != len(ids):
            raise ConfigurationError(f"device inventory has duplicate ids: {ids}")
        self.lock_dir = Path(lock_dir) if lock_dir is not None else default_lock_dir()
        self.clock: Clock = clock or SystemClock()

    # -- queries ---------------------------------------------------------------------------

    def hardware_version(self) -> int:
        """The IPU version of the system (seed: ``ipuHardwareVersion``).

        The version of the inventory's ipu-model devices; ``-1`` when they are of more than one
        version (IPUs whose single architecture is unknown); ``0`` when there is none (no IPU in
        the system). Not the per-device :meth:`AttachedDevice.ipu_version`, whose "unknown" for
        a cpu device is ``-1``.

        Raises:
            nothing.
        """
        versions = {s.ipu_version for s in self.inventory if s.kind == "ipu-model"}
        if not versions:
            return 0
        return versions.pop() if len(versions) == 1 else -1  # seed: -1 = "unknown / mixed"

    def list_devices(self) -> list[DeviceInfo]:
        """Every inventory device and who holds it now (``holder`` None: free).

        Raises:
            nothing: an unreadable lock directory lists every device as free.
        """
        return [
            DeviceInfo(s, read_holder(self.lock_dir, s.id), self.attachments(s.id))
            for s in self.inventory
        ]

    def attachments(self, device_id: int) -> int:
        """How many attachments this process has on device ``device_id`` now (0: none).

        Raises:
            nothing.
        """
        return HOLDINGS.attachments(HOLDINGS.key(self.lock_dir, device_id))

    # -- attach ----------------------------------------------------------------------------

    async def get_device(
        self,
        num_devices: int = 1,
        options: Mapping[str, str] | None = None,
        wait_config: DeviceWaitConfig = DeviceWaitConfig(),  # noqa: B008 (frozen)
        constraints: DeviceConstraints = DeviceConstraints(),  # noqa: B008 (frozen)
        *,
        kind: str | None = None,
    ) -> AttachedDevice:
        """Attach a device of ``num_devices`` (its ``num_ipus``) meeting ``constraints``: the
        least-loaded one (fewest attachments in this process, then lowest id) among those free
        or shareable with this process's attachments (see the module docstring).

        ``kind`` restricts the device kind (``get_device_for`` uses it).

        Raises:
            DeviceNotFoundError: no device of the inventory could ever match.
            DeviceUnavailableError: every match is held by another process (or, exclusive,
                by this one), per ``wait_config``.
            ConfigurationError: ``num_devices < 1`` or the lock directory is not usable.
        """
        if num_devices < 1:
            raise ConfigurationError(f"get_device: num_devices must be >= 1, got {num_devices}")
        candidates = [
            s
            for s in self.inventory
            if s.num_ipus == num_devices
            and (kind is None or s.kind == kind)
            and (not constraints.requires_remote_buffers_support or s.supports_remote_buffers)
        ]
        if not candidates:
            sizes = sorted({s.num_ipus for s in self.inventory})
            raise DeviceNotFoundError(
                f"no device of {num_devices} device(s)"
                + (f" of kind {kind}" if kind else "")
                + (" with remote buffers" if constraints else "")
                + f" in the inventory (sizes: {sizes}, {len(self.inventory)} devices)"
            )
        return await self._attach(candidates, options, wait_config)

    async def try_get_device(
        self,
        num_devices: int = 1,
        options: Mapping[str, str] | None = None,
        wait_config: DeviceWaitConfig = DeviceWaitConfig(),  # noqa: B008
        constraints: DeviceConstraints = DeviceConstraints(),  # noqa: B008
        *,
        kind: str | None = None,
    ) -> AttachedDevice | None:
        """:meth:`get_device`, but ``None`` when no device could be attached or found.

        Raises:
            ConfigurationError: bad arguments or an unusable lock directory.
        """
        try:
            return await self.get_device(num_devices, options, wait_config, constraints, kind=kind)
        except (DeviceNotFoundError, DeviceUnavailableError):
            return None

    @overload
    async def get_specific_device(
        self,
        device_id: int,
        options: Mapping[str, str] | None = None,
        wait_config: DeviceWaitConfig = ...,
    ) -> AttachedDevice: ...

    @overload
    async def get_specific_device(
        self, device_id: int, model: Executable, /, wait_config: DeviceWaitConfig = ...
    ) -> AttachedDevice: ...

    async def get_specific_device(
        self,
        device_id: int,
        options: Mapping[str, str] | Executable | None = None,
        wait_config: DeviceWaitConfig = DeviceWaitConfig(),  # noqa: B008
    ) -> AttachedDevice:
        """Attach the inventory device ``device_id`` (shared if this process holds it already
        and it is shareable).

        Given an :class:`Executable` in place of ``options`` (the seed's model overload), the
        device must be able to run it: the kind, size (``num_ipus``) and, for ipu-model, the
        IPU version of its target. The executable records no device options, so the device
        gets none.

        Raises:
            DeviceNotFoundError: no such id, or the device cannot run the executable given.
            DeviceUnavailableError: it is held, per ``wait_config``.
            ConfigurationError: the lock directory is not usable.
        """
        return await self._get_specific(device_id, options, wait_config)

    @overload
    async def try_get_specific_device(
        self,
        device_id: int,
        options: Mapping[str, str] | None = None,
        wait_config: DeviceWaitConfig = ...,
    ) -> AttachedDevice | None: ...

    @overload
    async def try_get_specific_device(
        self, device_id: int, model: Executable, /, wait_config: DeviceWaitConfig = ...
    ) -> AttachedDevice | None: ...

    async def try_get_specific_device(
        self,
        device_id: int,
        options: Mapping[str, str] | Executable | None = None,
        wait_config: DeviceWaitConfig = DeviceWaitConfig(),  # noqa: B008
    ) -> AttachedDevice | None:
        """:meth:`get_specific_device`, but ``None`` instead of not found / unavailable.

        ``options`` may be an :class:`Executable`, as for :meth:`get_specific_device`; a
        device that cannot run it is ``None`` too.

        Raises:
            ConfigurationError: the lock directory is not usable.
        """
        try:
            return await self._get_specific(device_id, options, wait_config)
        except (DeviceNotFoundError, DeviceUnavailableError):
            return None

    async def get_device_for(
        self,
        executable: Executable,
        wait_config: DeviceWaitConfig = DeviceWaitConfig(),  # noqa: B008
    ) -> AttachedDevice:
        """A device for ``executable``'s target: the least-loaded cpu device of the inventory
        (attached, shared with this process's other attachments), or a created ipu-model of the
        target's version, size and tiles.

        Raises:
            DeviceNotFoundError / DeviceUnavailableError: as :meth:`get_device`.
            ConfigurationError: the target names an unknown IPU version.
        """
        t = executable.metadata.target
        if t.device_kind == "ipu-model":
            return self.create_ipu_model_device(t.num_devices, t.version, t.tiles_per_ipu)
        return await self.get_device(t.num_devices, None, wait_config, kind=t.device_kind)

    async def try_get_device_for(
        self,
        executable: Executable,
        wait_config: DeviceWaitConfig = DeviceWaitConfig(),  # noqa: B008
    ) -> AttachedDevice | None:
        """:meth:`get_device_for`, but ``None`` when no device could be attached or found
        (seed: ``tryGetDevice(model)``).

        Raises:
            ConfigurationError: the target names an unknown IPU version, or the lock directory
                is not usable.
        """
        try:
            return await self.get_device_for(executable, wait_config)
        except (DeviceNotFoundError, DeviceUnavailableError):
            return None

    # -- created (simulated) devices -------------------------------------------------------

    @overload
    def create_ipu_model_device(
        self, num_ipus: int = 1, ipu_version: int = 2, tiles_per_ipu: int = 0
    ) -> AttachedDevice: ...

    @overload
    def create_ipu_model_device(
        self, model: Executable, /, *, tiles_per_ipu: int = 0
    ) -> AttachedDevice: ...

    def create_ipu_model_device(
        self,
        num_ipus: int | Executable = 1,
        ipu_version: int | None = None,
        tiles_per_ipu: int = 0,
    ) -> AttachedDevice:
        """A simulated IPU (not from the inventory, not locked; id ``-1``).

        ``tiles_per_ipu=0``: the version's default. Given an :class:`Executable` instead of
        ``num_ipus`` (the seed's model overload), its target gives the number of IPUs and the
        version (give ``tiles_per_ipu`` by keyword); ``tiles_per_ipu=0`` then takes the
        target's tiles, which the seed's PopEF model does not record (0 there too: the
        version's default).

        Raises:
            ConfigurationError: unknown ``ipu_version`` or a non-positive size; with an
                executable, a target that is not ipu-model (it names no IPU version) or an
                ``ipu_version`` given as well.
        """
        if isinstance(num_ipus, Executable):
            t = self._ipu_target(num_ipus, "create_ipu_model_device", ipu_version)
            return self.create_ipu_model_device(
                t.num_devices, t.version, tiles_per_ipu or t.tiles_per_ipu
            )
        spec = ipu_model_spec(
            num_ipus=num_ipus,
            ipu_version=2 if ipu_version is None else ipu_version,
            tiles_per_ipu=tiles_per_ipu,
        )
        log.info("device.created", device=spec.id, kind=spec.kind, tiles=spec.tiles_per_ipu)
        return AttachedDevice(spec)

    @overload
    def create_small_ipu_model_device(
        self, num_ipus: int = 1, ipu_version: int = 2
    ) -> AttachedDevice: ...

    @overload
    def create_small_ipu_model_device(self, model: Executable, /) -> AttachedDevice: ...

    def create_small_ipu_model_device(
        self, num_ipus: int | Executable = 1, ipu_version: int | None = None
    ) -> AttachedDevice:
        """A 4-tile simulated IPU: quick, for small programs only.

        Given an :class:`Executable` instead of ``num_ipus`` (the seed's model overload), its
        target gives the number of IPUs and the version.

        Raises:
            ConfigurationError: unknown ``ipu_version`` or ``num_ipus < 1``; with an
                executable, a target that is not ipu-model or an ``ipu_version`` given as well.
        """
        if isinstance(num_ipus, Executable):
            t = self._ipu_target(num_ipus, "create_small_ipu_model_device", ipu_version)
            return self.create_ipu_model_device(t.num_devices, t.version, SMALL_IPU_TILES)
        return self.create_ipu_model_device(
            num_ipus, 2 if ipu_version is None else ipu_version, SMALL_IPU_TILES
        )

    # -- machinery -------------------------------------------------------------------------

    async def _get_specific(
        self,
        device_id: int,
        options: Mapping[str, str] | Executable | None,
        wait_config: DeviceWaitConfig,
    ) -> AttachedDevice:
        spec = self._spec(device_id)
        if isinstance(options, Executable):
            misfit = _misfit(spec, options.metadata.target)
            if misfit:
                raise DeviceNotFoundError(
                    f"{spec.describe()} cannot run model {options.metadata.model_name!r}: {misfit}"
                )
            options = None
        return await self._attach([spec], options, wait_config)

    def _spec(self, device_id: int) -> DeviceSpec:
        for s in self.inventory:
            if s.id == device_id:
                return s
        raise DeviceNotFoundError(
            f"no device {device_id} (inventory ids: {[s.id for s in self.inventory]})"
        )

    @staticmethod
    def _ipu_target(executable: Executable, call: str, ipu_version: int | None) -> Target:
        meta = executable.metadata
        if ipu_version is not None:
            raise ConfigurationError(
                f"{call}: give a model or an ipu_version, not both (model {meta.model_name!r} "
                f"names its own version)"
            )
        if meta.target.device_kind != "ipu-model":
            raise ConfigurationError(
                f"{call}: model {meta.model_name!r} was compiled for {meta.target.device_kind}, "
                "which names no IPU version; compile it with target='ipu-model' or give "
                "num_ipus and ipu_version"
            )
        return meta.target

    async def _attach(
        self,
        candidates: Sequence[DeviceSpec],
        options: Mapping[str, str] | None,
        wait_config: DeviceWaitConfig,
    ) -> AttachedDevice:
        strategy = wait_config.strategy
        deadline = (
            self.clock.monotonic() + wait_config.timeout
            if strategy is DeviceWaitStrategy.WAIT_WITH_TIMEOUT
            else math.inf
        )
        attempts = 0
        while True:
            attempts += 1
            for spec in self._by_load(candidates):
                hold = HOLDINGS.try_attach(self.lock_dir, spec)
                if hold is not None:
                    key = HOLDINGS.key(self.lock_dir, spec.id)
                    log.info(
                        "device.attached",
                        device=spec.id,
                        kind=spec.kind,
                        attempts=attempts,
                        attachments=hold.users,
                    )
                    return AttachedDevice(
                        spec, hold.lock, dict(options or {}), _release=releaser(key, hold)
                    )
            now = self.clock.monotonic()
            if strategy is DeviceWaitStrategy.NO_WAIT or now >= deadline:
                holders = {s.id: read_holder(self.lock_dir, s.id) for s in candidates}
                held = ", ".join(f"{i} (pid {h.pid})" if h else f"{i}" for i, h in holders.items())
                waited = (
                    "" if strategy is DeviceWaitStrategy.NO_WAIT
                    else f" after waiting {wait_config.timeout} s ({attempts} attempts)"
                )  # fmt: skip
                raise DeviceUnavailableError(
                    f"no free device{waited}: held: {held} (strategy {strategy.value})"
                )
            log.debug("device.wait", candidates=[s.id for s in candidates], attempt=attempts)
            await self.clock.sleep(min(wait_config.sleep_time, deadline - now))

    def _by_load(self, candidates: Sequence[DeviceSpec]) -> list[DeviceSpec]:
        """Least-loaded first: fewest attachments in this process, then lowest id."""
        return sorted(candidates, key=lambda s: (self.attachments(s.id), s.id))


def _misfit(spec: DeviceSpec, target: Target) -> str:
    """Why a device of ``spec`` cannot run an executable for ``target`` (``""``: it can)."""
    if spec.kind != target.device_kind:
        return f"it was compiled for {target.device_kind}"
    if spec.num_ipus != target.num_devices:
        return f"it needs {target.num_devices} device(s), this one has {spec.num_ipus}"
    if spec.kind == "ipu-model" and spec.ipu_version != target.version:
        return f"it was compiled for IPU version {target.version}"
    return ""

"""The DeviceManager (seed: ``model_runtime::DeviceManager``): find, attach and create devices.

A plain class with an async API (waiting sleeps on an injected :class:`~actors.clock.Clock`, so
tests drive it with a fake clock); :class:`~actors.device.manager_actor.DeviceManagerActor` wraps
it for the supervisor tree. Attaching is exclusive across processes (:mod:`.locks`).

``hardware_version()`` follows the seed's ``ipuHardwareVersion``: the IPU architecture version
of the inventory's ipu-model devices, or ``0`` ("no IPU in the system") when the inventory has
only cpu devices. A cpu device has no IPU version, and ``0`` is exactly what the seed promises
for a machine without IPUs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

import structlog

from actors.clock import Clock, SystemClock
from actors.device.inventory import SMALL_IPU_TILES, DeviceSpec, ipu_model_spec, load_inventory
from actors.device.locks import DeviceLock, LockHolder, default_lock_dir, read_holder
from actors.device.wait import DeviceConstraints, DeviceWaitConfig, DeviceWaitStrategy
from model_runtime.errors import ConfigurationError, DeviceNotFoundError, DeviceUnavailableError

if TYPE_CHECKING:
    from model_runtime.executable import Executable

__all__ = ["AttachedDevice", "DeviceInfo", "DeviceManager"]

log = structlog.get_logger(__name__)


@dataclass(eq=False)
class AttachedDevice:
    """A device this process holds: its spec and lock (``None`` for a created ipu-model).

    Detach with :meth:`detach` (idempotent) or use it as an (async) context manager.
    """

    spec: DeviceSpec
    lock: DeviceLock | None = None
    options: Mapping[str, str] = field(default_factory=dict)
    _attached: bool = True

    @property
    def id(self) -> int:
        return self.spec.id

    @property
    def is_attached(self) -> bool:
        return self._attached

    def detach(self) -> None:
        """Release the device (its lock) so others may attach it. Idempotent."""
        if self._attached:
            self._attached = False
            if self.lock is not None:
                self.lock.release()
            log.info("device.detached", device=self.spec.id, kind=self.spec.kind)

    def __enter__(self) -> AttachedDevice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()

    async def __aenter__(self) -> AttachedDevice:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.detach()

    def __repr__(self) -> str:
        return f"AttachedDevice({self.spec.describe()}, attached={self._attached})"


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """One line of :meth:`DeviceManager.list_devices`: the device and who holds it (or None)."""

    spec: DeviceSpec
    holder: LockHolder | None


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
        """The IPU version of the inventory's ipu-model devices, 0 when it has none.

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
        return [DeviceInfo(s, read_holder(self.lock_dir, s.id)) for s in self.inventory]

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
        """Attach a free device of ``num_devices`` (its ``num_ipus``) meeting ``constraints``.

        ``kind`` restricts the device kind (``get_device_for`` uses it).

        Raises:
            DeviceNotFoundError: no device of the inventory could ever match.
            DeviceUnavailableError: every match is held, per ``wait_config``.
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

    async def get_specific_device(
        self,
        device_id: int,
        options: Mapping[str, str] | None = None,
        wait_config: DeviceWaitConfig = DeviceWaitConfig(),  # noqa: B008
    ) -> AttachedDevice:
        """Attach the inventory device ``device_id``.

        Raises:
            DeviceNotFoundError: no such id.
            DeviceUnavailableError: it is held, per ``wait_config``.
            ConfigurationError: the lock directory is not usable.
        """
        for s in self.inventory:
            if s.id == device_id:
                return await self._attach([s], options, wait_config)
        raise DeviceNotFoundError(
            f"no device {device_id} (inventory ids: {[s.id for s in self.inventory]})"
        )

    async def try_get_specific_device(
        self,
        device_id: int,
        options: Mapping[str, str] | None = None,
        wait_config: DeviceWaitConfig = DeviceWaitConfig(),  # noqa: B008
    ) -> AttachedDevice | None:
        """:meth:`get_specific_device`, but ``None`` instead of not found / unavailable.

        Raises:
            ConfigurationError: the lock directory is not usable.
        """
        try:
            return await self.get_specific_device(device_id, options, wait_config)
        except (DeviceNotFoundError, DeviceUnavailableError):
            return None

    async def get_device_for(
        self,
        executable: Executable,
        wait_config: DeviceWaitConfig = DeviceWaitConfig(),  # noqa: B008
    ) -> AttachedDevice:
        """A device for ``executable``'s target: a cpu device of the inventory (attached), or a
        created ipu-model of the target's version, size and tiles.

        Raises:
            DeviceNotFoundError / DeviceUnavailableError: as :meth:`get_device`.
            ConfigurationError: the target names an unknown IPU version.
        """
        t = executable.metadata.target
        if t.device_kind == "ipu-model":
            return self.create_ipu_model_device(t.num_devices, t.version, t.tiles_per_ipu)
        return await self.get_device(t.num_devices, None, wait_config, kind=t.device_kind)

    # -- created (simulated) devices -------------------------------------------------------

    def create_ipu_model_device(
        self, num_ipus: int = 1, ipu_version: int = 2, tiles_per_ipu: int = 0
    ) -> AttachedDevice:
        """A simulated IPU (not from the inventory, not locked; id ``-1``).

        Raises:
            ConfigurationError: unknown ``ipu_version`` or a non-positive size.
        """
        spec = ipu_model_spec(
            num_ipus=num_ipus, ipu_version=ipu_version, tiles_per_ipu=tiles_per_ipu
        )
        log.info("device.created", device=spec.id, kind=spec.kind, tiles=spec.tiles_per_ipu)
        return AttachedDevice(spec)

    def create_small_ipu_model_device(
        self, num_ipus: int = 1, ipu_version: int = 2
    ) -> AttachedDevice:
        """A 4-tile simulated IPU: quick, for small programs only.

        Raises:
            ConfigurationError: unknown ``ipu_version`` or ``num_ipus < 1``.
        """
        return self.create_ipu_model_device(num_ipus, ipu_version, SMALL_IPU_TILES)

    # -- machinery -------------------------------------------------------------------------

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
            for spec in candidates:
                lock = DeviceLock.try_acquire(self.lock_dir, spec.id)
                if lock is not None:
                    log.info("device.attached", device=spec.id, kind=spec.kind, attempts=attempts)
                    return AttachedDevice(spec, lock, dict(options or {}))
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

"""Attachments: this process's holds on devices, counted, and the :class:`AttachedDevice` each
caller gets (see :mod:`.manager` for the sharing rules).

:data:`HOLDINGS` is process-wide: the OS lock of a device is taken at its first attachment by
this process and given back at the last detach, whichever :class:`~.manager.DeviceManager`
attached it. A forked child starts with no holdings of its own.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import structlog

from actors.device.inventory import DeviceSpec
from actors.device.locks import DeviceLock

__all__ = ["HOLDINGS", "AttachedDevice", "Hold", "Holdings", "releaser"]

log = structlog.get_logger("actors.device.manager")


@dataclass(slots=True)
class Hold:
    """This process's hold on one device: its OS lock and the attachments that share it."""

    lock: DeviceLock
    shareable: bool
    users: int = 1


class Holdings:
    """Every device lock this process holds, by (lock directory, device id), counted.

    Process-wide (one instance, :data:`HOLDINGS`) so that several :class:`DeviceManager`
    instances of one process (a runner's, a session's, the daemon's) share a device as one.
    Thread-safe: attachments are made from event loops and released from any thread.
    """

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._held: dict[tuple[str, int], Hold] = {}

    @staticmethod
    def key(lock_dir: Path, device_id: int) -> tuple[str, int]:
        return (os.path.abspath(lock_dir), device_id)

    def attachments(self, key: tuple[str, int]) -> int:
        """How many attachments this process has on the device now."""
        hold = self._held.get(key)
        return 0 if hold is None else hold.users

    def try_attach(self, lock_dir: Path, spec: DeviceSpec) -> Hold | None:
        """One more attachment of ``spec``: shared if this process holds it and it is
        shareable, else the OS lock is taken now; ``None`` if it is not to be had.

        Raises:
            ConfigurationError / DeviceError: as :meth:`DeviceLock.try_acquire`.
        """
        key = self.key(lock_dir, spec.id)
        with self._guard:
            hold = self._held.get(key)
            if hold is not None:
                if not hold.shareable:
                    return None
                hold.users += 1
                return hold
            lock = DeviceLock.try_acquire(lock_dir, spec.id)
            if lock is None:
                return None
            hold = self._held[key] = Hold(lock, spec.shareable)
            return hold

    def release(self, key: tuple[str, int], hold: Hold) -> int:
        """One attachment fewer; the last one gives the OS lock back. The attachments left."""
        with self._guard:
            if self._held.get(key) is not hold:  # forgotten after a fork: not ours to release
                return 0
            hold.users -= 1
            if hold.users > 0:
                return hold.users
            del self._held[key]
        hold.lock.release()
        return 0

    def forget(self) -> None:
        """In a forked child: it holds nothing of its own (the parent's locks stay the parent's)."""
        self._guard = threading.Lock()
        self._held = {}


HOLDINGS = Holdings()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=HOLDINGS.forget)


@dataclass(eq=False)
class AttachedDevice:
    """One attachment of a device by this process: its spec and lock (``None`` for a created
    ipu-model). A shared cpu device has one :class:`AttachedDevice` per attachment, all with
    the same lock, which the last detach releases.

    Detach with :meth:`detach` (idempotent, per attachment) or use it as an (async) context
    manager.
    """

    spec: DeviceSpec
    lock: DeviceLock | None = None
    options: Mapping[str, str] = field(default_factory=dict)
    _attached: bool = True
    #: Gives this attachment back to the process-wide count (None: release ``lock`` directly).
    _release: Callable[[], int] | None = field(default=None, repr=False)

    @property
    def id(self) -> int:
        return self.spec.id

    @property
    def is_attached(self) -> bool:
        return self._attached

    def ipu_version(self) -> int:
        """The device's IPU architecture version, or ``-1`` if unknown (seed: ``ipuVersion``).

        An ipu-model device answers its version (e.g. 2); a cpu device is not an IPU and has no
        known IPU architecture, so it answers ``-1`` (see the module docstring).

        Raises:
            nothing.
        """
        return self.spec.ipu_version if self.spec.kind == "ipu-model" else -1

    def detach(self) -> None:
        """Give this attachment back; the last attachment of the device in this process
        releases its lock, so that other processes may attach it. Idempotent: a second call
        on the same attachment does nothing (it never releases another attachment's share).

        Raises:
            nothing.
        """
        if not self._attached:
            return
        self._attached = False
        left = 0
        if self._release is not None:
            left = self._release()
        elif self.lock is not None:
            self.lock.release()
        log.info("device.detached", device=self.spec.id, kind=self.spec.kind, attachments=left)

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


def releaser(key: tuple[str, int], hold: Hold) -> Callable[[], int]:
    return lambda: HOLDINGS.release(key, hold)

"""Exclusive attach across processes: one OS file lock per device in a runtime directory.

``$MODEL_RUNTIME_DIR/device-<id>.lock`` (default directory: ``$XDG_RUNTIME_DIR/model-runtime``,
else ``<tempdir>/model-runtime-<uid>``) is locked with ``flock(LOCK_EX | LOCK_NB)``. The lock
belongs to the open file description, so it also excludes a second attach from the same
process, it is not inherited by subprocesses (the descriptor is close-on-exec), and the kernel
drops it when the holder dies, however it dies. The holder writes ``{"pid", "host", "since"}``
into the file so listings can say who holds a device; the file is never deleted (deleting a
lock file races with a process that has just opened it).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from model_runtime.errors import ConfigurationError, DeviceError

__all__ = ["RUNTIME_DIR_ENV", "DeviceLock", "LockHolder", "default_lock_dir", "read_holder"]

RUNTIME_DIR_ENV = "MODEL_RUNTIME_DIR"


@dataclass(frozen=True, slots=True)
class LockHolder:
    """Who holds a device: process id, host name and wall-clock time of the attach."""

    pid: int
    host: str
    since: float


def default_lock_dir() -> Path:
    """``$MODEL_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/model-runtime``, else a per-user temp dir."""
    explicit = os.environ.get(RUNTIME_DIR_ENV)
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return Path(xdg) / "model-runtime"
    return Path(tempfile.gettempdir()) / f"model-runtime-{os.getuid()}"


def ensure_lock_dir(lock_dir: Path) -> Path:
    """Create ``lock_dir`` (mode 0700) if needed and check that it is writable.

    Raises:
        ConfigurationError: it cannot be created or written.
    """
    try:
        lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigurationError(
            f"device lock directory {lock_dir} cannot be created ({exc.strerror}); "
            f"set {RUNTIME_DIR_ENV} to a writable directory"
        ) from exc
    if not lock_dir.is_dir() or not os.access(lock_dir, os.W_OK | os.X_OK):
        raise ConfigurationError(
            f"device lock directory {lock_dir} is not a writable directory; "
            f"set {RUNTIME_DIR_ENV} to a writable directory"
        )
    return lock_dir


def lock_path(lock_dir: Path, device_id: int) -> Path:
    return lock_dir / f"device-{device_id}.lock"


def _open(path: Path) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise ConfigurationError(
            f"device lock file {path} cannot be opened ({exc.strerror}); "
            f"set {RUNTIME_DIR_ENV} to a writable directory"
        ) from exc


class DeviceLock:
    """A held device lock. :meth:`release` (idempotent) or process death gives it back."""

    __slots__ = ("_fd", "device_id", "path")

    def __init__(self, fd: int, device_id: int, path: Path) -> None:
        self._fd: int | None = fd
        self.device_id = device_id
        self.path = path

    @classmethod
    def try_acquire(cls, lock_dir: Path, device_id: int) -> DeviceLock | None:
        """Lock device ``device_id`` without blocking; ``None`` if someone else holds it.

        Raises:
            ConfigurationError: the lock directory or file is not usable.
            DeviceError: an unexpected OS error from ``flock``.
        """
        path = lock_path(ensure_lock_dir(lock_dir), device_id)
        fd = _open(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return None
            raise DeviceError(f"device {device_id}: flock on {path} failed: {exc}") from exc
        info = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()})
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, info.encode(), 0)
        except OSError:
            pass  # the lock is what matters; the holder note is informative only
        return cls(fd, device_id, path)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Give the device back (clears the holder note first). Idempotent."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)
        except OSError:
            pass
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __del__(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # the kernel drops the lock with the last descriptor

    def __repr__(self) -> str:
        return f"DeviceLock(device={self.device_id}, held={self.held})"


def read_holder(lock_dir: Path, device_id: int) -> LockHolder | None:
    """Who holds device ``device_id`` now (``None``: free). Does not take the lock for long.

    Raises:
        nothing: an unreadable directory or file reads as "free".
    """
    path = lock_path(lock_dir, device_id)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            pass  # held (exclusively) by someone: read the note
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        data = os.pread(fd, 4096, 0)
    finally:
        os.close(fd)
    try:
        doc = json.loads(data.decode() or "{}")
        return LockHolder(int(doc["pid"]), str(doc["host"]), float(doc["since"]))
    except (ValueError, KeyError, TypeError):
        return LockHolder(-1, "?", 0.0)  # held, but the holder has not written its note yet

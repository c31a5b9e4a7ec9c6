"""Triton's system shared memory extension: the regions clients register, by name.

A client creates a POSIX shared memory object, registers a part of it here (``register(name,
key, offset, byte_size)``), and then names the region in an inference request's input and
output parameters instead of sending the tensor (:mod:`model_runtime.server.tensors.shm_io` reads
and
writes them). HTTP (:mod:`model_runtime.server.http.shm_routes`) and gRPC answer from this one
registry, with Triton's texts (``src/shared_memory_manager.cc``); how each error is answered is
:data:`model_runtime.server.answers.SHARED_MEMORY_ANSWERS`.

What the registry guarantees:

- A key is a POSIX shared memory name, never a path: leading slashes, then one name of
  ``[A-Za-z0-9._-]`` (no other ``/``, not ``.`` or ``..``), opened with ``shm_open`` (which
  does not follow symbolic links) and refused unless it is a regular object. Python's
  ``multiprocessing.shared_memory`` is not used: it hands attachments to the resource tracker,
  which may unlink a client's object when this process exits.
- What the client declares (offset + byte size) lies within the object's real size (fstat),
  and the registered regions within :class:`ShmLimits`. Each request's offset and byte size lie
  within its region.
- A client may shrink its object at any time, even while a request reads or writes it: that
  request fails with :class:`~model_runtime.errors.SharedMemoryShrunkError`, never the process.
  So no region is ever mapped (a mapping read past the object's end is a SIGBUS, in whichever
  thread touches it): a region keeps a descriptor of its object, inputs are copied out of it
  with ``preadv`` (a shrunk object answers with a short read) into memory of the request's own,
  and outputs are written with ``pwrite`` (see :meth:`Lease.write`).
- Each request that uses a region holds a :class:`Lease`. Unregistering a region that requests
  hold takes effect when the last of them releases it (Triton's rule: until then it is listed
  and usable); its descriptor is closed then.

Thread-safe: requests decoded off the event loop take leases from worker threads.
"""

from __future__ import annotations

import _posixshmem  # type: ignore[import-not-found]  # CPython's shm_open; no stubs
import os
import re
import stat
import threading
from dataclasses import dataclass

from model_runtime.errors import (
    CudaSharedMemoryError,
    SharedMemoryArgumentError,
    SharedMemoryDisabledError,
    SharedMemoryExistsError,
    SharedMemoryNotFoundError,
    SharedMemoryOpenError,
    SharedMemoryShrunkError,
)

__all__ = [
    "DISABLED",
    "RESERVED_PREFIX",
    "Lease",
    "RegionStatus",
    "SharedMemoryRegistry",
    "ShmLimits",
]

#: Triton's error for a register or unregister while client shared memory is off.
DISABLED = "Client shared memory is disabled. Start the server with '--allow-client-shm' to enable."
#: Keys Triton keeps for its own regions (its python backend's); refused, as Triton does.
RESERVED_PREFIX = "triton_python_backend_shm_region_"
#: The largest offset + byte size Triton takes (a size_t).
SIZE_MAX = 2**64 - 1
_KEY_NAME = re.compile(r"[A-Za-z0-9._-]{1,255}")


@dataclass(frozen=True, slots=True)
class ShmLimits:
    """How much clients may register: ``max_regions`` regions (each holds a descriptor) of
    ``max_bytes`` in all (the bytes requests may read and write through regions)."""

    max_regions: int = 1024
    max_bytes: int = 64 << 30


@dataclass(frozen=True, slots=True)
class RegionStatus:
    """A registered region as the status call reports it (Triton's fields, in its order)."""

    name: str
    key: str
    offset: int
    byte_size: int


class _Region:
    """One registered region: a descriptor of its object (read and write), and where the
    region lies in it."""

    __slots__ = ("byte_size", "fd", "key", "name", "offset", "retired", "users")

    def __init__(self, name: str, key: str, offset: int, byte_size: int, fd: int) -> None:
        self.name, self.key, self.offset, self.byte_size = name, key, offset, byte_size
        self.fd = fd
        self.users = 0
        #: unregistered while in use: removed when the last lease is released
        self.retired = False

    def check_size(self) -> None:
        """Raises:
        SharedMemoryShrunkError: the object no longer holds the whole region."""
        size = os.fstat(self.fd).st_size
        if size < self.offset + self.byte_size:
            raise self.shrunk(size)

    def shrunk(self, size: int | None = None) -> SharedMemoryShrunkError:
        """The error for a request that found the object shorter than the region's end."""
        if size is None:
            size = os.fstat(self.fd).st_size
        return SharedMemoryShrunkError(
            f"shared memory region '{self.name}' shrank: its object '{self.key}' holds {size} "
            f"bytes now, less than the {self.offset + self.byte_size} it was registered with"
        )

    def failed(self, what: str, exc: OSError) -> SharedMemoryArgumentError:
        return SharedMemoryArgumentError(
            f"shared memory region '{self.name}': cannot {what} its object '{self.key}': {exc}"
        )

    def close(self) -> None:
        os.close(self.fd)


class Lease:
    """A request's hold on ``byte_size`` bytes at ``offset`` in a region, read with
    :meth:`readinto` and written with :meth:`write` from any thread while held; :meth:`release`
    it when the request is answered (idempotent)."""

    __slots__ = ("_region", "_registry", "byte_size", "offset")

    def __init__(
        self, registry: SharedMemoryRegistry, region: _Region, offset: int, byte_size: int
    ) -> None:
        self._registry: SharedMemoryRegistry | None = registry
        self._region = region
        self.offset = offset
        self.byte_size = byte_size

    @property
    def region(self) -> str:
        """The region's name."""
        return self._region.name

    def _held(self, nbytes: int) -> _Region:
        if self._registry is None:  # its descriptor may be closed (and its number reused)
            raise ValueError(f"the lease of shared memory region '{self.region}' was released")
        if nbytes > self.byte_size:
            raise ValueError(f"{nbytes} bytes do not fit a lease of {self.byte_size}")
        return self._region

    def readinto(self, buffer: memoryview) -> None:
        """Copy the first ``len(buffer)`` leased bytes into ``buffer`` (writable, contiguous,
        at most ``byte_size`` bytes): the one copy an input takes.

        Raises:
            SharedMemoryShrunkError: the object ends before those bytes (its client shrank it).
            SharedMemoryArgumentError: the object cannot be read.
            ValueError: the lease was released, or ``buffer`` is larger than it.
        """
        view = buffer.cast("B") if buffer.format != "B" or buffer.ndim != 1 else buffer
        n = view.nbytes
        region = self._held(n)
        at = region.offset + self.offset
        done = 0
        try:
            while done < n:
                got = os.preadv(region.fd, [view[done:]], at + done)
                if got == 0:  # the end of the object: it holds less than it did
                    raise region.shrunk()
                done += got
        except OSError as exc:
            raise region.failed("read", exc) from exc

    def read(self) -> bytearray:
        """The leased bytes, copied.

        Raises:
            SharedMemoryShrunkError, SharedMemoryArgumentError: as :meth:`readinto`.
        """
        data = bytearray(self.byte_size)
        self.readinto(memoryview(data))
        return data

    def write(self, data: memoryview) -> None:
        """Write ``data`` (at most ``byte_size`` bytes) at the start of the leased bytes.

        The object must still hold the whole region, or nothing is written: a write past its
        end would grow the client's object. (A client that shrinks it between that check and
        the write gets it grown back to at most the size it registered, holes as zeros: its
        own object, never past what it registered.)

        Raises:
            SharedMemoryShrunkError: the object no longer holds the whole region.
            SharedMemoryArgumentError: the object cannot be written (no space left, say).
            ValueError: the lease was released, or ``data`` is larger than it.
        """
        view = data.cast("B") if data.format != "B" or data.ndim != 1 else data
        n = view.nbytes
        region = self._held(n)
        at = region.offset + self.offset
        done = 0
        try:
            region.check_size()
            while done < n:
                wrote = os.pwrite(region.fd, view[done:], at + done)
                if wrote == 0:
                    raise OSError(f"wrote {done} of {n} bytes")
                done += wrote
        except OSError as exc:
            raise region.failed("write", exc) from exc

    def release(self) -> None:
        """Give the region back; the last release of an unregistered region removes it."""
        registry, self._registry = self._registry, None
        if registry is not None:
            registry._release(self._region)


class SharedMemoryRegistry:
    """The system shared memory regions clients registered, by name; ``enabled`` False turns
    registering and unregistering off (Triton's ``--allow-client-shm=false``)."""

    def __init__(self, *, enabled: bool = True, limits: ShmLimits | None = None) -> None:
        self.enabled = enabled
        self.limits = limits or ShmLimits()
        self._regions: dict[str, _Region] = {}
        self._lock = threading.Lock()

    def check_enabled(self) -> None:
        """Raises:
        SharedMemoryDisabledError: client shared memory is off (Triton's text)."""
        if not self.enabled:
            raise SharedMemoryDisabledError(DISABLED)

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Register ``byte_size`` bytes at ``offset`` of the shared memory object ``key`` as
        region ``name`` (a descriptor of the object is kept, nothing is mapped).

        Raises:
            SharedMemoryDisabledError: client shared memory is off.
            SharedMemoryArgumentError: no name; a key that is not a shared memory name or that
                has Triton's reserved prefix; offset + byte size past the object's end, a byte
                size of 0, or past the limits.
            SharedMemoryExistsError: a region of that name is registered.
            SharedMemoryOpenError: no shared memory object of that key can be opened.
        """
        self.check_enabled()
        if not name:
            raise SharedMemoryArgumentError(
                "'region name' is necessary to register system shared memory region"
            )
        path = _check_key(name, key)
        with self._lock:
            if name in self._regions:
                raise SharedMemoryExistsError(f"shared memory region '{name}' already in manager")
            fd = _open(key, path)
            try:
                size = os.fstat(fd).st_size
                self._check_fits(name, key, offset, byte_size, size)
            except OSError as exc:
                os.close(fd)
                raise SharedMemoryArgumentError(
                    f"failed to register shared memory region '{name}': unable to process "
                    f"address space: {exc}"
                ) from exc
            except BaseException:
                os.close(fd)
                raise
            self._regions[name] = _Region(name, key, offset, byte_size, fd)

    def _check_fits(self, name: str, key: str, offset: int, byte_size: int, size: int) -> None:
        invalid = f"failed to register shared memory region '{name}': invalid args"
        if offset < 0 or byte_size < 0:
            raise SharedMemoryArgumentError(f"{invalid} (offset and byte_size must be >= 0)")
        if offset + byte_size > size:
            raise SharedMemoryArgumentError(
                f"{invalid} (offset {offset} + byte_size {byte_size} is past the end of "
                f"'{key}', {size} bytes)"
            )
        if byte_size == 0:
            raise SharedMemoryArgumentError(f"{invalid} (byte_size 0: a region holds bytes)")
        limits = self.limits
        if len(self._regions) >= limits.max_regions:
            raise SharedMemoryArgumentError(
                f"{invalid} ({limits.max_regions} regions are registered, the server's limit)"
            )
        total = byte_size + sum(r.byte_size for r in self._regions.values())
        if total > limits.max_bytes:
            raise SharedMemoryArgumentError(
                f"{invalid} (the registered regions would hold {total} bytes, past the server's "
                f"limit of {limits.max_bytes})"
            )

    def status(self, name: str = "") -> list[RegionStatus]:
        """Every region by name (``name`` empty), or region ``name``; a region unregistered
        while in use is listed until its last request finishes.

        Raises:
            SharedMemoryNotFoundError: no region ``name`` (Triton's text).
        """
        with self._lock:
            if not name:
                regions = [self._regions[n] for n in sorted(self._regions)]
            elif name in self._regions:
                regions = [self._regions[name]]
            else:
                raise SharedMemoryNotFoundError(
                    f"Unable to find system shared memory region: '{name}'"
                )
            return [RegionStatus(r.name, r.key, r.offset, r.byte_size) for r in regions]

    def unregister(self, name: str = "") -> None:
        """Unregister region ``name`` (empty: every region); a name not registered is no
        error (Triton's). A region requests hold goes when the last of them finishes.

        Raises:
            SharedMemoryDisabledError: client shared memory is off.
        """
        self.check_enabled()
        with self._lock:
            names = [name] if name else list(self._regions)
            for each in names:
                region = self._regions.get(each)
                if region is None:
                    continue
                if region.users:
                    region.retired = True
                    continue
                del self._regions[each]
                region.close()

    def lease(self, name: str, offset: int, byte_size: int) -> Lease:
        """Hold ``byte_size`` bytes at ``offset`` of region ``name`` for a request.

        Raises:
            SharedMemoryNotFoundError: no region ``name``.
            SharedMemoryArgumentError: offset or offset + byte size outside the region (Triton's
                texts).
            SharedMemoryShrunkError: the region's object shrank since it was registered.
        """
        with self._lock:
            region = self._regions.get(name)
            if region is None:
                raise SharedMemoryNotFoundError(f"Unable to find shared memory region: '{name}'")
            if offset >= region.byte_size:
                raise SharedMemoryArgumentError(
                    f"Invalid offset for shared memory region: '{name}'"
                )
            if byte_size > SIZE_MAX - offset:
                raise SharedMemoryArgumentError(
                    f"Integer overflow detected: byte_size ({byte_size}) + offset ({offset}) "
                    f"exceeds maximum value ({SIZE_MAX}) for region '{name}'"
                )
            if offset + byte_size > region.byte_size:
                raise SharedMemoryArgumentError(
                    f"Invalid offset + byte size for shared memory region: '{name}'"
                )
            try:
                region.check_size()
            except OSError as exc:
                raise region.failed("measure", exc) from exc
            region.users += 1
            return Lease(self, region, offset, byte_size)

    def _release(self, region: _Region) -> None:
        with self._lock:
            region.users -= 1
            if region.users == 0 and region.retired:
                if self._regions.get(region.name) is region:
                    del self._regions[region.name]
                region.close()

    def close(self) -> None:
        """Unregister every region, enabled or not (the server is stopping); those in use go
        when their last request finishes."""
        with self._lock:
            regions, self._regions = list(self._regions.values()), {}
            for region in regions:
                region.retired = True
                if not region.users:
                    region.close()

    # -- CUDA shared memory: what Triton built without GPU support answers ------------------------

    def cuda_status(self, name: str = "") -> list[RegionStatus]:
        """No CUDA region is ever registered: every one (none) or region ``name``.

        Raises:
            SharedMemoryNotFoundError: ``name`` given (Triton's texts: none of that name, or it
                is a system region).
        """
        if not name:
            return []
        with self._lock:
            system = name in self._regions
        if system:
            raise SharedMemoryNotFoundError(
                f"The region named '{name}' is registered as system shared memory, not CUDA "
                "shared memory"
            )
        raise SharedMemoryNotFoundError(f"Unable to find cuda shared memory region: '{name}'")

    def cuda_register(self, name: str) -> None:
        """Refuse a CUDA region (Triton without GPUs).

        Raises:
            SharedMemoryDisabledError: client shared memory is off.
            CudaSharedMemoryError: otherwise (no name, or this server has no GPUs).
        """
        self.check_enabled()
        if not name:
            raise CudaSharedMemoryError(
                "'region name' is necessary to register cuda shared memory region"
            )
        raise CudaSharedMemoryError(
            f"failed to register CUDA shared memory region: '{name}', GPUs not supported"
        )

    def cuda_unregister(self, name: str = "") -> None:
        """Nothing to unregister: no CUDA region exists (Triton's success).

        Raises:
            SharedMemoryDisabledError: client shared memory is off.
        """
        self.check_enabled()


def _check_key(name: str, key: str) -> str:
    """The ``shm_open`` name of ``key`` ("/" and the name).

    Raises:
        SharedMemoryArgumentError: all slashes, Triton's reserved prefix, or not one name of
            safe characters (Triton's texts).
    """
    bare = key.lstrip("/")
    if bare.startswith(RESERVED_PREFIX):
        raise SharedMemoryArgumentError(
            f"cannot register shared memory region '{name}' with key '{key}' as the key "
            f"contains the reserved prefix '{RESERVED_PREFIX}'"
        )
    if not _KEY_NAME.fullmatch(bare) or bare in (".", ".."):
        raise SharedMemoryArgumentError(
            f"cannot register shared memory region '{name}' - invalid shm key '{key}'"
        )
    return "/" + bare


def _open(key: str, path: str) -> int:
    """A descriptor of the shared memory object ``path`` (read and write).

    Raises:
        SharedMemoryOpenError: it cannot be opened, or is not a regular object.
    """
    try:
        fd: int = _posixshmem.shm_open(path, os.O_RDWR, 0)
    except OSError as exc:
        raise SharedMemoryOpenError(f"Unable to open shared memory region: '{key}'") from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise SharedMemoryOpenError(f"Unable to open shared memory region: '{key}'")
    os.set_inheritable(fd, False)
    return fd

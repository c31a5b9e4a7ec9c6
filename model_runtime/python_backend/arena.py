"""The shared memory between the daemon and one instance process: two rings in one memfd.

Layout of the file (``HEADER`` bytes, then one ring per direction)::

    0    u64  bytes of the parent->child ring the child has consumed   (written by the child)
    64   u64  bytes of the child->parent ring the parent has consumed  (written by the parent)
    128  parent->child ring, ``ring_bytes``
    ...  child->parent ring, ``ring_bytes``

A sender allocates a tensor's bytes at the head of its ring (64-byte aligned, never wrapping
inside a tensor: the tail of the ring is skipped instead) and names the offset in the frame
that carries the tensor; each frame also carries the sender's head after it. The receiver
handles frames in order and copies every tensor out before the next frame, then stores that
head as its consumed count. The sender reuses space only below the consumed count, so nobody
waits: a tensor that does not fit now (or is larger than the ring) travels inline in the frame.

The parent never maps the file: it reads and writes with ``pread``/``pwrite`` on the descriptor,
bounds checked, so a child that truncates or seals the file gets its frames refused (a typed
error for what they carried) instead of a SIGBUS in the daemon. The child maps it.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Callable

import numpy as np

__all__ = ["HEADER", "ArenaError", "ChildArena", "ParentArena", "Ring"]

HEADER = 128
_ALIGN = 64
_U64 = struct.Struct("<Q")
_P2C_CONSUMED = 0
_C2P_CONSUMED = 64


class ArenaError(ValueError):
    """A tensor's place in the shared memory is out of bounds or could not be read."""


class Ring:
    """A sender's allocator over one ring: where the next tensor goes, if it fits now."""

    __slots__ = ("_consumed", "_read_consumed", "base", "head", "size")

    def __init__(self, base: int, size: int, read_consumed: Callable[[], int]) -> None:
        self.base = base
        self.size = size
        self.head = 0  #: bytes allocated so far (monotonic)
        self._consumed = 0
        self._read_consumed = read_consumed

    def alloc(self, nbytes: int) -> int | None:
        """The file offset for ``nbytes`` more bytes, or None when they do not fit now."""
        size = self.size
        n = (nbytes + _ALIGN - 1) & -_ALIGN
        if n > size:
            return None
        head = self.head
        pos = head % size
        need = n + (size - pos if pos + n > size else 0)
        if head + need - self._consumed > size:
            # The receiver's count is only trusted as far as it is sane (never past our head).
            self._consumed = min(max(self._read_consumed(), self._consumed), head)
            if head + need - self._consumed > size:
                return None
        self.head = head + need
        return self.base + (0 if need > n else pos)


class ParentArena:
    """The daemon's side: creates the memfd, writes requests and reads responses by syscall."""

    def __init__(self, ring_bytes: int) -> None:
        """Raises: OSError: the memfd cannot be created or sized."""
        if ring_bytes % _ALIGN:
            raise ValueError(f"ring_bytes must be a multiple of {_ALIGN}, not {ring_bytes}")
        self.ring_bytes = ring_bytes
        self.fd = os.memfd_create("model-runtime-python-instance", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, HEADER + 2 * ring_bytes)
        except BaseException:
            os.close(self.fd)
            raise
        self.sender = Ring(HEADER, ring_bytes, self._p2c_consumed)
        self._c2p = HEADER + ring_bytes
        self._last_mark = 0

    def _p2c_consumed(self) -> int:
        data = os.pread(self.fd, 8, _P2C_CONSUMED)
        return _U64.unpack(data)[0] if len(data) == 8 else 0

    def put(self, data: memoryview) -> int | None:
        """Write ``data`` into the parent->child ring; its offset, or None (send it inline).

        Raises:
            ArenaError: the write failed (the child sealed or shrank the file).
        """
        off = self.sender.alloc(len(data))
        if off is None:
            return None
        try:
            written = os.pwrite(self.fd, data, off)
        except OSError as exc:
            raise ArenaError(f"cannot write the instance's shared memory: {exc}") from exc
        if written != len(data):
            raise ArenaError(f"short write into the instance's shared memory ({written})")
        return off

    def read(self, offset: int, nbytes: int) -> np.ndarray:
        """A fresh, writable uint8 array of the child's ``nbytes`` at ``offset``.

        Raises:
            ArenaError: the range is outside the child->parent ring, or the file is shorter.
        """
        start = self._c2p
        if offset < start or nbytes < 0 or offset + nbytes > start + self.ring_bytes:
            raise ArenaError(
                f"tensor at {offset}+{nbytes} lies outside the instance's ring "
                f"[{start}, {start + self.ring_bytes})"
            )
        out = np.empty(nbytes, dtype=np.uint8)
        try:
            got = os.preadv(self.fd, [memoryview(out.data)], offset)
        except OSError as exc:
            raise ArenaError(f"cannot read the instance's shared memory: {exc}") from exc
        if got != nbytes:
            raise ArenaError(f"the instance's shared memory ends early ({got} of {nbytes} bytes)")
        return out

    def consumed(self, head: int) -> None:
        """Tell the child its ring is free below ``head`` (after a frame was copied out)."""
        if head > self._last_mark:
            self._last_mark = head
            try:
                os.pwrite(self.fd, _U64.pack(head), _C2P_CONSUMED)
            except OSError:
                pass  # the child will send inline; its own fault

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class ChildArena:
    """The instance process's side: the same file, mapped."""

    def __init__(self, fd: int, ring_bytes: int) -> None:
        self.ring_bytes = ring_bytes
        self.map = mmap.mmap(fd, HEADER + 2 * ring_bytes)
        os.close(fd)
        self.sender = Ring(HEADER + ring_bytes, ring_bytes, self._c2p_consumed)
        self._last_mark = 0

    def _c2p_consumed(self) -> int:
        return int(_U64.unpack_from(self.map, _C2P_CONSUMED)[0])

    def put(self, data: memoryview) -> int | None:
        off = self.sender.alloc(len(data))
        if off is None:
            return None
        self.map[off : off + len(data)] = data
        return off

    def read(self, offset: int, nbytes: int) -> np.ndarray:
        start = HEADER
        if offset < start or nbytes < 0 or offset + nbytes > start + self.ring_bytes:
            raise ArenaError(f"tensor at {offset}+{nbytes} lies outside the parent's ring")
        return np.frombuffer(self.map, np.uint8, nbytes, offset).copy()

    def consumed(self, head: int) -> None:
        if head > self._last_mark:
            self._last_mark = head
            _U64.pack_into(self.map, _P2C_CONSUMED, head)

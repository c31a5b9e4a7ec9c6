"""Tensors in and out of system shared memory regions, for the HTTP and gRPC codecs alike.

An input that names a region (:func:`~model_runtime.server.tensors.parameters.region_parameters`) is
copied out of it once, into a fresh contiguous array of its dtype that is the request's own
(the runner runs it in place or packs it into a batch; what the client writes to the region
afterwards does not change it); BYTES elements are read from a copy of the bytes. An output
that names a region is leased when the request is decoded (so a bad region fails the request
before it runs, as in Triton) and written into it after the run; the response then carries the
output's name, datatype and shape only. A region whose object its client shrinks fails the
request that reads or writes it (:class:`~model_runtime.errors.SharedMemoryShrunkError`).
Every lease a request takes is in its ``leases`` list, released once the request is answered.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol, TypeVar

import anyio
import numpy as np

from model_runtime.errors import ProtocolError, SharedMemoryOutputSizeError
from model_runtime.server.tensors.binary import bytes_from_binary, from_binary
from model_runtime.server.tensors.classification import bytes_to_binary
from model_runtime.server.tensors.datatypes import BYTES, DATATYPES
from model_runtime.server.tensors.parameters import RegionRef
from model_runtime.server.tensors.shm import Lease, SharedMemoryRegistry

__all__ = [
    "data_beside_region",
    "decode_in_thread",
    "lease_output",
    "read_input",
    "release",
    "write_output",
]


class _Releasable(Protocol):
    def release(self) -> None: ...


_D = TypeVar("_D", bound=_Releasable)


def _lease(
    regions: SharedMemoryRegistry | None, leases: list[Lease], tensor: str, ref: RegionRef
) -> Lease:
    if regions is None:
        raise ProtocolError(
            f"tensor '{tensor}' names shared memory region '{ref.region}', but this front end "
            "serves no shared memory"
        )
    lease = regions.lease(ref.region, ref.offset, ref.byte_size)
    leases.append(lease)
    return lease


def data_beside_region(name: str, model: str, given: str) -> ProtocolError:
    """The error for input ``name`` that names a region and also carries data (``given``:
    what, quoted as the protocol names it)."""
    return ProtocolError(
        f"unexpected {given} provided when using shared memory for input tensor '{name}' for "
        f"model '{model}'"
    )


def read_input(
    regions: SharedMemoryRegistry | None,
    leases: list[Lease],
    name: str,
    datatype: str,
    ref: RegionRef,
    count: int,
    model: str,
) -> np.ndarray:
    """Input ``name`` (``count`` elements of ``datatype``) copied out of its region, flat (for
    BYTES an object array of the elements). The lease goes into ``leases``.

    Raises:
        SharedMemoryError: no such region, or offset and size outside it (Triton's texts).
        SharedMemoryShrunkError: the region's object ends before the input's bytes.
        ProtocolError: ``ref.byte_size`` is not the shape's size (Triton's text), BYTES
            elements that do not fill it exactly, BOOL bytes other than 0 and 1, or no registry.
    """
    lease = _lease(regions, leases, name, ref)
    if datatype == BYTES:
        return bytes_from_binary(name, lease.read(), count, model)
    expected = count * DATATYPES[datatype].itemsize
    if ref.byte_size != expected:
        raise ProtocolError(
            f"input byte size mismatch for input '{name}' for model '{model}'. Expected "
            f"{expected}, got {ref.byte_size}"
        )
    data = np.empty(expected, dtype=np.uint8)
    lease.readinto(data.data)
    return from_binary(name, datatype, data.data)


def lease_output(
    regions: SharedMemoryRegistry | None, leases: list[Lease], name: str, ref: RegionRef
) -> Lease:
    """Hold output ``name``'s part of its region until the request is answered (into
    ``leases``).

    Raises:
        SharedMemoryError: no such region, or offset and size outside it (Triton's texts).
        ProtocolError: no registry.
    """
    return _lease(regions, leases, name, ref)


def write_output(lease: Lease, name: str, arr: np.ndarray, datatype: str) -> None:
    """Write output ``name`` into its leased bytes: little-endian elements, or BYTES elements
    each a 4-byte little-endian length and its bytes.

    Raises:
        SharedMemoryOutputSizeError: it does not fit (Triton's text); nothing is written.
        SharedMemoryShrunkError: the region's object no longer holds the region; nothing is
            written (see :meth:`~model_runtime.server.tensors.shm.Lease.write`).
        SharedMemoryArgumentError: the object cannot be written.
    """
    if datatype == BYTES:
        data = memoryview(bytes_to_binary(arr))
    else:
        data = np.ascontiguousarray(arr, dtype=DATATYPES[datatype]).reshape(-1).data.cast("B")
    if data.nbytes > lease.byte_size:
        raise SharedMemoryOutputSizeError(
            f"shared memory size specified with the request for output '{name}' "
            f"({lease.byte_size} bytes) should be at least {data.nbytes} bytes to hold the "
            "results"
        )
    lease.write(data)


def release(leases: list[Lease]) -> None:
    """Release every lease of a request (each once)."""
    for lease in leases:
        lease.release()
    leases.clear()


async def decode_in_thread(decode: Callable[[], _D]) -> _D:
    """``decode()`` (a request's decoding, which may lease regions) in a worker thread. A
    caller cancelled meanwhile (its client went away) does not wait: the decoded request's
    regions are released when the thread finishes, since no one else will."""
    task = asyncio.ensure_future(anyio.to_thread.run_sync(decode))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(_release_result)
        raise
    finally:
        # The task holds decode's exception, whose traceback holds this frame: without this,
        # a cycle that keeps the request's bytes until the cyclic collector runs.
        del task


def _release_result(task: asyncio.Future[_D]) -> None:
    if not task.cancelled() and task.exception() is None:
        task.result().release()

"""Memory a load freed goes back to the system (issue 34): :func:`give_back_freed`.

Loading a model copies its weights on the way, and frees the copies: the buffer the executable
file was read into (freed when the runner releases the weights a session holds), the
initializers onnxruntime copies out of what it is handed, which its prepacking then replaces by
the packed layout. glibc's ``malloc`` keeps what is freed for later allocations: after the
first large block is freed, its mmap threshold rises, so blocks of a weight's size come from
the heap, and freed heap pages stay in the resident set unless they sit at its very top. So a
served model cost the process its live memory plus the copies of its load (measured, issue 34,
MLP 784-512-512-10, W = 2.55 MB, one process loading models one after another: each model past
the first grew the resident set by 2.76 W, of which 1.17 W is live; the daemon's benchmark,
where later loads reuse some of those pages: 1.62 W, and 1.18 W giving them back).

Called where a load frees copies: around each onnxruntime session build (before it, so that a
build reusing pages others freed is not measured as smaller than it is; after it, its own
copies, :func:`~actors.device.backends.ort_sessions.open_session`), and when the runner
releases the executable's weights.

``malloc_trim(0)`` hands every whole free page of every malloc arena back (``madvise``); it
runs at load, never per request (measured: 0.6 ms in a 590 MB process with nothing to give
back, 30 ms giving back 500 MB; meanwhile the arena it walks is locked). Where the C library
has no ``malloc_trim`` (musl, macOS) this does nothing.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable

__all__ = ["give_back_freed", "resident_bytes"]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError, TypeError):  # no such C library or symbol
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim  # type: ignore[no-any-return]


_TRIM = _malloc_trim()


def resident_bytes() -> int:
    """The process's resident set in bytes (0 where ``/proc/self/statm`` is not there)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def give_back_freed() -> int:
    """Return the free pages of the C heap to the system; the bytes the resident set shrank by
    (0 where there is no ``malloc_trim``, or nothing to give back).

    Raises:
        nothing.
    """
    if _TRIM is None:
        return 0
    before = resident_bytes()
    _TRIM(0)
    return max(0, before - resident_bytes())

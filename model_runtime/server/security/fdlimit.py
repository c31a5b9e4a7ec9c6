"""How many descriptors the daemon may hold, and so how many client connections it takes.

The default soft open-file limit (1,024 on most systems) resets clients long before the
machine is busy: the daemon raises it to the hard limit at start (:func:`raise_open_file_limit`),
and the connection guard's default limit stays below what is left once the daemon's own files
are counted (:func:`default_max_connections`).
"""

from __future__ import annotations

import resource

__all__ = ["FD_RESERVE", "default_max_connections", "raise_open_file_limit"]

#: File descriptors kept for everything that is not a client connection (models, logs, ...).
FD_RESERVE = 128


def raise_open_file_limit() -> tuple[int, int]:
    """Raise the soft open-file limit to the hard one (what a server should be allowed to
    hold; the default soft 1,024 resets clients long before the machine is busy). Returns the
    (old, new) soft limits.

    Raises:
        nothing: a limit that cannot be raised stays as it is.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard or (hard != resource.RLIM_INFINITY and soft >= hard):
        return soft, soft
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        return soft, soft
    return soft, target


def default_max_connections(cap: int = 4096) -> int:
    """``cap``, or fewer when the soft open-file limit minus :data:`FD_RESERVE` is lower
    (at least 16): past that, accepting would fail for want of descriptors anyway."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return cap
    return max(16, min(cap, soft - FD_RESERVE))

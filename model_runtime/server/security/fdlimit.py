"""How many descriptors the daemon may hold, and so how many client connections it takes.

The default soft open-file limit (1,024 on most systems) resets clients long before the
machine is busy: the daemon raises it to the hard limit at start (:func:`raise_open_file_limit`),
and the descriptors left once the daemon's own files are counted are shared between the
front ends (:class:`DescriptorShares`): a quarter kept for gRPC's connections, HTTP's
connection limit (:func:`default_max_connections`) from the rest, so that slow HTTP clients
at their limit leave gRPC clients descriptors to connect with.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

__all__ = [
    "FD_RESERVE",
    "HTTP_CAP",
    "DescriptorShares",
    "default_max_connections",
    "raise_open_file_limit",
]

#: File descriptors kept for everything that is not a client connection (models, logs, ...).
FD_RESERVE = 128
#: The most HTTP connections held by default, however many descriptors there are.
HTTP_CAP = 4096


@dataclass(frozen=True, slots=True)
class DescriptorShares:
    """Client connections each front end may hold, from the soft open-file limit: what is
    left past :data:`FD_RESERVE`, a quarter of it (at least 16) for gRPC, the rest for
    HTTP up to ``http_cap`` (at least 16)."""

    http: int
    grpc: int

    @classmethod
    def of_limit(cls, soft: int | None = None, http_cap: int = HTTP_CAP) -> DescriptorShares:
        """The shares of ``soft`` descriptors (default: the process's soft limit now).

        Raises:
            nothing: a limit too low for both gives each its floor of 16.
        """
        if soft is None:
            soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return cls(http=http_cap, grpc=http_cap)
        left = soft - FD_RESERVE
        grpc = max(16, left // 4)
        return cls(http=max(16, min(http_cap, left - grpc)), grpc=grpc)


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


def default_max_connections(cap: int = HTTP_CAP) -> int:
    """HTTP's share of the descriptors (:class:`DescriptorShares`), at most ``cap``: past
    it, accepting would fail for want of descriptors, or take gRPC's."""
    return DescriptorShares.of_limit(http_cap=cap).http

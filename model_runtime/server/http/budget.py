"""The memory budget of bytes in flight (request bodies being received, answers waiting for
their client to take them), shared by the front ends.

A request whose body has not all arrived holds memory the client decides on: thirty clients
that each send most of a 64 MiB body and stop hold two gigabytes. Each front end takes a
body's announced size from one :class:`ByteBudget` before it buffers the body, and gives it
back when the request is over; answers a client does not take are charged while they wait
(they are already made: :meth:`ByteBudget.charge` cannot refuse). Past the budget a new
request is refused at once (503 with ``Retry-After``, :func:`budget_refusal`), never buffered.
"""

from __future__ import annotations

__all__ = ["DEFAULT_BUDGET", "ByteBudget", "budget_message", "budget_refusal"]

#: The default budget: four bodies of the largest size the daemon takes (64 MiB) at once. A
#: fixed figure, not a share of the machine's memory: a bigger machine is not a bigger target,
#: and the daemon stays within a few hundred megabytes of its size at rest whatever clients
#: send (a model's own memory is its configuration's to bound).
DEFAULT_BUDGET = 256 << 20


class ByteBudget:
    """Bytes in flight, process-wide: :meth:`take` before buffering, :meth:`give` after."""

    __slots__ = ("in_use", "limit", "refused")

    def __init__(self, limit: int = DEFAULT_BUDGET) -> None:
        if limit < 1:
            raise ValueError(f"the memory budget must be >= 1 byte, got {limit}")
        self.limit = limit
        self.in_use = 0
        #: Requests refused because the budget was spent.
        self.refused = 0

    def take(self, size: int) -> bool:
        """Count ``size`` bytes against the budget; False (nothing counted, the refusal
        counted) when they do not fit."""
        if self.in_use + size > self.limit:
            self.refused += 1
            return False
        self.in_use += size
        return True

    def charge(self, size: int) -> None:
        """Count ``size`` bytes already held (answers waiting), past the budget or not."""
        self.in_use += size

    def give(self, size: int) -> None:
        """Give back ``size`` bytes taken by :meth:`take` or :meth:`charge`."""
        self.in_use -= size


def budget_message(limit: int) -> str:
    """The error text of a request refused for the budget (Triton's ``{"error": ...}``)."""
    return (
        f"the server is receiving more request data than its memory budget "
        f"({limit >> 20} MiB) allows; retry later"
    )


def budget_refusal(limit: int, retry_after: int = 1) -> bytes:
    """The whole HTTP/1.1 answer refusing a request for the budget (the connection stays)."""
    body = b'{"error":"%s"}' % budget_message(limit).encode()
    return (
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        b"Retry-After: %d\r\nContent-Length: %d\r\n\r\n%s" % (retry_after, len(body), body)
    )

"""Each connection's share of the gRPC listener: its calls in flight, counted by connection.

A call is open from its start until its stream ends: answered and written (or reset, or ended
by the write timeout when its client never opens its flow-control window). :class:`Shares`
keeps that count per connection (its client's address and port), and two rules on it:

- a connection has at most ``max_streams`` calls open (HTTP/2's ``MAX_CONCURRENT_STREAMS``,
  which the server advertises; counted here too): past it a call is refused at once;
- a refusal (UNAVAILABLE, RESOURCE_EXHAUSTED) of a call whose connection has other calls open
  that are not refusals themselves is sent once one of those ends, or after ``write_timeout``:
  a client that resends each refused call at once (a flood) gets its refusals at the pace its
  connection's calls end, while a connection with nothing else open is answered at once. A
  connection whose answers are never read therefore costs one call per stream per write timeout,
  not a call per round trip.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Hashable

__all__ = ["Connection", "Shares"]


class Connection:
    """One connection's calls: ``open`` (started, stream not ended), ``refusing`` (refusals
    waiting to be sent) and the refusals waiting, oldest first."""

    __slots__ = ("key", "open", "refusing", "waiting")

    def __init__(self, key: Hashable) -> None:
        self.key = key
        self.open = 0
        self.refusing = 0
        self.waiting: deque[asyncio.Future[None]] = deque()


class Shares:
    """The open calls of one listener's connections (see the module docstring)."""

    def __init__(self, *, max_streams: int, write_timeout: float) -> None:
        if max_streams < 1 or write_timeout <= 0:
            raise ValueError("max_streams and write_timeout must be > 0")
        self.max_streams = max_streams
        self.write_timeout = write_timeout
        self.connections: dict[Hashable, Connection] = {}
        #: Refusals held back until a call of their connection ended (or the write timeout).
        self.held = 0

    def start(self, key: Hashable) -> Connection | None:
        """Count a call starting on connection ``key``; None: it has ``max_streams`` open (the
        call is refused, not counted)."""
        conn = self.connections.get(key)
        if conn is None:
            conn = self.connections[key] = Connection(key)
        elif conn.open >= self.max_streams:
            return None
        conn.open += 1
        return conn

    def end(self, conn: Connection, *, refused: bool = False) -> None:
        """A call of ``conn`` ended (its stream is closed); unless it was ``refused`` itself,
        the oldest refusal waiting on it is sent (a refusal ending wakes none: refusals would
        drain one after another at once)."""
        conn.open -= 1
        waiting = conn.waiting
        while waiting and not refused:
            waiter = waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                break
        if conn.open == 0:
            self.connections.pop(conn.key, None)

    async def before_refusal(self, conn: Connection) -> None:
        """Return when a refusal of one of ``conn``'s calls may be sent: at once if its other
        open calls are all refusals, else once one of them ends or after the write timeout."""
        if conn.open - 1 - conn.refusing <= 0:
            return
        waiter = asyncio.get_running_loop().create_future()
        conn.waiting.append(waiter)
        conn.refusing += 1
        self.held += 1
        try:
            async with asyncio.timeout(self.write_timeout):
                await waiter
        except TimeoutError:
            pass
        finally:
            conn.refusing -= 1
            if not waiter.done():
                waiter.cancel()

"""Each connection's share of the gRPC listener: its calls in flight, counted by connection.

A call is open from its start until its stream ends: answered and written (or reset, or ended
by the write timeout when its client never opens its flow-control window). :class:`Shares`
keeps that count per connection (its client's address and port), and two rules on it:

- a connection has at most ``max_streams`` calls open (HTTP/2's ``MAX_CONCURRENT_STREAMS``,
  which the server advertises; counted here too): past it a call is refused at once;
- at most ``max_busy`` unary calls of a connection are computed at once (from before their
  message is read until their answer is made), and :data:`UNREAD_BUSY` until one of its
  answers was written within half the write timeout (a new connection starts slowly) and while
  ``max_busy`` or more of its answers wait to be written (a client that does not read): the
  others wait their
  turn, oldest first, for up to ``write_timeout`` (then RESOURCE_EXHAUSTED), so that a burst of
  one connection's calls reaches the models at the pace they answer it, and a client that does
  not read its answers has few computed at once;
- a refusal that sheds load (admission's UNAVAILABLE, a budget's RESOURCE_EXHAUSTED; not a
  queue policy's timeout, which is answered when due, as Triton does) of a call whose
  connection has other calls open
  that are not refusals themselves is sent once one of those ends, or after half to all of
  ``write_timeout`` (spread at random, so that refusals held together are not all sent, and
  their calls resent, at once):
  a client that resends each refused call at once (a flood) gets its refusals at the pace its
  connection's calls end, while a connection with nothing else open is answered at once. A
  connection whose answers are never read therefore costs one call per stream per write timeout,
  not a call per round trip.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import Hashable

__all__ = ["MAX_BUSY", "UNREAD_BUSY", "Connection", "Shares"]

#: Unary calls of one connection computed at once (the rest wait their turn) ...
MAX_BUSY = 32
#: ... and while ``max_busy`` of its answers or more wait to be written.
UNREAD_BUSY = 4


class Connection:
    """One connection's calls: ``open`` (started, stream not ended), ``refusing`` (refusals
    waiting to be sent) and the refusals waiting, oldest first."""

    __slots__ = ("busy", "key", "open", "queued", "reads", "refusing", "unsent", "waiting")

    def __init__(self, key: Hashable) -> None:
        self.key = key
        self.open = 0
        self.refusing = 0
        self.waiting: deque[asyncio.Future[None]] = deque()
        #: Calls being computed, and those waiting their turn (oldest first).
        self.busy = 0
        self.queued: deque[asyncio.Future[None]] = deque()
        #: Calls answered whose streams have not ended (answers not yet written).
        self.unsent = 0
        #: An answer of it was written within half the write timeout.
        self.reads = False


class Shares:
    """The open calls of one listener's connections (see the module docstring)."""

    def __init__(self, *, max_streams: int, write_timeout: float, max_busy: int = MAX_BUSY) -> None:
        if max_streams < 1 or write_timeout <= 0 or max_busy < 1:
            raise ValueError("max_streams, max_busy and write_timeout must be > 0")
        self.max_streams = max_streams
        self.max_busy = max_busy
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

    def _turns(self, conn: Connection) -> int:
        return self.max_busy if conn.reads and conn.unsent < self.max_busy else UNREAD_BUSY

    def answered(self, conn: Connection) -> None:
        """A call of ``conn`` was answered; its stream has not ended yet (:meth:`written`)."""
        conn.unsent += 1

    def written(self, conn: Connection, seconds: float) -> None:
        """The stream of an :meth:`answered` call ended ``seconds`` after its answer (written,
        or dropped)."""
        conn.unsent -= 1
        if seconds < self.write_timeout / 2:
            conn.reads = True
        if conn.queued:
            self._wake(conn)

    def try_turn(self, conn: Connection) -> bool:
        """Take one of ``conn``'s turns if one is free now, with no call waiting (True);
        else take nothing (False: wait with :meth:`turn`)."""
        if conn.busy < self._turns(conn) and not conn.queued:
            conn.busy += 1
            return True
        return False

    async def turn(self, conn: Connection) -> bool:
        """Wait until one of ``conn``'s turns is free and take it (True); False when none was
        within the write timeout. Give it back with :meth:`done`."""
        if self.try_turn(conn):
            return True
        waiter = asyncio.get_running_loop().create_future()
        conn.queued.append(waiter)
        try:
            async with asyncio.timeout(self.write_timeout):
                await waiter
        except TimeoutError:
            return waiter.done() and not waiter.cancelled()  # handed over as it timed out
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.done(conn)  # handed over, then cancelled: pass it on
            raise
        finally:
            if not waiter.done():
                waiter.cancel()
            if waiter.cancelled() and waiter in conn.queued:
                conn.queued.remove(waiter)
        return True

    def done(self, conn: Connection) -> None:
        """A call of ``conn`` gives its turn back: to the oldest call waiting, if any."""
        conn.busy -= 1
        if conn.queued:
            self._wake(conn)

    def _wake(self, conn: Connection) -> None:
        queued, turns = conn.queued, self._turns(conn)
        while queued and conn.busy < turns:
            waiter = queued.popleft()
            if not waiter.done():
                conn.busy += 1
                waiter.set_result(None)

    async def before_refusal(self, conn: Connection) -> None:
        """Return when a refusal of one of ``conn``'s calls may be sent: at once if its other
        open calls are all refusals, else once one of them ends or after half to all of the
        write timeout."""
        if conn.open - 1 - conn.refusing <= 0:
            return
        waiter = asyncio.get_running_loop().create_future()
        conn.waiting.append(waiter)
        conn.refusing += 1
        self.held += 1
        try:
            async with asyncio.timeout(self.write_timeout * (0.5 + random.random() / 2)):
                await waiter
        except TimeoutError:
            pass
        finally:
            conn.refusing -= 1
            if not waiter.done():
                waiter.cancel()
            if waiter.cancelled() and waiter in conn.waiting:
                conn.waiting.remove(waiter)

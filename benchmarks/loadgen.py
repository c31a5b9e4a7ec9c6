"""A cheap HTTP/1.1 load generator for one JSON endpoint (used by ``benchmarks/overload.py``).

Why not aiohttp: one aiohttp client process could not send ~8,500 requests/s beside the daemon
on this 2-core machine; its requests queued inside the client and came back as client timeouts
while the daemon idled. This one is as cheap per request as Python allows:

- **prebuilt requests**: a few distinct single-sample requests, each one ``bytes`` object (head
  and body) written with one ``transport.write``;
- **raw HTTP/1.1 over asyncio Protocols** (uvloop when installed), **no pipelining**: many
  keep-alive connections, one request in flight on each; the response parser reads the status
  line, ``Content-Length`` and ``Connection: close`` only, then the body;
- **every 200 checked**: a body is correct when it is byte-equal to a body of the same input
  already found correct, or else when its parsed JSON logits match the expected ones
  (``np.allclose``, rtol 1e-3, atol 1e-4) -- then it joins the known-correct bodies. So 100 % of
  the 200s are checked; only bodies not seen before are parsed (counted: ``json_checks``);
- **N processes** (``multiprocessing`` spawn), each its own event loop and connection pool;
- **open loop**: the send times are fixed in advance (a global schedule at the given rate, every
  N-th send to each process); a request is written when due if a connection is free, or waits
  for the first one freed. Its lateness (written - scheduled) is recorded, and so is whether it
  had to wait for a connection (the pool was exhausted: every connection held a request the
  server had not answered) or only for the event loop (the generator's CPU). Latency and the
  10 s client timeout are measured from the **scheduled** send time; a request still waiting
  for a connection at its deadline is a timeout that was never sent (``unsent``);
- **closed loop**: each of C connections sends its next request as soon as it has an answer.

:class:`loadgen_pool.Client` drives the worker processes; every phase returns a :class:`Record`
(numpy arrays: one entry per request).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

TIMEOUT = 10.0
#: Kinds of outcome (``Record.kind``).
PENDING, OK, WRONG, REFUSED, OTHER, TIMEOUT_KIND, RESET, UNSENT = range(8)
KIND_NAMES = ("pending", "ok", "wrong", "refused", "other_status", "timeout", "reset", "unsent")
_CLOSED_CAPACITY = 400_000
_OPEN_BATCH = 200
_DISPATCH_BURST = 256
#: The open loop's dispatcher sleeps at least this long (s): sends due within it go together.
_TICK = 0.001


def request_bytes(host: str, port: int, path: str, body: bytes) -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


@dataclass
class Record:
    """One phase's requests: scheduled / written / answered times (monotonic s), outcome kind,
    the input each carried, whether it waited for a free connection."""

    sched: np.ndarray
    sent: np.ndarray
    done: np.ndarray
    kind: np.ndarray
    waited: np.ndarray
    cpu_s: float = 0.0
    json_checks: int = 0
    connect_errors: int = 0
    reconnects: int = 0

    @classmethod
    def concat(cls, parts: list[Record]) -> Record:
        order = np.argsort(np.concatenate([p.sched for p in parts]), kind="stable")
        return cls(
            *(np.concatenate([getattr(p, f) for p in parts])[order] for f in _ARRAYS),
            cpu_s=sum(p.cpu_s for p in parts),
            json_checks=sum(p.json_checks for p in parts),
            connect_errors=sum(p.connect_errors for p in parts),
            reconnects=sum(p.reconnects for p in parts),
        )

    def select(self, mask: np.ndarray) -> Record:
        return Record(
            *(getattr(self, f)[mask] for f in _ARRAYS),
            cpu_s=self.cpu_s,
            json_checks=self.json_checks,
            connect_errors=self.connect_errors,
            reconnects=self.reconnects,
        )

    def count(self, kind: int) -> int:
        return int(np.count_nonzero(self.kind == kind))

    def latency(self, kind: int) -> np.ndarray:
        """Seconds from the scheduled send to the answer, of the requests of ``kind``."""
        m = self.kind == kind
        return self.done[m] - self.sched[m]

    def lateness(self) -> np.ndarray:
        """Seconds from the scheduled send to the write, of the requests written."""
        m = self.sent > 0
        return self.sent[m] - self.sched[m]


_ARRAYS = ("sched", "sent", "done", "kind", "waited")


class _Conn(asyncio.Protocol):
    __slots__ = ("buf", "close_after", "gen", "idx", "need", "status", "transport")

    def __init__(self, gen: _Gen) -> None:
        self.gen = gen
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.need = -1
        self.status = 0
        self.close_after = False
        self.idx = -1

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        while True:
            if self.need < 0:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = bytes(buf[:end]).lower()
                del buf[: end + 4]
                try:
                    self.status = int(head[9:12])
                    i = head.index(b"content-length:") + 15
                    j = head.find(b"\r\n", i)
                    self.need = int(head[i : j if j >= 0 else len(head)])
                except ValueError:  # no Content-Length (chunked): not this server's way
                    self.status, self.need = -1, 0
                self.close_after = b"connection: close" in head
            if len(buf) < self.need:
                return
            body = bytes(buf[: self.need])
            del buf[: self.need]
            self.need = -1
            self.gen.answered(self, self.status, body)
            if self.transport is None or self.transport.is_closing():
                return

    def connection_lost(self, exc: Exception | None) -> None:
        self.gen.lost(self)


class _Hold(asyncio.Protocol):
    """An idle keep-alive connection: one GET answered, then nothing."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.answered = asyncio.get_running_loop().create_future()
        self.closed = False
        self.buf = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.write(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if b"\r\n\r\n" in self.buf and not self.answered.done():
            self.answered.set_result(True)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.answered.done():
            self.answered.set_result(False)


class _Gen:
    """One worker process's generator: its pool, its current phase's arrays."""

    def __init__(self, host: str, port: int, requests: list[bytes], expected: list[Any]) -> None:
        self.host, self.port = host, port
        self.requests = requests
        self.expected = [np.asarray(e, dtype=np.float32) for e in expected]
        self.known: list[set[bytes]] = [set() for _ in requests]
        self.conns: set[_Conn] = set()
        self.idle: list[_Conn] = []
        self.busy: set[_Conn] = set()
        self.pending: deque[int] = deque()
        self.held: list[_Hold] = []
        self.target = 0
        self.running = False
        self.closed_mode = False
        self.closed_stop = 0.0
        self.next_slot = 0
        self.json_checks = 0
        self.connect_errors = 0
        self.reconnects = 0
        self._alloc(0)

    def _alloc(self, n: int) -> None:
        self.sched = np.zeros(n)
        self.sent = np.zeros(n)
        self.done = np.zeros(n)
        self.kind = np.zeros(n, dtype=np.int8)
        self.waited = np.zeros(n, dtype=bool)

    # -- connections -----------------------------------------------------------------------

    async def _open_one(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(lambda: _Conn(self), self.host, self.port)
        except OSError:
            self.connect_errors += 1
            return
        self.conns.add(conn)
        self.release(conn)

    async def pool(self, n: int) -> int:
        """Hold ``n`` open connections (open more, or close idle ones)."""
        self.target = n
        while len(self.conns) > n and self.idle:
            c = self.idle.pop()
            self.conns.discard(c)
            if c.transport is not None:
                c.transport.close()
        while len(self.conns) < n:
            k = min(_OPEN_BATCH, n - len(self.conns))
            before = self.connect_errors
            await asyncio.gather(*(self._open_one() for _ in range(k)))
            if self.connect_errors - before == k:
                break
        return len(self.conns)

    def lost(self, conn: _Conn) -> None:
        if conn not in self.conns:
            return
        self.conns.discard(conn)
        self.busy.discard(conn)
        if conn in self.idle:
            self.idle.remove(conn)
        if conn.idx >= 0:
            self._finish(conn.idx, RESET, time.monotonic())
            conn.idx = -1
        if len(self.conns) < self.target:
            self.reconnects += 1
            asyncio.get_running_loop().create_task(self._open_one())

    # -- requests --------------------------------------------------------------------------

    def _finish(self, idx: int, kind: int, now: float) -> None:
        if self.kind[idx] == PENDING:
            self.kind[idx] = kind
            self.done[idx] = now

    def _send(self, conn: _Conn, idx: int) -> None:
        conn.idx = idx
        self.busy.add(conn)
        self.sent[idx] = time.monotonic()
        conn.transport.write(self.requests[idx % len(self.requests)])  # type: ignore[union-attr]

    def dispatch(self, idx: int) -> None:
        if self.idle:
            self._send(self.idle.pop(), idx)
        else:
            self.waited[idx] = True
            self.pending.append(idx)

    def release(self, conn: _Conn) -> None:
        """``conn`` is free: the next request on it, or into the idle pool."""
        if (
            self.closed_mode
            and self.running
            and time.monotonic() < self.closed_stop
            and self.next_slot < len(self.sched)
        ):
            idx = self.next_slot
            self.next_slot += 1
            self.sched[idx] = time.monotonic()
            self._send(conn, idx)
            return
        while self.pending:
            idx = self.pending.popleft()
            if time.monotonic() - self.sched[idx] < TIMEOUT:
                self._send(conn, idx)
                return
            self._finish(idx, UNSENT, time.monotonic())
        self.idle.append(conn)

    def check(self, idx: int, body: bytes) -> bool:
        i = idx % len(self.requests)
        known = self.known[i]
        if body in known:
            return True
        self.json_checks += 1
        try:
            out = orjson.loads(body)["outputs"][0]["data"]
            good = bool(np.allclose(out, self.expected[i], rtol=1e-3, atol=1e-4))
        except (ValueError, KeyError, IndexError, TypeError):
            return False
        if good and len(known) < 256:
            known.add(body)
        return good

    def answered(self, conn: _Conn, status: int, body: bytes) -> None:
        idx = conn.idx
        conn.idx = -1
        self.busy.discard(conn)
        now = time.monotonic()
        if idx >= 0:
            if status == 200:
                kind = OK if self.check(idx, body) else WRONG
            elif status == 503:
                kind = REFUSED
            else:
                kind = OTHER
            self._finish(idx, kind, now)
        if conn.close_after or status < 0:
            conn.transport.close()  # type: ignore[union-attr]  # lost() replaces it
        else:
            self.release(conn)

    async def _sweep(self) -> None:
        """Time out requests 10 s past their scheduled send (their connection is aborted)."""
        while self.running:
            await asyncio.sleep(0.05)
            now = time.monotonic()
            for conn in [c for c in self.busy if now - self.sched[c.idx] >= TIMEOUT]:
                self._finish(conn.idx, TIMEOUT_KIND, now)
                conn.idx = -1
                self.busy.discard(conn)
                conn.transport.abort()  # type: ignore[union-attr]
            while self.pending and now - self.sched[self.pending[0]] >= TIMEOUT:
                self._finish(self.pending.popleft(), UNSENT, now)

    def _result(self, n: int, cpu0: float) -> Record:
        return Record(
            self.sched[:n].copy(),
            self.sent[:n].copy(),
            self.done[:n].copy(),
            self.kind[:n].copy(),
            self.waited[:n].copy(),
            cpu_s=time.process_time() - cpu0,
            json_checks=self.json_checks,
            connect_errors=self.connect_errors,
            reconnects=self.reconnects,
        )

    async def _drain(self, deadline: float) -> None:
        while (self.busy or self.pending) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.02)

    async def open_loop(self, sched: np.ndarray) -> Record:
        """Send at the times of ``sched`` (monotonic s), whatever the answers."""
        n = len(sched)
        self._alloc(n)
        self.sched[:] = sched
        self.json_checks = self.connect_errors = self.reconnects = 0
        cpu0 = time.process_time()
        self.running, self.closed_mode = True, False
        sweeper = asyncio.get_running_loop().create_task(self._sweep())
        times = sched.tolist()
        i = 0
        while i < n:
            now = time.monotonic()
            burst = 0
            while i < n and times[i] <= now and burst < _DISPATCH_BURST:
                self.dispatch(i)
                i += 1
                burst += 1
            if i < n:
                # Not less than a tick: uvloop's timers have 1 ms resolution, and a shorter
                # sleep spins, burning the CPU the server under test needs.
                await asyncio.sleep(max(_TICK, times[i] - time.monotonic()))
        await self._drain((times[-1] if n else time.monotonic()) + TIMEOUT + 1.0)
        self.running = False
        await sweeper
        return self._result(n, cpu0)

    async def closed_loop(self, clients: int, seconds: float) -> Record:
        """``clients`` connections, each sending its next request once answered."""
        await self.pool(max(clients, self.target))
        self._alloc(_CLOSED_CAPACITY)
        self.json_checks = self.connect_errors = self.reconnects = 0
        cpu0 = time.process_time()
        self.next_slot = 0
        self.closed_mode, self.running = True, True
        self.closed_stop = time.monotonic() + seconds
        sweeper = asyncio.get_running_loop().create_task(self._sweep())
        starters = self.idle[:clients]
        del self.idle[:clients]
        for conn in starters:
            self.release(conn)
        await asyncio.sleep(seconds)
        await self._drain(time.monotonic() + TIMEOUT + 1.0)
        self.running = False
        await sweeper
        self.closed_mode = False
        return self._result(self.next_slot, cpu0)

    async def hold(self, n: int) -> dict[str, int]:
        """Open ``n`` idle keep-alive connections (each answered one GET), 100 at a time."""
        loop = asyncio.get_running_loop()
        failed = 0
        for start in range(0, n, 100):
            batch = []
            for _ in range(min(100, n - start)):
                batch.append(loop.create_connection(_Hold, self.host, self.port))
            for res in await asyncio.gather(*batch, return_exceptions=True):
                if isinstance(res, BaseException):
                    failed += 1
                    continue
                proto = res[1]
                try:
                    ok = await asyncio.wait_for(proto.answered, TIMEOUT)
                except TimeoutError:
                    ok = False
                if ok:
                    self.held.append(proto)
                else:
                    failed += 1
                    if proto.transport is not None:
                        proto.transport.close()
        return {"opened": len(self.held), "failed": failed}

    async def unhold(self) -> dict[str, int]:
        still = sum(1 for h in self.held if not h.closed)
        for h in self.held:
            if h.transport is not None:
                h.transport.close()
        self.held = []
        await asyncio.sleep(0.1)
        return {"still_open": still}


def schedule(t0: float, segments: list[tuple[float, float]]) -> np.ndarray:
    """Send times (monotonic s) from ``t0``: ``rate`` requests/s for ``seconds``, per segment."""
    parts, t = [], t0
    for rate, seconds in segments:
        n = int(rate * seconds)
        parts.append(t + np.arange(n) / rate)
        t += seconds
    return np.concatenate(parts) if parts else np.zeros(0)

"""The load generator's worker processes (``loadgen.py``'s generators, one per process).

:class:`Client` starts ``processes`` spawned workers, each its own event loop (uvloop) and
connection pool, and runs each phase on all of them at once; their :class:`~loadgen.Record`
parts come back concatenated.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from benchmarks.loadgen import Record, _Gen

__all__ = ["Client"]


def _worker(pipe: Connection, host: str, port: int, requests: list[bytes], expected: list) -> None:
    try:
        import uvloop

        loop = uvloop.new_event_loop()
    except ImportError:  # pragma: no cover
        loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    gen = loop.run_until_complete(_make(host, port, requests, expected))
    while True:
        cmd, *args = pipe.recv()
        if cmd == "exit":
            break
        result = loop.run_until_complete(getattr(gen, cmd)(*args))
        pipe.send(result)
    for c in list(gen.conns):
        if c.transport is not None:
            c.transport.close()
    loop.run_until_complete(asyncio.sleep(0.05))
    loop.close()


async def _make(host: str, port: int, requests: list[bytes], expected: list) -> _Gen:
    return _Gen(host, port, requests, expected)


class Client:
    """``processes`` worker processes generating load at ``host:port``.

    ``requests``: prebuilt HTTP requests (see :func:`request_bytes`); ``expected[i]``: the
    output a correct answer to ``requests[i]`` carries.
    """

    def __init__(
        self, host: str, port: int, requests: list[bytes], expected: list, processes: int = 2
    ) -> None:
        ctx = mp.get_context("spawn")
        self.pipes: list[Connection] = []
        self.procs: list[Any] = []
        exp = [np.asarray(e, dtype=np.float32).tolist() for e in expected]
        for _ in range(processes):
            a, b = ctx.Pipe()
            p = ctx.Process(target=_worker, args=(b, host, port, requests, exp), daemon=True)
            p.start()
            self.pipes.append(a)
            self.procs.append(p)

    @property
    def n(self) -> int:
        return len(self.pipes)

    def _split(self, total: int) -> list[int]:
        return [total // self.n + (1 if k < total % self.n else 0) for k in range(self.n)]

    def start(self, cmd: str, per_worker: list[tuple[Any, ...]]) -> None:
        for pipe, args in zip(self.pipes, per_worker, strict=True):
            pipe.send((cmd, *args))

    def ready(self) -> bool:
        return all(p.poll() for p in self.pipes)

    def collect(self) -> list[Any]:
        return [p.recv() for p in self.pipes]

    def call(self, cmd: str, per_worker: list[tuple[Any, ...]]) -> list[Any]:
        self.start(cmd, per_worker)
        return self.collect()

    def pool(self, total: int) -> int:
        return sum(self.call("pool", [(k,) for k in self._split(total)]))

    def closed_loop(self, clients: int, seconds: float) -> Record:
        parts = self.call("closed_loop", [(k, seconds) for k in self._split(clients)])
        return Record.concat(parts)

    def start_open_loop(self, sched: np.ndarray) -> None:
        """Start an open-loop phase: every N-th send of the global schedule to each worker;
        :meth:`finish_open_loop` collects it."""
        self.start("open_loop", [(sched[k :: self.n],) for k in range(self.n)])

    def finish_open_loop(self) -> Record:
        return Record.concat(self.collect())

    def hold(self, total: int) -> dict[str, int]:
        out = self.call("hold", [(k,) for k in self._split(total)])
        return {k: sum(o[k] for o in out) for k in out[0]}

    def unhold(self) -> dict[str, int]:
        out = self.call("unhold", [() for _ in range(self.n)])
        return {k: sum(o[k] for o in out) for k in out[0]}

    def close(self) -> None:
        for pipe in self.pipes:
            try:
                pipe.send(("exit",))
            except OSError:
                pass
        for p in self.procs:
            p.join(5)
            if p.is_alive():
                p.terminate()

"""The bare reference batcher of DESIGN §13: the simplest correct batcher, for ratios.

Async callers append ``(row, future)`` to a list and await the future; one task on the loop
seals a batch once B rows wait (or flushes a partial batch ``flush_s`` after it woke for the
first row, zero-padded, stacked on the loop) and hands it to one of ``devices`` worker threads,
each with its own :class:`CpuBackend` (so session options and weight binding are the runtime
device's own): the worker with the fewest batches in flight gets it, and runs only the
executable's main program. Back on the loop each future gets its caller's row of the outputs.
One sealer for every device, so a second device adds throughput instead of splitting the
callers into two half-full batchers. (Stacking and splitting on the worker instead holds the
GIL beside the run: 63k samples/s instead of 80k for the MLP at 1x1 on the 2-core machine.)
Its worker threads run under the runtime's device workers' interpreter switch interval
(:func:`~actors.device.worker.claim_switch_interval`: with the default, a busy loop keeps
the GIL from a worker whose run has ended). No validation, retries, admission or fault
handling: what the host allows, nothing more.
"""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from actors.device.backends.cpu import CpuBackend
from actors.device.inventory import DeviceSpec
from actors.device.worker import claim_switch_interval
from model_runtime.executable import Executable

Row = dict[str, np.ndarray]


class _Worker:
    """One device: its backend, its thread, and the batches handed to it and not answered."""

    def __init__(self, exe: Executable, device: int, threads: int) -> None:
        self.backend = CpuBackend(DeviceSpec(id=device, kind="cpu", threads=threads))
        self.backend.load(exe, None)
        self.thread = ThreadPoolExecutor(1, thread_name_prefix=f"bare-batcher-{device}")
        self.in_flight = 0


class BareBatcher:
    """``async with BareBatcher(exe, threads, devices) as b: out = await b.infer(row)`` (rows
    [1, ...]); ``devices`` cpu devices of ``threads`` intra-op threads each."""

    def __init__(
        self, exe: Executable, threads: int, devices: int = 1, flush_s: float = 0.002
    ) -> None:
        claim_switch_interval()  # as the runtime's device workers do: same interpreter
        meta = exe.metadata
        self._batch, self._iterations = meta.batch_size, meta.device_iterations
        self._size = self._batch * self._iterations  # rows per main run
        self._inputs = [(a.name, a.shape, a.dtype) for a in meta.user_inputs]
        self._workers = [_Worker(exe, d, threads) for d in range(devices)]
        self._flush_s = flush_s
        self._pending: list[tuple[Row, asyncio.Future[Row]]] = []
        self._wake = asyncio.Event()

    async def __aenter__(self) -> BareBatcher:
        self._sealer = asyncio.get_running_loop().create_task(self._seal())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._sealer.cancel()
        for worker in self._workers:
            worker.thread.shutdown(wait=True)
            worker.backend.unload()

    async def infer(self, row: Row) -> Row:
        future: asyncio.Future[Row] = asyncio.get_running_loop().create_future()
        self._pending.append((row, future))
        if len(self._pending) == 1 or len(self._pending) >= self._size:
            self._wake.set()
        return await future

    async def _seal(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self._pending:
                self._wake.clear()
                await self._wake.wait()
            if len(self._pending) < self._size:  # wait for a full batch, at most flush_s
                try:
                    async with asyncio.timeout(self._flush_s):
                        while len(self._pending) < self._size:
                            self._wake.clear()
                            await self._wake.wait()
                except TimeoutError:
                    pass
            batch, self._pending = self._pending[: self._size], self._pending[self._size :]
            try:
                feed = self._pack(batch)
            except Exception as exc:  # a malformed row fails its batch, not the batcher
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            worker = min(self._workers, key=lambda w: w.in_flight)
            worker.in_flight += 1
            done = loop.run_in_executor(worker.thread, worker.backend.run_main, feed)
            done.add_done_callback(functools.partial(self._resolve, worker, batch))

    def _pack(self, batch: list[tuple[Row, Any]]) -> list[Row]:
        """The rows stacked and zero-padded, cut into the main run's device iterations."""
        feed: Row = {}
        for name, shape, dtype in self._inputs:
            full = np.zeros((self._size, *shape[1:]), dtype)
            np.concatenate([row[name] for row, _ in batch], out=full[: len(batch)])
            feed[name] = full
        b = self._batch
        return [
            {n: v[k * b : (k + 1) * b] for n, v in feed.items()} for k in range(self._iterations)
        ]

    def _resolve(
        self,
        worker: _Worker,
        batch: list[tuple[Row, asyncio.Future[Row]]],
        done: asyncio.Future[Any],
    ) -> None:
        """On the loop: each caller's row of the outputs (or the run's error)."""
        worker.in_flight -= 1
        exc = done.exception()
        outs = done.result() if exc is None else []
        b = self._batch
        for i, (_, future) in enumerate(batch):
            if future.done():  # the caller was cancelled
                continue
            if exc is not None:
                future.set_exception(exc)
            else:
                j = i % b
                future.set_result({n: v[j : j + 1] for n, v in outs[i // b].items()})

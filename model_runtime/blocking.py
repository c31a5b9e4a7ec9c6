"""A blocking face of :class:`ModelRunner` for synchronous code: plain threads, many at once.

The runner lives on an event loop that a background thread owns; ``execute`` from any thread
submits the coroutine to that loop and waits for its result. The loop thread is the only one
that touches the actors, so callers from any number of threads are safe without a lock (the
seed's ``thread_safe`` is always on here).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine, Mapping
from types import TracebackType
from typing import Any, TypeVar

import numpy as np

from model_runtime.errors import RunnerStoppedError
from model_runtime.io import DataDesc
from model_runtime.runner import ModelRunner, ModelRunnerConfig, Source

__all__ = ["BlockingModelRunner"]

T = TypeVar("T")


class BlockingModelRunner:
    """``with BlockingModelRunner(path, config) as runner: runner.execute(inputs)``."""

    def __init__(self, source: Source, config: ModelRunnerConfig | None = None) -> None:
        self._runner = ModelRunner(source, config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closing: asyncio.Event
        self._host: asyncio.Task[None]

    def __enter__(self) -> BlockingModelRunner:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def runner(self) -> ModelRunner:
        """The asynchronous runner underneath (use it only on its own loop)."""
        return self._runner

    def start(self, timeout: float | None = None) -> None:
        """Start the loop thread and the runner; returns once it serves.

        Raises:
            ModelRuntimeError: whatever :meth:`ModelRunner.start` raises.
        """
        with self._lock:
            if self._thread is not None:
                return
            ready = threading.Event()

            def main() -> None:
                loop = asyncio.new_event_loop()
                self._loop = loop
                asyncio.set_event_loop(loop)
                ready.set()
                loop.run_forever()
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

            self._thread = threading.Thread(target=main, name="model-runtime-loop", daemon=True)
            self._thread.start()
            ready.wait()
        try:
            self._call(self._start_host(), timeout)
        except BaseException:
            self._stop_loop()
            raise

    async def _start_host(self) -> None:
        # The runner's task group must be entered and exited by one task: a host task owns the
        # runner's whole life, from start to close.
        started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._closing = asyncio.Event()

        async def host() -> None:
            try:
                async with self._runner:
                    started.set_result(None)
                    await self._closing.wait()
            except BaseException as exc:
                if not started.done():
                    started.set_exception(exc)
                    return
                raise

        self._host = asyncio.get_running_loop().create_task(host())
        await started

    async def _close_host(self) -> None:
        self._closing.set()
        await self._host

    def execute(
        self,
        inputs: Mapping[str, np.ndarray],
        outputs: Mapping[str, np.ndarray] | None = None,
        replica_id: int | None = None,
        timeout: float | None = None,
    ) -> dict[str, np.ndarray]:
        """Run the model on ``inputs`` from any thread (see :meth:`ModelRunner.execute`).

        Raises:
            RunnerStoppedError: the runner is not running.
            ModelRuntimeError: whatever :meth:`ModelRunner.execute` raises.
        """
        return self._call(self._runner.execute(inputs, outputs, replica_id, timeout))

    def get_execute_inputs(self) -> list[DataDesc]:
        """See :meth:`ModelRunner.get_execute_inputs`."""
        return self._runner.get_execute_inputs()

    def get_execute_outputs(self) -> list[DataDesc]:
        """See :meth:`ModelRunner.get_execute_outputs`."""
        return self._runner.get_execute_outputs()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run any coroutine of the runner (statistics, ...) on its loop and wait for it.

        Raises:
            RunnerStoppedError: the loop is not running.
        """
        return self._call(coro, timeout)

    def close(self) -> None:
        """Drain and stop the runner, then the loop thread. Idempotent."""
        if self._loop is None:
            return
        try:
            self._call(self._close_host())
        finally:
            self._stop_loop()

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        loop = self._loop
        if loop is None or not loop.is_running():
            coro.close()
            raise RunnerStoppedError("the blocking runner is not running")
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise

    def _stop_loop(self) -> None:
        loop, thread = self._loop, self._thread
        self._loop = None
        self._thread = None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(timeout=30)

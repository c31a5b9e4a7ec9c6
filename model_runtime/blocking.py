"""A blocking face of :class:`ModelRunner` for synchronous code: plain threads, many at once.

Synchronous callers reach the runtime through one process-wide anyio blocking portal
(:func:`shared_portal`): an event loop in a background thread that hosts the runtime's tree for
every :class:`BlockingModelRunner` and every embedded engine (:mod:`model_runtime.embedded`).
``execute`` from any thread runs the runner's coroutine on that loop and waits for it; only the
portal's thread touches the actors, so callers from any number of threads are safe without a
lock (the seed's ``thread_safe`` is always on here).
"""

from __future__ import annotations

import atexit
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, TypeVar

import anyio.from_thread
import numpy as np
from anyio.from_thread import BlockingPortal

from model_runtime.errors import RunnerStoppedError
from model_runtime.io import DataDesc
from model_runtime.runner import ModelRunner, ModelRunnerConfig, Source

__all__ = ["BlockingModelRunner", "run_in_portal", "shared_portal"]

T = TypeVar("T")

_portal_lock = threading.Lock()
_portal: BlockingPortal | None = None
_portal_cm: AbstractContextManager[BlockingPortal] | None = None


def shared_portal() -> BlockingPortal:
    """The process's blocking portal (started on first use, stopped at interpreter exit).

    Raises:
        nothing.
    """
    global _portal, _portal_cm
    with _portal_lock:
        if _portal is None:
            _portal_cm = anyio.from_thread.start_blocking_portal()
            _portal = _portal_cm.__enter__()
        return _portal


def _stop_portal() -> None:
    """Stop the shared portal (at exit: after the embedded engines, registered later)."""
    global _portal, _portal_cm
    with _portal_lock:
        cm, _portal, _portal_cm = _portal_cm, None, None
    if cm is not None:
        cm.__exit__(None, None, None)


atexit.register(_stop_portal)  # at import: atexit runs it after handlers registered later


def run_in_portal(fn: Callable[..., Awaitable[T]], *args: Any, timeout: float | None = None) -> T:
    """Run ``fn(*args)`` on the shared portal's loop and wait for its result.

    Raises:
        RunnerStoppedError: the portal is stopped (the interpreter is exiting).
        TimeoutError: no result within ``timeout`` seconds (the call is cancelled).
        Exception: whatever ``fn`` raised.
    """
    try:
        future: concurrent.futures.Future[T] = shared_portal().start_task_soon(fn, *args)
    except RuntimeError as exc:  # the portal's loop has stopped
        raise RunnerStoppedError("the runtime's portal is stopped") from exc
    try:
        return future.result(timeout)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise


class BlockingModelRunner:
    """``with BlockingModelRunner(path, config) as runner: runner.execute(inputs)``."""

    def __init__(self, source: Source, config: ModelRunnerConfig | None = None) -> None:
        self._runner = ModelRunner(source, config)
        self._started = False

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
        """The asynchronous runner underneath (use it only on the portal's loop)."""
        return self._runner

    def start(self, timeout: float | None = None) -> None:
        """Start the runner on the shared portal; returns once it serves. Idempotent.

        Raises:
            ModelRuntimeError: whatever :meth:`ModelRunner.start` raises.
        """
        if self._started:
            return
        run_in_portal(self._runner.start, timeout=timeout)
        self._started = True

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
        if not self._started:
            raise RunnerStoppedError("the blocking runner is not running")
        return run_in_portal(self._runner.execute, inputs, outputs, replica_id, timeout)

    def get_execute_inputs(self) -> list[DataDesc]:
        """See :meth:`ModelRunner.get_execute_inputs`."""
        return self._runner.get_execute_inputs()

    def get_execute_outputs(self) -> list[DataDesc]:
        """See :meth:`ModelRunner.get_execute_outputs`."""
        return self._runner.get_execute_outputs()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run any coroutine of the runner (statistics, ...) on its loop and wait for it.

        Raises:
            RunnerStoppedError: the runner is not running.
        """
        if not self._started:
            coro.close()
            raise RunnerStoppedError("the blocking runner is not running")

        async def wait() -> T:
            return await coro

        return run_in_portal(wait, timeout=timeout)

    def close(self) -> None:
        """Drain and stop the runner. Idempotent.

        Raises:
            nothing.
        """
        if not self._started:
            return
        self._started = False
        try:
            run_in_portal(self._runner.close)
        except RunnerStoppedError:
            pass  # the portal stopped at exit, and the runner with it

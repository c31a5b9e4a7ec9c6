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

from actors.session.state import ReplicaState, ReplicaStatus
from model_runtime.errors import RunnerStoppedError
from model_runtime.executable import Executable
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
    """A :class:`ModelRunner` for synchronous code: ``with BlockingModelRunner(path, config) as
    runner: runner.execute(inputs)``, from any number of threads.

    Every method mirrors the :class:`ModelRunner` method of the same name. Calls that touch the
    runtime (execution, statistics, replica status) run on the shared portal's loop; model
    descriptions are immutable and answered in the caller's thread.
    """

    def __init__(self, source: Source, config: ModelRunnerConfig | None = None) -> None:
        """Prepare a runner for ``source`` (nothing is loaded until :meth:`start`).

        Raises:
            ConfigurationError: ``config`` holds an invalid value.
        """
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

    @property
    def config(self) -> ModelRunnerConfig:
        """The configuration this runner runs with (read it; do not modify it).

        Raises:
            nothing.
        """
        return self._runner.config

    @property
    def executable(self) -> Executable:
        """The executable this runner runs.

        Raises:
            RunnerStoppedError: the runner was made from a path and has not been started.
        """
        return self._runner.executable

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, timeout: float | None = None) -> None:
        """Start the runner on the shared portal; returns once it serves. Idempotent.

        Raises:
            TimeoutError: it did not start within ``timeout`` seconds (the start is cancelled).
            ModelRuntimeError: whatever :meth:`ModelRunner.start` raises.
        """
        if self._started:
            return
        run_in_portal(self._runner.start, timeout=timeout)
        self._started = True

    def stop(self, grace: float | None = None) -> None:
        """Stop as :meth:`ModelRunner.stop`: requests in flight get ``grace`` seconds (None:
        as long as they take), the rest :class:`RunnerStoppedError`. Idempotent.

        Raises:
            nothing.
        """
        if not self._started:
            return
        self._started = False
        try:
            run_in_portal(self._runner.stop, grace)
        except RunnerStoppedError:
            pass  # the portal stopped at exit, and the runner with it

    def close(self) -> None:
        """Drain and stop the runner (:meth:`stop` with the configured ``drain_timeout``).
        Idempotent.

        Raises:
            nothing.
        """
        self.stop(self._runner.config.drain_timeout)

    # -- execution ---------------------------------------------------------------------------

    def execute(
        self,
        inputs: Mapping[str, np.ndarray],
        outputs: Mapping[str, np.ndarray] | None = None,
        replica_id: int | None = None,
        timeout: float | None = None,
    ) -> dict[str, np.ndarray]:
        """Run the model on ``inputs`` from any thread and wait for its outputs (see
        :meth:`ModelRunner.execute`).

        Raises:
            InputValidationError: the inputs, outputs or replica_id do not fit the model.
            RunnerStoppedError: the runner is not running.
            ExecutionTimeoutError: the request passed ``timeout``.
            RuntimeFailure: the device failed and recovery (per the config) did not help.
        """
        if not self._started:
            raise RunnerStoppedError("the blocking runner is not running")
        return run_in_portal(self._runner.execute, inputs, outputs, replica_id, timeout)

    def execute_async(
        self,
        inputs: Mapping[str, np.ndarray],
        outputs: Mapping[str, np.ndarray] | None = None,
        replica_id: int | None = None,
        timeout: float | None = None,
    ) -> concurrent.futures.Future[dict[str, np.ndarray]]:
        """Submit a request and return at once a future of its outputs (the seed's
        ``executeAsync``); the caller does not wait for the runner's loop.

        Requests submitted from one thread reach the runner in the order they were submitted.
        ``future.cancel()`` withdraws a request that has not completed. The arrays (inputs and
        ``outputs`` buffers) must not be modified until the future is done.

        Raises:
            RunnerStoppedError: the runner is not running (at once).

        The future's exception is one of those :meth:`execute` raises (an input error included:
        it is found on the loop, before the request is queued).
        """
        if not self._started:
            raise RunnerStoppedError("the blocking runner is not running")
        try:
            return shared_portal().start_task_soon(
                self._runner.execute, inputs, outputs, replica_id, timeout
            )
        except RuntimeError as exc:  # the portal's loop has stopped (interpreter exit)
            raise RunnerStoppedError("the runtime's portal is stopped") from exc

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run any coroutine of the runner on its loop and wait for it.

        Raises:
            RunnerStoppedError: the runner is not running.
            TimeoutError: no result within ``timeout`` seconds (the coroutine is cancelled).
            Exception: whatever the coroutine raised.
        """
        if not self._started:
            coro.close()
            raise RunnerStoppedError("the blocking runner is not running")

        async def wait() -> T:
            return await coro

        return run_in_portal(wait, timeout=timeout)

    # -- descriptions --------------------------------------------------------------------------

    def get_execute_inputs(self) -> list[DataDesc]:
        """Inputs ``execute`` takes (one batch's shapes).

        Raises:
            RunnerStoppedError: the runner was made from a path and has not been started.
        """
        return self._runner.get_execute_inputs()

    def get_execute_outputs(self) -> list[DataDesc]:
        """Outputs ``execute`` returns (one batch's shapes).

        Raises:
            RunnerStoppedError: the runner was made from a path and has not been started.
        """
        return self._runner.get_execute_outputs()

    def get_model_inputs(self) -> list[DataDesc]:
        """Every input of the model: execute inputs plus weights and variables loaded once.

        Raises:
            RunnerStoppedError: the runner was made from a path and has not been started.
        """
        return self._runner.get_model_inputs()

    def get_model_outputs(self) -> list[DataDesc]:
        """Every output of the model.

        Raises:
            RunnerStoppedError: the runner was made from a path and has not been started.
        """
        return self._runner.get_model_outputs()

    # -- replicas and statistics -----------------------------------------------------------------

    def replica_status(self) -> list[ReplicaStatus]:
        """The status of every replica (empty before start; STOPPED after stop).

        Raises:
            nothing.
        """
        return self._on_loop(self._runner.replica_status)

    def replica_states(self) -> list[ReplicaState]:
        """Every replica's live state (status, device, runs, resets); read, do not modify.

        Raises:
            nothing.
        """
        return self._on_loop(self._runner.replica_states)

    @property
    def is_ready(self) -> bool:
        """True while at least one replica takes requests (see :attr:`ModelRunner.is_ready`).

        Raises:
            nothing.
        """

        def ready() -> bool:
            return self._runner.is_ready

        return self._on_loop(ready)

    def get_time_trace(self, replica_id: int = 0) -> dict[str, float]:
        """Durations (µs) of the last request on ``replica_id`` (seed key names).

        Raises:
            RunnerStoppedError: the runner is not running.
            InputValidationError: ``replica_id`` is out of range.
        """
        return self.call(self._runner.get_time_trace(replica_id))

    def get_monitoring_statistics_percentile(
        self, quantile: float = 0.9, replica_id: int = 0
    ) -> dict[str, float]:
        """Latency percentiles (µs) of the recorded requests (seed key names).

        Raises:
            RunnerStoppedError: the runner is not running.
            InputValidationError: ``replica_id`` is out of range.
            ValueError: ``quantile`` is not within [0, 1].
        """
        return self.call(self._runner.get_monitoring_statistics_percentile(quantile, replica_id))

    def get_monitoring_statistics_mean(self, replica_id: int = 0) -> dict[str, float]:
        """Mean latencies (µs) of the recorded requests (seed key names).

        Raises:
            RunnerStoppedError: the runner is not running.
            InputValidationError: ``replica_id`` is out of range.
        """
        return self.call(self._runner.get_monitoring_statistics_mean(replica_id))

    def get_monitoring_statistics_total_count(self, replica_id: int = 0) -> dict[str, float]:
        """Number of requests recorded per phase (seed key names).

        Raises:
            RunnerStoppedError: the runner is not running.
            InputValidationError: ``replica_id`` is out of range.
        """
        return self.call(self._runner.get_monitoring_statistics_total_count(replica_id))

    def _on_loop(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the portal's loop while the runner runs (its loop is the only writer of
        replica state); before start and after stop nothing writes it, so here and now."""
        if self._started:

            async def read() -> T:
                return fn()

            try:
                return run_in_portal(read)
            except RunnerStoppedError:
                pass  # the portal stopped at exit, and the runner with it
        return fn()

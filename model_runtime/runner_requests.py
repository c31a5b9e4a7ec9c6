"""What a request goes through on its way to a replica's queue, for
:class:`~model_runtime.runner.ModelRunner` (``RunnerRequests``, a base of it): its inputs
validated (once per distinct signature), the configured admission bounds, and its deadline."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from actors.clock import Clock, SystemClock, move_on_after
from model_runtime.errors import QueueFullError, RequestTimeoutError
from model_runtime.executable import Executable
from model_runtime.io import check_batch_bytes, validate_inputs, validate_outputs
from model_runtime.replicas import ReplicaSet
from model_runtime.runner_config import ModelRunnerConfig

__all__ = ["RunnerRequests", "expire_request"]

#: Distinct input signatures a runner remembers as valid (past it, each is validated anew).
_SIGNATURES = 256


def _timed_out(timeout: float) -> str:
    """What a request past its deadline is told: Triton's words first (clients match on them),
    then ours (the deadline covers the run too, where Triton's covers the queue only)."""
    return f"Request timeout expired: the request did not complete within {timeout} s"


def expire_request(future: asyncio.Future[Any], timeout: float) -> None:
    """A request's deadline passed: its caller gets :class:`RequestTimeoutError`."""
    if not future.done():
        future.set_exception(RequestTimeoutError(_timed_out(timeout)))


class RunnerRequests:
    """Checks and deadlines of a runner's requests (the state they use is the runner's own)."""

    config: ModelRunnerConfig
    _clock: Clock
    _loop: asyncio.AbstractEventLoop | None
    _in_shapes: tuple[Any, ...]
    _out_shapes: tuple[Any, ...]
    _strings: bool
    _dynamic: bool
    _signatures: dict[tuple[Any, ...], int]
    _last_one: tuple[Any, ...]

    if TYPE_CHECKING:

        @property
        def _executable(self) -> Executable: ...

    def _checked(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, np.ndarray] | None
    ) -> tuple[Mapping[str, np.ndarray], int]:
        """The request's arrays and samples: validated (``validate_io_params``), or read as
        given."""
        if self.config.validate_io_params:
            arrays, samples = self._validated(inputs)
            if outputs is not None:
                validate_outputs(outputs, self._out_shapes, samples)
            return arrays, samples
        arrays = dict(inputs)
        first = next((s for s in self._in_shapes if s.batched), None)
        if first is None:
            return arrays, self._executable.metadata.batch_size
        return arrays, arrays[first.name].shape[first.axis]

    def _admit(self, replicas: ReplicaSet, samples: int) -> None:
        """Refuse a request the configured bounds have no room for (nothing is queued).

        Raises:
            QueueFullError: ``max_queue_size`` requests wait, or the backlog would take longer
                than ``latency_budget``.
        """
        config = self.config
        limit = config.max_queue_size
        if limit is not None and replicas.waiting_requests() >= limit:
            raise QueueFullError(  # Triton's words first: clients match on them
                f"Exceeds maximum queue size: model {self._executable.metadata.model_name!r} has "
                f"{limit} requests waiting (max_queue_size {limit}); retry later"
            )
        budget = config.latency_budget
        if (
            budget is not None
            and (backlog := replicas.backlog_seconds(samples)) > budget
            and replicas.waiting_requests()  # a request is always taken when nothing waits
        ):
            raise QueueFullError(
                f"model {self._executable.metadata.model_name!r}: the queue would take "
                f"{backlog:.3g} s to serve, past the latency budget of {budget:g} s; retry later"
            )

    def _validated(self, inputs: Mapping[str, Any]) -> tuple[Mapping[str, np.ndarray], int]:
        """``validate_inputs``, done once per distinct signature (names in order, dtypes,
        shapes) of a dict of arrays: a repeated signature costs one dict lookup."""
        if type(inputs) is dict and len(inputs) == 1:  # the common case, without a list
            for name, value in inputs.items():
                if type(value) is np.ndarray:
                    last = self._last_one
                    if value.dtype is last[1] and name == last[0] and value.shape == last[2]:
                        return {name: value}, last[3]
                    one = (name, value.dtype, value.shape)
                    samples = self._signatures.get(one)
                    if samples is not None:
                        self._last_one = (*one, samples)
                        return {name: value}, samples
        key: list[tuple[str, Any, tuple[int, ...]]] | None = None
        if type(inputs) is dict:
            key = []
            for name, value in inputs.items():
                if type(value) is not np.ndarray:
                    key = None
                    break
                key.append((name, value.dtype, value.shape))
        if key is not None:
            samples = self._signatures.get(signature := tuple(key))
            if samples is not None:
                return dict(inputs), samples  # the caller may reuse its dict
        arrays, samples = validate_inputs(
            inputs,
            self._in_shapes,
            self._executable.metadata.batch_size,
            self.config.batching_dim is not None,
        )
        if self._dynamic:
            check_batch_bytes(arrays, self._in_shapes, self._executable.metadata)
        if key is not None and len(self._signatures) < _SIGNATURES and not self._strings:
            self._signatures[key[0] if len(key) == 1 else signature] = samples
        return arrays, samples

    @staticmethod
    async def _when_awaited(
        future: asyncio.Future[dict[str, np.ndarray]], wake: Callable[[], None]
    ) -> dict[str, np.ndarray]:
        wake()  # the caller waits for the outputs now (flush_on_waiting_outputs)
        if future.done():
            await asyncio.sleep(0)  # answered in place: still let the loop run the others
        return await future

    async def _with_deadline(
        self,
        future: asyncio.Future[dict[str, np.ndarray]],
        timeout: float,
        wake: Callable[[], None] | None = None,
    ) -> dict[str, np.ndarray]:
        if wake is not None:
            wake()
        if future.done():
            await asyncio.sleep(0)  # answered in place: still let the loop run the others
            return future.result()
        if isinstance(self._clock, SystemClock):
            # A timer that fails the future itself: no cancel scope, shield or backend lookup
            # per request (a done future is "gone" to the queue: its rows never run).
            assert self._loop is not None
            timer = self._loop.call_later(timeout, expire_request, future, timeout)
            try:
                return await future  # a cancelled caller cancels the future too
            finally:
                timer.cancel()
        try:
            async with move_on_after(self._clock, timeout):
                return await asyncio.shield(future)
        except BaseException:
            future.cancel()  # the caller went away (cancelled): its rows never run
            raise
        future.cancel()
        raise RequestTimeoutError(_timed_out(timeout))

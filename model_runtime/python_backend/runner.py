"""A python model as the daemon serves it: one batcher, ``instance_group count`` processes.

:class:`PythonModelRunner` has what the daemon needs of a runner (``RunnerLike``: start, close,
execute, I/O descriptions, replica status, readiness, statistics) and what python models need
beyond it: a per-request :class:`RequestContext` (id, parameters, requested outputs, sequence
correlation id and flags) and :meth:`PythonModelRunner.stream` for decoupled models.

Its batcher hands ``execute`` up to ``max_batch_size`` requests as a list (one with
``max_batch_size: 0``), waiting up to ``max_queue_delay_microseconds`` for more, to the least
loaded instance with room (a sync ``execute`` runs one batch at a time per instance, an async
one many). Healing: the requests an instance held when it died go back to the head of the
queue, each alone in its batch from then on; a request held by instances that died twice is
poison and gets :class:`PoisonRequestError`, alone. The model is ready while one instance serves.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from actors.clock import Clock, SystemClock
from actors.session.state import ReplicaStatus
from model_runtime.errors import (
    ExecutionTimeoutError,
    InputValidationError,
    InstanceCrashedError,
    ModelRuntimeError,
    PoisonRequestError,
    PythonModelError,
    RunnerStoppedError,
)
from model_runtime.io import DataDesc
from model_runtime.python_backend.config import PythonModelConfig
from model_runtime.python_backend.held import Call
from model_runtime.python_backend.instance import InstanceProcess, InstanceSpec
from model_runtime.python_backend.messages import ControlHook, InferHook, PyRequest, PyResponse
from model_runtime.python_backend.metrics import CustomMetrics
from model_runtime.python_backend.pool import InstancePool, PoolSettings
from model_runtime.python_backend.validate import check_inputs, check_outputs, describe

__all__ = ["PythonModelRunner", "RequestContext", "RunnerSettings"]

_log = structlog.get_logger(__name__)
#: batches an instance with ``async def execute`` runs at once
ASYNC_BATCHES = 64


@dataclass(frozen=True, slots=True)
class RequestContext:
    """What Triton gives a python model of a request besides its inputs."""

    request_id: str = ""
    parameters: Mapping[str, Any] | None = None
    requested_outputs: Sequence[str] | None = None
    correlation_id: int | str = 0
    flags: int = 0


@dataclass(frozen=True, slots=True)
class RunnerSettings:
    """How the runner runs its instances (defaults are what a user gets)."""

    pool: PoolSettings = field(default_factory=PoolSettings)
    python: str = sys.executable
    ring_bytes: int = 8 << 20
    drain_timeout_s: float = 30.0


class _Item:
    """A request in the runner: queued, held by an instance, or answered."""

    __slots__ = (
        "answered", "call", "dispatched", "enqueued", "future", "instance", "kills", "request",
        "responses", "sent", "slot",
    )  # fmt: skip

    def __init__(self, request: PyRequest, stream: bool, now: float) -> None:
        loop = asyncio.get_running_loop()
        self.request = request
        self.future: asyncio.Future[PyResponse] | None = None if stream else loop.create_future()
        self.dispatched: asyncio.Future[Call] = loop.create_future()
        self.call: Call | None = None
        self.instance: InstanceProcess | None = None
        self.slot = 0
        self.kills = 0
        self.responses = 0
        self.enqueued = now
        self.sent = now
        self.answered = False


class PythonModelRunner:
    """Runs a python model (``MODEL_DIR/VERSION/model.py``) in supervised instance processes.

    Raises (from its calls, to that caller only): :class:`InputValidationError` (inputs that do
    not fit the config), :class:`PythonModelError` (the model failed the request),
    :class:`PoisonRequestError`, :class:`InstanceCrashedError` (a stream that had begun),
    :class:`ExecutionTimeoutError`, :class:`RunnerStoppedError` (closed or closing).
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        model_dir: Path,
        version: int,
        *,
        settings: RunnerSettings | None = None,
        infer_hook: InferHook | None = None,
        control_hook: ControlHook | None = None,
        metrics: CustomMetrics | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.config = PythonModelConfig.from_dict(config)
        self.settings = settings or RunnerSettings()
        self.metrics = metrics or CustomMetrics()
        filename = str(config.get("default_model_filename") or "model.py")
        self.model_file = Path(model_dir) / str(version) / filename
        self.version = version
        self._clock = clock or SystemClock()
        self._infer_hook = infer_hook
        self._control_hook = control_hook
        self._queue: collections.deque[_Item] = collections.deque()
        self._wake = asyncio.Event()
        self._inflight = 0
        self._idle = asyncio.Event()
        self._accepting = False
        self._dispatcher: asyncio.Task[None] | None = None
        self.pool = InstancePool(
            self._spec, self.config.instance_count, self.settings.pool, self._clock, self._poke
        )
        self._counts = [[0, 0.0, 0.0, 0.0] for _ in range(self.config.instance_count)]

    def _spec(self, index: int) -> InstanceSpec:
        cfg = self.config
        return InstanceSpec(
            cfg.name, self.version, self.model_file, dict(cfg.raw), f"{cfg.name}_0_{index}",
            cfg.instance_kind, 0, self.settings.python, self.settings.ring_bytes,
            self._infer_hook, self._control_hook, self.metrics,
        )  # fmt: skip

    # -- life cycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Start every instance (``initialize``); returns when all serve.

        Raises:
            ModelLoadError: ``model.py`` did not load in an instance (its text says why).
            RunnerStoppedError: started before.
        """
        if self._dispatcher is not None:
            raise RunnerStoppedError("a python model runner starts once")
        await self.pool.start()
        self._accepting = True
        self._dispatcher = asyncio.get_running_loop().create_task(self._dispatch())
        _log.info("python_model_started", model=self.config.name, instances=len(self.pool.slots))

    async def close(self) -> None:
        """Take no more requests, let those taken finish (up to ``drain_timeout_s``), answer
        the rest with :class:`RunnerStoppedError`, finalize the instances. Raises: nothing."""
        self._accepting = False
        if self._inflight:
            self._idle.clear()
            try:
                await asyncio.wait_for(self._idle.wait(), self.settings.drain_timeout_s)
            except TimeoutError:
                pass
        stopped = RunnerStoppedError("the model was unloaded before this request completed")
        while self._queue:
            self._settle(self._queue.popleft(), stopped)
        if self._dispatcher is not None:
            self._dispatcher.cancel()
        await self.pool.close()

    @property
    def is_ready(self) -> bool:
        """Taking requests, with at least one instance serving."""
        return self._accepting and bool(self.pool.serving())

    @property
    def restarts(self) -> int:
        """Instance processes restarted since the model loaded."""
        return self.pool.restarts

    def replica_status(self) -> list[ReplicaStatus]:
        return [slot.status for slot in self.pool.slots]

    def get_execute_inputs(self) -> list[DataDesc]:
        return [describe(t, self.config.max_batch_size) for t in self.config.inputs]

    def get_execute_outputs(self) -> list[DataDesc]:
        return [describe(t, self.config.max_batch_size) for t in self.config.outputs]

    async def get_monitoring_statistics_total_count(self, replica_id: int = 0) -> dict[str, float]:
        count = float(self._counts[replica_id][0])
        phases = ("request", "read_preparation", "read_queue", "computation", "output")
        return {f"{p}_monitoring_statistics_count": count for p in phases}

    async def get_monitoring_statistics_mean(self, replica_id: int = 0) -> dict[str, float]:
        n, total, queued, computed = self._counts[replica_id]
        n = max(n, 1)
        means = {"request": total, "read_preparation": 0.0, "read_queue": queued}
        means |= {"computation": computed, "output": 0.0}
        return {f"{p}_monitoring_statistics_mean_us": v / n * 1e6 for p, v in means.items()}

    # -- requests ----------------------------------------------------------------------------

    def _enqueue(
        self, inputs: Mapping[str, np.ndarray], ctx: RequestContext | None, stream: bool
    ) -> _Item:
        if not self._accepting:
            raise RunnerStoppedError(f"model '{self.config.name}' is not taking requests")
        check_inputs(self.config, inputs)
        ctx = ctx or RequestContext()
        request = PyRequest(
            inputs, ctx.requested_outputs, ctx.request_id, ctx.correlation_id, ctx.flags,
            ctx.parameters,
        )  # fmt: skip
        item = _Item(request, stream, self._clock.monotonic())
        self._queue.append(item)
        self._inflight += 1
        self._wake.set()
        return item

    async def execute(
        self,
        inputs: Mapping[str, np.ndarray],
        outputs: Mapping[str, np.ndarray] | None = None,
        replica_id: int | None = None,
        timeout: float | None = None,
        priority: int = 0,
        *,
        context: RequestContext | None = None,
    ) -> dict[str, np.ndarray]:
        """Run one request; its outputs (into ``outputs``' arrays when given).

        Raises:
            InputValidationError: inputs that do not fit the config, or a decoupled model
                (its responses come by :meth:`stream`).
            PythonModelError, PoisonRequestError, ExecutionTimeoutError, RunnerStoppedError.
        """
        if self.config.decoupled:
            raise InputValidationError(
                f"model '{self.config.name}' is decoupled: its responses come as a stream"
            )
        if outputs and context is None:
            context = RequestContext(requested_outputs=list(outputs))
        response = await self._one(inputs, context, timeout)
        if outputs:
            for name, buffer in outputs.items():
                if name in response.outputs:
                    np.copyto(buffer, response.outputs[name].reshape(buffer.shape))
        return response.outputs

    async def _one(
        self,
        inputs: Mapping[str, np.ndarray],
        context: RequestContext | None,
        timeout: float | None,
    ) -> PyResponse:
        item = self._enqueue(inputs, context, False)
        assert item.future is not None
        try:
            async with asyncio.timeout(timeout):
                response = await asyncio.shield(item.future)
        except TimeoutError:
            self._abandon(item)
            raise ExecutionTimeoutError(
                f"model '{self.config.name}': no answer within {timeout} s"
            ) from None
        except asyncio.CancelledError:
            self._abandon(item)
            raise
        return response

    async def stream(
        self,
        inputs: Mapping[str, np.ndarray],
        *,
        context: RequestContext | None = None,
        timeout: float | None = None,
    ) -> AsyncIterator[PyResponse]:
        """A decoupled model's responses to one request, up to the final one (a model that is
        not decoupled gives its one response). Errors of the model come as responses with
        ``error`` set; the errors above are raised."""
        if not self.config.decoupled:
            try:
                response = await self._one(inputs, context, timeout)
            except PythonModelError as exc:
                response = PyResponse({}, exc)
            yield response
            return
        item = self._enqueue(inputs, context, True)
        finished = False
        try:
            async with asyncio.timeout(timeout):
                while True:
                    call = await item.dispatched
                    assert call.queue is not None
                    got = await call.queue.get()
                    if isinstance(got, BaseException):
                        error = self._crashed(item, got) if isinstance(
                            got, InstanceCrashedError) else got  # fmt: skip
                        if error is None:
                            continue  # back in the queue, alone
                        finished = True
                        self._done(item)
                        raise error
                    response = got
                    item.responses += 1
                    if response.final:
                        finished = True
                        self._done(item)
                    yield response
                    if finished:
                        return
        except TimeoutError:
            raise ExecutionTimeoutError(
                f"model '{self.config.name}': the stream passed {timeout} s"
            ) from None
        finally:
            if not finished:
                self._abandon(item)

    def _abandon(self, item: _Item) -> None:
        """The caller left: forget a queued request, tell the model of one it holds."""
        if item.answered:
            return
        if item.call is None:
            try:
                self._queue.remove(item)
            except ValueError:
                pass
        elif item.instance is not None:
            item.instance.cancel([item.call])
        self._done(item)

    def _done(self, item: _Item) -> None:
        if item.answered:
            return
        item.answered = True
        self._inflight -= 1
        if item.call is not None:
            counts = self._counts[item.slot]
            now = self._clock.monotonic()
            counts[0] += 1
            counts[1] += now - item.enqueued
            counts[2] += item.sent - item.enqueued
            counts[3] += now - item.sent
        if not self._inflight:
            self._idle.set()

    def _settle(self, item: _Item, outcome: PyResponse | BaseException) -> None:
        if item.future is not None and not item.future.done():
            if isinstance(outcome, BaseException):
                item.future.set_exception(outcome)
                item.future.exception()  # a caller that left does not await it
            elif outcome.error is not None:
                item.future.set_exception(outcome.error)
                item.future.exception()
            else:
                item.future.set_result(outcome)
        elif isinstance(outcome, BaseException) and not item.dispatched.done():
            item.dispatched.set_exception(outcome)  # a stream's caller waits on this
            item.dispatched.exception()
        self._done(item)

    def _crashed(self, item: _Item, exc: InstanceCrashedError) -> BaseException | None:
        """An instance died holding ``item``: None if it goes back to the queue (alone), else
        the error it gets (poison; or a stream that had begun and cannot be replayed)."""
        item.kills += 1
        if item.responses:
            return exc
        if item.kills >= 2:
            _log.error("python_poison_request", model=self.config.name, error=str(exc))
            return PoisonRequestError(
                f"model '{self.config.name}': this request was held by instance processes "
                f"that died twice and is not tried again (last: {exc})",
                exc.returncode,
            )
        item.call = None
        item.instance = None
        item.dispatched = asyncio.get_running_loop().create_future()
        self._queue.appendleft(item)
        self._wake.set()
        return None

    def _on_answer(self, item: _Item, future: asyncio.Future[PyResponse]) -> None:
        if item.answered:
            return
        exc = future.exception()
        if isinstance(exc, InstanceCrashedError):
            error = self._crashed(item, exc)
            if error is not None:
                self._settle(item, error)
            return
        if exc is not None:
            self._settle(item, exc)
            return
        self._settle(item, check_outputs(self.config, future.result()))

    # -- the batcher -------------------------------------------------------------------------

    def _poke(self) -> None:
        self._wake.set()

    def _pick(self) -> tuple[int, InstanceProcess] | None:
        best: tuple[int, InstanceProcess] | None = None
        for slot in self.pool.slots:
            inst = slot.instance
            if inst is None or not inst.alive:
                continue
            room = ASYNC_BATCHES if inst.is_async else 1
            if inst.executing < room and (best is None or inst.held < best[1].held):
                best = (slot.index, inst)
        return best

    def _take(self) -> list[_Item]:
        queue = self._queue
        if queue[0].kills:
            return [queue.popleft()]  # a request that was in a crash goes alone
        limit = max(1, self.config.max_batch_size)
        batch: list[_Item] = []
        while queue and len(batch) < limit and not queue[0].kills:
            batch.append(queue.popleft())
        return batch

    async def _dispatch(self) -> None:
        delay = self.config.max_queue_delay_s if self.config.max_batch_size else 0.0
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                picked = self._pick()
                if picked is None:
                    break  # woken again when an instance has room
                limit = max(1, self.config.max_batch_size)
                if delay and len(self._queue) < limit and not self._queue[0].kills:
                    wait = self._queue[0].enqueued + delay - self._clock.monotonic()
                    if wait > 0:
                        await self._clock.sleep(wait)
                        continue
                self._send(*picked, self._take())

    def _send(self, slot: int, instance: InstanceProcess, batch: list[_Item]) -> None:
        try:
            calls = instance.submit([item.request for item in batch], stream=self.config.decoupled)
        except InstanceCrashedError:
            self._queue.extendleft(reversed(batch))  # it never reached the process
            return
        except (ValueError, ModelRuntimeError) as exc:
            for item in batch:
                self._settle(item, InputValidationError(f"the request cannot be sent: {exc}"))
            return
        now = self._clock.monotonic()
        for item, call in zip(batch, calls, strict=True):
            item.call, item.instance, item.slot, item.sent = call, instance, slot, now
            item.dispatched.set_result(call)
            if call.future is not None:
                call.future.add_done_callback(functools.partial(self._on_answer, item))

"""A python model as the daemon serves it: one batcher, ``instance_group count`` processes.

:class:`PythonModelRunner` has what the daemon needs of a runner (``RunnerLike``: start, close,
execute, I/O descriptions, replica status, readiness, statistics) and what python models need
beyond it: a per-request :class:`RequestContext` (id, parameters, requested outputs, sequence
correlation id and flags) and :meth:`PythonModelRunner.stream` for decoupled models.

Its :class:`~.batcher.Batcher` hands ``execute`` lists of requests and retries what a dying
instance held (a request in two deaths is poison); its :class:`~.pool.InstancePool` restarts
the instances. The model is ready while one instance serves.
"""

from __future__ import annotations

import asyncio
import functools
import sys
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from actors.clock import Clock, SystemClock
from actors.session.state import ReplicaStatus
from model_runtime.deadlines import Deadlines
from model_runtime.errors import (
    ExecutionTimeoutError,
    InputValidationError,
    InstanceCrashedError,
    PythonModelError,
    RequestTimeoutError,
    RunnerStoppedError,
)
from model_runtime.io import DataDesc
from model_runtime.python_backend.batcher import ASYNC_BATCHES, Batcher, Item, pipeline
from model_runtime.python_backend.config import PythonModelConfig
from model_runtime.python_backend.instance import InstanceSpec
from model_runtime.python_backend.messages import ControlHook, InferHook, PyRequest, PyResponse
from model_runtime.python_backend.metrics import CustomMetrics
from model_runtime.python_backend.pool import InstancePool, PoolSettings, Slot
from model_runtime.python_backend.validate import check_inputs, describe

__all__ = ["PythonModelRunner", "RequestContext", "RunnerSettings"]

_log = structlog.get_logger(__name__)


@dataclass(slots=True)
class RequestContext:
    """What Triton gives a python model of a request besides its inputs. (Made per request:
    not frozen, whose __init__ costs 2.2 us against 0.4; nothing changes one once made.)"""

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
        self._batcher = batcher = Batcher(self.config, self._clock)
        self._accepting = False
        self._dispatcher: asyncio.Task[None] | None = None
        #: the deadlines of :meth:`submit`'s requests
        self._deadlines: Deadlines[Item] | None = None
        self.pool = InstancePool(
            self._spec, self.config.instance_count, self.settings.pool, self._clock, batcher.poke
        )
        batcher.pool = self.pool

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
        self._dispatcher = asyncio.get_running_loop().create_task(self._batcher.run())
        _log.info("python_model_started", model=self.config.name, instances=len(self.pool.slots))

    async def close(self) -> None:
        """Take no more requests, let those taken finish (up to ``drain_timeout_s``), answer
        the rest with :class:`RunnerStoppedError`, finalize the instances. Raises: nothing."""
        self._accepting = False
        batcher = self._batcher
        if batcher.inflight:
            batcher.idle.clear()
            try:
                await asyncio.wait_for(batcher.idle.wait(), self.settings.drain_timeout_s)
            except TimeoutError:
                pass
        batcher.fail_queued(
            RunnerStoppedError("the model was unloaded before this request completed")
        )
        if self._dispatcher is not None:
            self._dispatcher.cancel()
        await self.pool.close()  # what the instances held comes back as the stop error

    @property
    def is_ready(self) -> bool:
        """Taking requests, with at least one instance serving."""
        return self._accepting and bool(self.pool.serving())

    async def model_ready(self, timeout: float = 5.0) -> bool:
        """Triton's readiness with the model's own ``is_ready()``: some serving instance's
        model says it is ready (a model without one is ready while its process serves); an
        instance that does not answer within ``timeout`` seconds counts as not ready."""
        if not self.is_ready:
            return False
        answers = await asyncio.gather(*(i.is_ready(timeout) for i in self.pool.serving()))
        return any(answers)

    @property
    def capacity(self) -> int:
        """Requests the instances hold at once when busy (each its :func:`~.batcher.pipeline`
        full batches, or :data:`~.batcher.ASYNC_BATCHES` for an async model), and one batch
        filling in the queue."""
        batch = max(1, self.config.max_batch_size)
        per = pipeline(self.config.max_batch_size)
        if any(i.is_async for i in self.pool.serving()):
            per = ASYNC_BATCHES
        return self.config.instance_count * per * batch + batch

    @property
    def restarts(self) -> int:
        """Instance processes restarted since the model loaded."""
        return self.pool.restarts

    def replica_status(self) -> list[ReplicaStatus]:
        return [slot.status for slot in self.pool.slots]

    def replica_states(self) -> list[Slot]:
        """Each instance's state, as a replica's (its runs, restarts and ``changed`` event)."""
        return list(self.pool.slots)

    def get_execute_inputs(self) -> list[DataDesc]:
        return [describe(t, self.config.max_batch_size) for t in self.config.inputs]

    def get_execute_outputs(self) -> list[DataDesc]:
        return [describe(t, self.config.max_batch_size) for t in self.config.outputs]

    async def get_monitoring_statistics_total_count(self, replica_id: int = 0) -> dict[str, float]:
        count = float(self._batcher.counts[replica_id][0])
        phases = ("request", "read_preparation", "read_queue", "computation", "output")
        return {f"{p}_monitoring_statistics_count": count for p in phases}

    async def get_monitoring_statistics_mean(self, replica_id: int = 0) -> dict[str, float]:
        n, total, queued, computed = self._batcher.counts[replica_id]
        n = max(n, 1)
        means = {"request": total, "read_preparation": 0.0, "read_queue": queued}
        means |= {"computation": computed, "output": 0.0}
        return {f"{p}_monitoring_statistics_mean_us": v / n * 1e6 for p, v in means.items()}

    # -- requests ----------------------------------------------------------------------------

    def _enqueue(
        self, inputs: Mapping[str, np.ndarray], ctx: RequestContext | None, stream: bool
    ) -> Item:
        if not self._accepting:
            raise RunnerStoppedError(f"model '{self.config.name}' is not taking requests")
        check_inputs(self.config, inputs)
        ctx = ctx or RequestContext()
        request = PyRequest(
            inputs, ctx.requested_outputs, ctx.request_id, ctx.correlation_id, ctx.flags,
            ctx.parameters,
        )  # fmt: skip
        return self._batcher.enqueue(request, stream)

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

    def submit(
        self,
        inputs: Mapping[str, np.ndarray],
        context: RequestContext | None = None,
        timeout: float | None = None,
        then: Callable[[asyncio.Future[dict[str, np.ndarray]]], None] | None = None,
    ) -> asyncio.Future[dict[str, np.ndarray]]:
        """:meth:`execute` without a coroutine: the request is queued now; the future of its
        outputs. Cancelling the future drops the request (the model is told); past
        ``timeout`` seconds it fails with :class:`RequestTimeoutError`. ``then`` is called
        with the future as it is settled (its outputs or error; not once it is cancelled),
        in the same turn of the event loop, where its done callbacks run a turn later.

        Raises:
            InputValidationError: inputs that do not fit the config, or a decoupled model.
            RunnerStoppedError: closed or closing.
        """
        if self.config.decoupled:
            raise InputValidationError(
                f"model '{self.config.name}' is decoupled: its responses come as a stream"
            )
        item = self._enqueue(inputs, context, False)
        item.unwrap = True
        item.then = then
        future = item.future
        assert future is not None
        book = None
        if timeout is not None:  # (one timer for the requests that come in deadline order)
            book = self._deadlines
            loop = future.get_loop()
            if book is None or book.loop is not loop:
                book = self._deadlines = Deadlines(loop, self._expire)
            book.add(item, timeout)
        future.add_done_callback(functools.partial(self._ended, item, book))
        return future

    def _ended(self, item: Item, book: Deadlines[Item] | None, future: asyncio.Future[Any]) -> None:
        if book is not None:
            book.discard(item)
        if not item.answered:  # cancelled by its caller
            self._batcher.abandon(item)

    async def _one(
        self,
        inputs: Mapping[str, np.ndarray],
        context: RequestContext | None,
        timeout: float | None,
    ) -> PyResponse:
        item = self._enqueue(inputs, context, False)
        future = item.future
        assert future is not None
        # One timer on the future (cheaper than asyncio.timeout's scope per request).
        timer = None
        if timeout is not None:
            timer = asyncio.get_running_loop().call_later(timeout, self._expire, item, timeout)
        try:
            # No shield: a caller that leaves cancels the future, which the batcher ignores.
            response: PyResponse = await future
            return response
        except asyncio.CancelledError:
            self._batcher.abandon(item)
            raise
        finally:
            if timer is not None:
                timer.cancel()

    def _expire(self, item: Item, timeout: float) -> None:
        future = item.future
        if future is None or future.done():
            return
        self._batcher.abandon(item)
        future.set_exception(
            RequestTimeoutError(
                f"Request timeout expired: model '{self.config.name}' gave no answer within "
                f"{timeout} s"
            )
        )
        if item.then is not None:
            self._batcher.then(item)

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
                    assert item.dispatched is not None
                    call = await item.dispatched
                    assert call.queue is not None
                    got = await call.queue.get()
                    if isinstance(got, BaseException):
                        error = self._batcher.crashed(item, got) if isinstance(
                            got, InstanceCrashedError) else got  # fmt: skip
                        if error is None:
                            continue  # back in the queue, alone
                        finished = True
                        self._batcher.done(item)
                        raise error
                    response = got
                    item.responses += 1
                    if response.final:
                        finished = True
                        self._batcher.done(item)
                    yield response
                    if finished:
                        return
        except TimeoutError:
            raise ExecutionTimeoutError(
                f"model '{self.config.name}': the stream passed {timeout} s"
            ) from None
        finally:
            if not finished:
                self._batcher.abandon(item)

"""The runner an ensemble is served with: what the repository holds for a loaded ensemble
(the daemon's runner protocol, :class:`~model_runtime.server.serving.RunnerLike`), which runs a
request's steps (:func:`~.schedule.run_steps`) through the :class:`StepCaller` the data plane
gives it, and which is ready only while every model it runs is."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Protocol

from actors.session.state import ReplicaStatus
from model_runtime.errors import RunnerStoppedError
from model_runtime.io import DataDesc
from model_runtime.server.ensemble.chain import start_chain
from model_runtime.server.ensemble.schedule import run_steps, stream_steps
from model_runtime.server.tensors.request import InferRequest
from model_runtime.server.triton.ensemble import EnsembleConfig, EnsembleStep

__all__ = ["Composing", "EnsembleRunner", "StepCaller"]


class StepCaller(Protocol):
    """Runs one step of an ensemble request (the data plane's: through the step's model's own
    queue and batcher, counted in its statistics)."""

    async def __call__(
        self,
        ensemble: str,
        step: EnsembleStep,
        inputs: dict[str, Any],
        request: InferRequest,
        timeout: float | None,
    ) -> Mapping[str, Any]: ...

    def submit(
        self,
        ensemble: str,
        step: EnsembleStep,
        inputs: dict[str, Any],
        request: InferRequest,
        timeout: float | None,
        then: Callable[[asyncio.Future[Any]], None] | None = None,
    ) -> Awaitable[Mapping[str, Any]]:
        """What :meth:`__call__` does, queued now where the step's model allows (the future
        of its outputs: cancelling it drops the step; ``then`` is called with it once it is
        done, perhaps not once cancelled), else the coroutine of :meth:`__call__` (``then``
        is not called).

        Raises:
            what :meth:`__call__` raises before the step is queued."""
        ...

    def stream(
        self,
        ensemble: str,
        step: EnsembleStep,
        inputs: dict[str, Any],
        request: InferRequest,
        timeout: float | None,
    ) -> AsyncIterator[Mapping[str, Any]]:
        """Run a step of a decoupled model: each of its responses' outputs as they come."""
        ...


class Composing(Protocol):
    """What an ensemble needs to know of the models it runs (the repository's)."""

    def not_ready(self, model: str, version: int) -> str | None:
        """Why version ``version`` (-1: the latest served) of ``model`` cannot take a
        request now (None: it can)."""
        ...


class EnsembleRunner:
    """Serves one ensemble: :meth:`infer` runs a request's steps. Ready while every composing
    model is (:meth:`not_ready_reason` says which is not, and why). :meth:`close` waits for
    the requests it took.

    Raises:
        nothing of its own but from :meth:`infer`.
    """

    def __init__(
        self,
        config: EnsembleConfig,
        call: StepCaller,
        composing: Composing,
        reshapes: Mapping[str, tuple[tuple[int, ...], tuple[int, ...]]] | None = None,
        batched: bool = False,
        decoupled: frozenset[int] = frozenset(),
    ) -> None:
        self.config = config
        #: the steps of decoupled models (by index): the ensemble streams its responses
        self.decoupled_steps = decoupled
        self._call = call
        self._composing = composing
        #: ensemble input or output -> (its ``dims``, its ``reshape.shape``): the steps see
        #: the reshaped tensor, the client the one of its dims (Triton's rule)
        self._reshapes = dict(reshapes or {})
        self._batch = 1 if batched else 0
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._closed = False
        #: the event loop its requests come on (a chain's future is made on it)
        self._loop: asyncio.AbstractEventLoop | None = None

    async def infer(self, request: InferRequest, timeout: float | None) -> dict[str, Any]:
        """The ensemble outputs ``request`` asks for (all of them when it names none), its
        steps each bounded by what is left of ``timeout`` (seconds).

        Raises:
            RunnerStoppedError: the ensemble was unloaded.
            HTTPError: a step failed (its status, the step and model named).
            ExecutionTimeoutError: the deadline passed between steps.
        """
        if self._closed:
            raise RunnerStoppedError(f"ensemble '{self.config.name}' is unloaded")
        asked = request.outputs
        wanted = tuple(o.name for o in asked) if asked else self.config.outputs
        name = self.config.name
        caller = self._call

        def call(step: EnsembleStep, inputs: dict[str, Any], left: float | None) -> Any:
            return caller.submit(name, step, inputs, request, left)

        self._inflight += 1
        self._idle.clear()
        try:
            inputs = request.inputs
            if self._reshapes:
                inputs = {n: self._reshape(n, a, 1) for n, a in inputs.items()}
            outputs = await run_steps(self.config, inputs, wanted, call, timeout)
            if self._reshapes:
                outputs = {n: self._reshape(n, a, 0) for n, a in outputs.items()}
            return outputs
        finally:
            self._inflight -= 1
            if self._inflight == 0:
                self._idle.set()

    def submit(
        self,
        request: InferRequest,
        timeout: float | None,
        then: Callable[[asyncio.Future[dict[str, Any]]], None] | None = None,
    ) -> asyncio.Future[dict[str, Any]]:
        """:meth:`infer` without a coroutine where the steps needed form a chain (each step
        queued as the one before it ends: :func:`~.chain.start_chain`), else a task of
        :meth:`infer`: the future of its outputs, or of what :meth:`infer` raises.
        Cancelling it cancels the step it waits on. ``then`` is called with it once done
        (in the turn of the event loop that settles it, where a chain's last step ends)."""
        if self._closed:
            return self._task(request, timeout, then)  # (its refusal)
        asked = request.outputs
        wanted = tuple(o.name for o in asked) if asked else self.config.outputs
        name = self.config.name
        caller = self._call

        def call(
            step: EnsembleStep,
            inputs: dict[str, Any],
            left: float | None,
            then: Callable[[asyncio.Future[Any]], None],
        ) -> Any:
            return caller.submit(name, step, inputs, request, left, then)

        inputs = request.inputs
        finish = None
        if self._reshapes:
            inputs = {n: self._reshape(n, a, 1) for n, a in inputs.items()}
            finish = self._reshaped
        loop = self._loop
        if loop is None or loop.is_closed():
            loop = self._loop = asyncio.get_running_loop()
        future = start_chain(
            self.config, inputs, wanted, call, timeout, finish, then, loop, self._answered
        )
        if future is None:
            return self._task(request, timeout, then)
        self._inflight += 1
        self._idle.clear()
        return future

    def _task(
        self,
        request: InferRequest,
        timeout: float | None,
        then: Callable[[asyncio.Future[dict[str, Any]]], None] | None,
    ) -> asyncio.Future[dict[str, Any]]:
        task = asyncio.ensure_future(self.infer(request, timeout))
        if then is not None:
            task.add_done_callback(then)
        return task

    def _reshaped(self, outputs: dict[str, Any]) -> dict[str, Any]:
        return {n: self._reshape(n, a, 0) for n, a in outputs.items()}

    def _answered(self) -> None:
        self._inflight -= 1
        if self._inflight == 0:
            self._idle.set()

    @property
    def decoupled(self) -> bool:
        """Whether a request is answered by a stream of responses (:meth:`stream`)."""
        return bool(self.decoupled_steps)

    async def stream(
        self, request: InferRequest, timeout: float | None
    ) -> AsyncIterator[dict[str, Any]]:
        """The responses of a decoupled ensemble to ``request`` as they come (see
        :func:`~.schedule.stream_steps`), within ``timeout`` seconds.

        Raises:
            as :meth:`infer`, and a step's failure ends the stream.
        """
        if self._closed:
            raise RunnerStoppedError(f"ensemble '{self.config.name}' is unloaded")
        wanted = [o.name for o in request.outputs] or list(self.config.outputs)
        name = self.config.name

        def call(step: EnsembleStep, inputs: dict[str, Any], left: float | None) -> Any:
            return self._call(name, step, inputs, request, left)

        def stream(step: EnsembleStep, inputs: dict[str, Any], left: float | None) -> Any:
            return self._call.stream(name, step, inputs, request, left)

        self._inflight += 1
        self._idle.clear()
        try:
            inputs = request.inputs
            if self._reshapes:
                inputs = {n: self._reshape(n, a, 1) for n, a in inputs.items()}
            async for outputs in stream_steps(
                self.config, inputs, wanted, call, stream, self.decoupled_steps, timeout
            ):
                if self._reshapes:
                    outputs = {n: self._reshape(n, a, 0) for n, a in outputs.items()}
                yield outputs
        finally:
            self._inflight -= 1
            if self._inflight == 0:
                self._idle.set()

    def _reshape(self, name: str, array: Any, to: int) -> Any:
        """``array`` (tensor ``name``) as its ``reshape`` (``to`` 1) or its ``dims`` (0): a
        view, the batch kept."""
        shapes = self._reshapes.get(name)
        if shapes is None:
            return array
        batch = tuple(array.shape[: self._batch])
        return array.reshape(batch + tuple(shapes[to]))

    # -- the runner protocol ---------------------------------------------------------------------

    async def start(self) -> None:
        """Nothing to start: the composing models are loaded by the repository."""

    async def close(self) -> None:
        """Take no more requests and wait for those taken."""
        self._closed = True
        await self._idle.wait()

    async def execute(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Not how an ensemble runs (the data plane calls :meth:`infer`).

        Raises:
            RunnerStoppedError: always.
        """
        raise RunnerStoppedError(f"ensemble '{self.config.name}' runs through the data plane")

    def not_ready_reason(self) -> str | None:
        """Why the ensemble cannot serve now (a composing model not ready), or None."""
        for step in self.config.steps:
            why = self._composing.not_ready(step.model, step.version)
            if why is not None:
                return f"composing model '{step.model}' of ensemble '{self.config.name}': {why}"
        return None

    @property
    def is_ready(self) -> bool:
        """True while every composing model is ready."""
        return not self._closed and self.not_ready_reason() is None

    def get_execute_inputs(self) -> list[DataDesc]:
        """No executable: the served config says the ensemble's tensors."""
        return []

    def get_execute_outputs(self) -> list[DataDesc]:
        """No executable: the served config says the ensemble's tensors."""
        return []

    def replica_status(self) -> list[ReplicaStatus]:
        """No replicas of its own (each composing model has its own)."""
        return []

    async def get_monitoring_statistics_total_count(self, replica_id: int = 0) -> dict[str, float]:
        """No replicas: nothing."""
        return {}

    async def get_monitoring_statistics_mean(self, replica_id: int = 0) -> dict[str, float]:
        """No replicas: nothing."""
        return {}

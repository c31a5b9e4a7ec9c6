"""How an ensemble's steps run on the data plane: each step is a request to its model, through
that model's own queue and batcher (so steps of many ensemble requests batch together), with
the ensemble request's id, parameters, priority and sequence controls, bounded by what is left
of its deadline, and counted in that model's statistics and metrics as any request."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

from actors.queues.tracing import CURRENT as CURRENT_TRACE
from model_runtime.server.answers import status_of
from model_runtime.server.ensemble import EnsembleRunner
from model_runtime.server.inference import direct
from model_runtime.server.inference.streaming import replies
from model_runtime.server.repository.entries import ModelEntry
from model_runtime.server.serving import innermost
from model_runtime.server.tensors.request import InferRequest, RequestedOutput
from model_runtime.server.triton.ensemble import EnsembleStep
from model_runtime.server.triton.settings import DEFAULT_SETTINGS

if TYPE_CHECKING:
    from model_runtime.server.inference.plane import DataPlane

__all__ = ["EnsembleSteps", "submit_ensemble", "taken_ensemble"]


def taken_ensemble(plane: DataPlane, entry: ModelEntry, runner: Any) -> EnsembleRunner | None:
    """The ensemble ``runner`` serves (``entry``'s) when a front end may take its requests by
    callbacks (:func:`submit_ensemble`): not decoupled, no trace being taken, not answered
    from the response cache; else None."""
    inner = innermost(runner)
    if type(inner) is not EnsembleRunner or inner.decoupled or plane.tracer.active:
        return None
    settings = entry.settings
    if plane.cache is not None and settings is not None and settings.config.response_cache.enable:
        return None
    return inner


def submit_ensemble(
    plane: DataPlane,
    entry: ModelEntry,
    ensemble: EnsembleRunner,
    parsed: InferRequest,
    deadline: float | None = None,
    then: Callable[[asyncio.Future[dict[str, Any]]], None] | None = None,
) -> asyncio.Future[dict[str, Any]]:
    """:meth:`DataPlane.execute` of ``parsed`` on ``ensemble`` (``entry``'s, from
    :func:`taken_ensemble`) without a coroutine where its steps form a chain
    (:meth:`EnsembleRunner.submit`), within the shortest of the server's ``request_timeout``,
    the request's ``timeout`` and ``deadline`` (seconds): the future of its outputs (or of its
    error); cancelling it drops the step it waits on. ``then`` is called with it once done,
    in the turn of the event loop that settles it where it can (its last step's end), else
    as its done callback."""
    settings = entry.settings or DEFAULT_SETTINGS
    opts = plane.options
    priority = settings.priority(parsed.priority, opts.priority_levels, opts.default_priority_level)
    timeout = settings.deadline(opts.request_timeout, parsed.timeout, priority)[0]
    if deadline is not None:
        timeout = deadline if timeout is None else min(timeout, deadline)
    return ensemble.submit(parsed, timeout, then)


class EnsembleSteps:
    """The :class:`~model_runtime.server.ensemble.StepCaller` of one data plane."""

    def __init__(self, plane: DataPlane) -> None:
        self._plane = plane
        #: each step's requested outputs (all its model's outputs it maps), by the step's
        #: ``id`` (the step kept with them, so an id is not reused while they are here)
        self._wanted: dict[int, tuple[EnsembleStep, tuple[RequestedOutput, ...]]] = {}

    async def __call__(
        self,
        ensemble: str,
        step: EnsembleStep,
        inputs: dict[str, Any],
        request: InferRequest,
        timeout: float | None,
    ) -> Mapping[str, Any]:
        """Run ``step`` of ``request`` (to ``ensemble``) on ``inputs`` (its model's inputs, the
        arrays themselves), within ``timeout`` seconds (None: the step model's own limits).

        Raises:
            UnknownModelError: the step's model or version is not served.
            HTTPError: the model is not ready, or the server is draining (503).
            ModelRuntimeError: what the model's runner raises for the request.
        """
        entry, runner, parsed = self._step_request(step, inputs, request)
        return await self._run(entry, runner, parsed, inputs, timeout)

    def submit(
        self,
        ensemble: str,
        step: EnsembleStep,
        inputs: dict[str, Any],
        request: InferRequest,
        timeout: float | None,
        then: Callable[[asyncio.Future[dict[str, Any]]], None] | None = None,
    ) -> Awaitable[dict[str, Any]]:
        """Run ``step`` as :meth:`__call__` does; a plain model's step
        (:func:`~.direct.plain_runner`) is queued on its runner now, without a coroutine
        (:func:`~.direct.submit`): the future of its outputs (cancelling it drops the step),
        counted from its done callback, and ``then`` called with it once done (a python
        model's as it is settled, in that turn of the event loop). Any other step: the
        coroutine of :meth:`__call__` (``then`` is not called).

        Raises:
            as :meth:`__call__`, for what is refused as the step is queued.
        """
        plane = self._plane
        entry, runner, parsed = self._step_request(step, inputs, request)
        inner = direct.plain_runner(plane, entry, runner)
        if inner is None:
            return self._run(entry, runner, parsed, inputs, timeout)
        plane.enter_request(entry.name, entry.version)
        t0 = time.perf_counter()
        samples = plane.samples_of(entry, inputs)
        try:
            future, timer = direct.submit(plane, entry, inner, parsed, timeout, then)
        except BaseException as exc:
            reason = status_of(exc)[1] if isinstance(exc, Exception) else "cancelled"
            plane.finish_request(entry, reason, t0, samples)
            raise
        future.add_done_callback(partial(self._counted, entry, t0, samples, timer))
        return future

    def _counted(
        self,
        entry: ModelEntry,
        t0: float,
        samples: int,
        timer: direct.Expiry | None,
        future: asyncio.Future[Any],
    ) -> None:
        """A step :meth:`submit` queued ended: its timer stopped, its model's statistics and
        metrics count it as any request."""
        if timer is not None:
            timer.cancel()
        if future.cancelled():
            self._plane.finish_request(entry, "cancelled", t0, samples)
        elif (exc := future.exception()) is not None:
            self._plane.finish_request(entry, status_of(exc)[1], t0, samples)
        else:
            self._plane.finish_ok(entry, t0, samples)

    async def _run(
        self,
        entry: ModelEntry,
        runner: Any,
        parsed: InferRequest,
        inputs: dict[str, Any],
        timeout: float | None,
    ) -> dict[str, Any]:
        """Run a step's request through the plane, counted (:meth:`__call__`'s body)."""
        plane = self._plane
        # A step may run in the ensemble request's own task (a chain does): the trace a
        # traced step starts is its own, and the ensemble request's is its again after.
        outer = CURRENT_TRACE.get()
        plane.enter_request(entry.name, entry.version)
        t0 = time.perf_counter()
        reason: str | None = "internal"
        try:
            outputs = await plane.execute(entry, runner, parsed, timeout)
            reason = None
            return outputs
        except BaseException as exc:
            reason = status_of(exc)[1] if isinstance(exc, Exception) else "cancelled"
            raise
        finally:
            plane.finish_request(entry, reason, t0, plane.samples_of(entry, inputs))
            if CURRENT_TRACE.get() is not outer:
                CURRENT_TRACE.set(outer)

    async def stream(
        self,
        ensemble: str,
        step: EnsembleStep,
        inputs: dict[str, Any],
        request: InferRequest,
        timeout: float | None,
    ) -> AsyncIterator[Mapping[str, Any]]:
        """Run ``step`` (of a decoupled model) as :meth:`__call__` does: each of its responses'
        outputs as they come; the model's error for a response ends the stream.

        Raises:
            as :meth:`__call__`; ModelRuntimeError: the model's error for a response.
        """
        entry, runner, parsed = self._step_request(step, inputs, request)
        async for reply in replies(self._plane, entry, runner, parsed, timeout):
            if reply.error is not None:
                raise reply.error
            if not reply.empty:
                yield reply.outputs

    def _step_request(
        self, step: EnsembleStep, inputs: dict[str, Any], request: InferRequest
    ) -> tuple[ModelEntry, Any, InferRequest]:
        """The entry and runner of ``step``'s model, and its request: ``inputs`` with the
        ensemble ``request``'s id, parameters, priority and (where the model reads them)
        sequence controls.

        Raises:
            UnknownModelError: the step's model or version is not served.
            HTTPError: the model is not ready, or the server is draining (503).
        """
        plane = self._plane
        entry = plane.entry(step.model, None if step.version < 0 else str(step.version))
        runner = plane.serving_runner(entry)
        wanted = self._wanted.get(id(step))
        if wanted is None or wanted[0] is not step:
            if len(self._wanted) >= 4096:
                self._wanted.clear()
            outputs = tuple(RequestedOutput(name, True) for name in step.outputs)
            wanted = self._wanted[id(step)] = (step, outputs)
        settings = entry.settings
        # The sequence controls reach the steps that read them: a stateful model's, a python
        # model's (its correlation id and flags), a nested ensemble's; a stateless ONNX step
        # runs without (it would refuse them).
        keeps = settings is not None and (
            settings.sequence is not None or settings.python or settings.ensemble is not None
        )
        parsed = InferRequest(
            request.id,
            inputs,
            wanted[1],
            parameters=request.parameters,
            priority=request.priority,
            sequence=request.sequence if keeps else None,
        )
        return entry, runner, parsed

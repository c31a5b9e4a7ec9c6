"""What python models ask of the daemon, answered through the data plane: BLS calls
(``pb_utils.InferenceRequest(...).exec()``) to any model it serves, through that model's own
queue and batcher, counted in its statistics like any request; and the model loading API
(``pb_utils.load_model`` / ``unload_model`` / ``is_model_ready``)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

from model_runtime.errors import ModelRuntimeError, ModelUnavailableError, ProtocolError
from model_runtime.python_backend.messages import BlsRequest, PyResponse
from model_runtime.python_backend.runner import PythonModelRunner, RequestContext
from model_runtime.server.answers import HTTPError, status_of
from model_runtime.server.repository.entries import ControlMode, ModelEntry
from model_runtime.server.repository.repository import ModelRepository
from model_runtime.server.serving import innermost
from model_runtime.server.tensors.request import InferRequest

__all__ = ["PythonModelCalls", "decoupled_over_infer", "python_context"]


class _Plane(Protocol):
    """What the calls need of the data plane (:class:`~.plane.DataPlane`)."""

    repository: ModelRepository

    def entry(self, name: str, version: str | None = None) -> ModelEntry: ...
    def serving_runner(self, entry: ModelEntry, refusal: HTTPError | None = None) -> Any: ...
    def enter_request(self, model: str, version: str = "1") -> None: ...
    def samples_of(self, entry: ModelEntry, inputs: Mapping[str, Any]) -> int: ...
    def finish_request(
        self, entry: ModelEntry, reason: str | None, t0: float, samples: int
    ) -> None: ...


def python_context(request: InferRequest) -> RequestContext:
    """What a python model's ``execute`` gets of a client's request besides its inputs: its
    id, parameters, requested outputs and sequence controls."""
    step = request.sequence
    flags = 0
    if step is not None:
        flags = (1 if step.start else 0) | (2 if step.end else 0)
    return RequestContext(
        request.id or "",
        request.parameters,
        [o.name for o in request.outputs] or None,
        step.id if step is not None else 0,
        flags,
    )


def decoupled_over_infer(model: str) -> ProtocolError:
    """The answer to a plain infer request for a decoupled model (its responses stream:
    gRPC ``ModelStreamInfer``, HTTP ``generate_stream``)."""
    return ProtocolError(
        f"model '{model}' is decoupled (model_transaction_policy {{ decoupled: true }}): its "
        "responses stream; use gRPC ModelStreamInfer, or the generate_stream endpoint"
    )


def context_of(request: BlsRequest) -> RequestContext:
    """The request context a BLS call hands a python model it calls."""
    return RequestContext(
        request.request_id,
        request.parameters,
        request.requested_outputs or None,
        request.correlation_id,
        request.flags,
    )


class PythonModelCalls:
    """The hooks :class:`~model_runtime.server.repository.python.PythonHooks` holds, for one
    data plane."""

    def __init__(self, plane: _Plane) -> None:
        self._plane = plane

    def _runner(self, request: BlsRequest) -> tuple[ModelEntry, Any]:
        version = None if request.model_version < 0 else str(request.model_version)
        entry = self._plane.entry(request.model_name, version)
        try:
            return entry, self._plane.serving_runner(entry)
        except HTTPError as exc:  # draining, or not ready: the model is unavailable
            raise ModelUnavailableError(str(exc)) from None

    def infer(self, request: BlsRequest) -> Any:
        """Run a BLS call: its one response, or (``decoupled``) an async iterator of them.

        Raises:
            ModelNotFoundError: no such model or version.
            ModelUnavailableError: not ready, or the server is draining.
            ModelRuntimeError: whatever the model's runner raises for the request.
        """
        if request.decoupled:
            return self._stream(request)
        return self._one(request)

    async def _one(self, request: BlsRequest) -> PyResponse:
        entry, runner = self._runner(request)
        plane = self._plane
        plane.enter_request(entry.name, entry.version)
        t0 = time.perf_counter()
        reason: str | None = "internal"
        try:
            inner = innermost(runner)
            if isinstance(inner, PythonModelRunner):
                outputs = await inner.execute(
                    request.inputs, timeout=request.timeout_s, context=context_of(request)
                )
            else:
                outputs = await runner.execute(request.inputs, timeout=request.timeout_s)
            reason = None
        except BaseException as exc:
            reason = status_of(exc)[1] if isinstance(exc, Exception) else "cancelled"
            raise
        finally:
            plane.finish_request(entry, reason, t0, self._plane.samples_of(entry, request.inputs))
        wanted = request.requested_outputs
        if wanted:
            unknown = [n for n in wanted if n not in outputs]
            if unknown:
                raise ProtocolError(
                    f"model '{entry.name}' has no output(s) {unknown} (it has {sorted(outputs)})"
                )
            outputs = {n: outputs[n] for n in wanted}
        return PyResponse(dict(outputs))

    async def _stream(self, request: BlsRequest) -> AsyncIterator[PyResponse]:
        entry, runner = self._runner(request)
        inner = innermost(runner)
        if not isinstance(inner, PythonModelRunner):
            yield await self._one(request)  # a model of one answer streams that answer
            return
        plane = self._plane
        plane.enter_request(entry.name, entry.version)
        t0 = time.perf_counter()
        reason: str | None = "internal"
        try:
            async for response in inner.stream(
                request.inputs, context=context_of(request), timeout=request.timeout_s
            ):
                yield response
            reason = None
        finally:
            plane.finish_request(entry, reason, t0, 1)

    async def control(self, operation: str, args: dict[str, Any]) -> Any:
        """``load_model``, ``unload_model`` or ``is_model_ready`` for a python model.

        Raises:
            ModelControlError: a load or unload outside ``explicit`` mode (Triton's rule).
            ProtocolError: files given to ``load_model`` (a model's files are the operator's:
                never written through this API), or an unknown operation.
            ModelRuntimeError: what the repository raises for the load or unload.
        """
        repository = self._plane.repository
        name = str(args.get("model_name", ""))
        if operation == "is_model_ready":
            version = str(args.get("model_version") or "") or None
            try:
                return self._plane.entry(name, version).is_ready
            except ModelRuntimeError:
                return False
        if operation not in ("load_model", "unload_model"):
            raise ProtocolError(f"unknown model control operation {operation!r}")
        if repository.control_mode is not ControlMode.EXPLICIT:
            raise ModelUnavailableError(
                "explicit model load / unload is not allowed if polling is enabled"
            )
        if operation == "unload_model":
            await repository.unload(name)
            return None
        if args.get("files"):
            raise ProtocolError(
                f"load_model('{name}'): files cannot be given: a model's files come from the "
                "repository the operator named"
            )
        await repository.load(name, str(args.get("config") or "") or None)
        return None

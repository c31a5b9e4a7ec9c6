"""The KServe v2 / Triton ``GRPCInferenceService`` over the daemon's HTTP front end.

Every method is answered from the same
:class:`~model_runtime.server.inference.plane.DataPlane` the
HTTP routes use: the same repository and runners, the same draining flag and in-flight count
(SIGTERM drains both protocols), the same statistics and metrics, and the same error mapping:
an exception becomes the HTTP status :func:`~model_runtime.server.answers.status_of` gives it,
and that status its gRPC code (:data:`~model_runtime.server.answers.GRPC_CODES`: 400
INVALID_ARGUMENT, 404 NOT_FOUND, 503 UNAVAILABLE, 504 DEADLINE_EXCEEDED, 500 INTERNAL ...),
unless the answer names its code (Triton's ALREADY_EXISTS, say).
An error ends that one call with its code and message; the server serves on.

Inference goes through the same front-end admission as HTTP
(:mod:`model_runtime.server.inference.admission`): over its model's limit a call is answered
UNAVAILABLE
with the admission's message before its request is decoded, counted and logged as a summary
only; an admitted call is released once answered.

Inference honours the caller's gRPC deadline as it honours the ``timeout`` parameter: the
shorter of the two and the server's ``request_timeout`` bounds queue and compute. A call the
client cancels cancels its request (grpc.aio cancels the handler).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import asdict
from typing import Any, TypeVar

import grpc
import orjson
import structlog
from google.protobuf import json_format

from model_runtime.errors import QueueFullError, UnknownModelError
from model_runtime.server.answers import HTTPError, grpc_code_of, status_of
from model_runtime.server.grpc import observe
from model_runtime.server.grpc.codec import (
    encode_model_infer_response,
    parameter_values,
    parse_model_infer_request,
)
from model_runtime.server.grpc.streaming import error_answer, stream_answers
from model_runtime.server.inference import control, direct
from model_runtime.server.inference.accounting import THREAD_PARSE_BYTES, samples_of
from model_runtime.server.inference.admission import OVERLOADED, QUEUE_FULL
from model_runtime.server.inference.plane import DataPlane
from model_runtime.server.observability.stats import model_statistics
from model_runtime.server.repository.entries import ModelEntry, ModelState
from model_runtime.server.tensors.request import InferRequest
from model_runtime.server.tensors.shm_io import decode_in_thread
from model_runtime.server.triton import grpc_service_pb2 as pb, grpc_service_pb2_grpc as pb_grpc

__all__ = [
    "UNSUPPORTED_METHODS",
    "InferenceServicer",
    "UnsupportedMethods",
    "failure_status",
]

log = structlog.get_logger(__name__)

#: Refusals under overload: logged as rate-limited summaries elsewhere, never one per call.
_SUMMARISED = frozenset({QUEUE_FULL, OVERLOADED})
_R = TypeVar("_R")
Handler = Callable[["InferenceServicer", Any, Any], Awaitable[_R]]


def _answers(method: Handler[_R]) -> Handler[_R]:
    """Turn every exception of ``method`` into its gRPC status for that call only (logged as
    the HTTP front end logs it)."""

    @functools.wraps(method)
    async def handler(self: InferenceServicer, request: Any, context: Any) -> _R:
        try:
            return await method(self, request, context)
        except Exception as exc:
            code, message = failure_status(exc, method.__name__)
            # The finished frames' locals (the request's bytes among them) go now: a
            # traceback through a worker thread's future is a cycle that would keep them
            # until the cyclic collector runs.
            traceback.clear_frames(exc.__traceback__)
        # Outside the except block: abort raises to end the call, with no chained context.
        await context.abort(code, message)
        raise AssertionError("context.abort returned")  # pragma: no cover

    return handler


def failure_status(exc: Exception, method: str) -> tuple[grpc.StatusCode, str]:
    """The gRPC code and message that answer ``exc`` in ``method``, logged as the HTTP front
    end logs a failure of its status."""
    return grpc.StatusCode[grpc_code_of(exc, status_of(exc)[0])], _logged(exc, method)


def _logged(exc: Exception, method: str) -> str:
    """``exc``'s message, logged as the HTTP front end logs a failure of its status."""
    status, reason = status_of(exc)
    message = str(exc) or type(exc).__name__
    if reason == "internal":
        log.error("grpc_request_failed", method=method, status=status, exc_info=exc)
    elif status >= 500 and reason not in _SUMMARISED:
        log.warning("grpc_request_failed", method=method, status=status, error=message)
    return message


#: Requests of one ModelStreamInfer stream running at once; the next is read when one ends.
STREAM_IN_FLIGHT = 256


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """The service's methods, each a client of the data plane ``plane``."""

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane

    # -- health and metadata ---------------------------------------------------------------------

    @_answers
    async def ServerLive(self, request: Any, context: Any) -> Any:
        """The process answers."""
        return pb.ServerLiveResponse(live=True)

    @_answers
    async def ServerReady(self, request: Any, context: Any) -> Any:
        """Ready as ``GET /v2/health/ready`` is (strict readiness by default; not while
        draining)."""
        ready = self.plane.not_ready_reason() is None
        return pb.ServerReadyResponse(ready=ready)

    @_answers
    async def ModelReady(self, request: Any, context: Any) -> Any:
        """Whether the model (version) takes requests; false for an unknown one, as Triton."""
        try:
            entry = self.plane.entry(request.name, request.version)
        except UnknownModelError:
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=entry.is_ready and not self.plane.draining)

    @_answers
    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        """Server name, version and protocol extensions (as ``GET /v2``)."""
        opts = self.plane.options
        return pb.ServerMetadataResponse(
            name=opts.server_name,
            version=opts.server_version,
            extensions=self.plane.extensions(),
        )

    @_answers
    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        """Inputs and outputs with protocol datatypes (as ``GET /v2/models/{name}``)."""
        entry = self.plane.entry(request.name, request.version)
        if entry.runner is None:
            raise HTTPError(503, f"model {entry.name!r} is not loaded", "not_ready")
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=entry.name,
            versions=self.plane.repository.get(entry.name).served_versions(),
            platform=entry.platform,
            inputs=[tensor(name=s.name, datatype=s.datatype, shape=s.shape) for s in entry.inputs],
            outputs=[
                tensor(name=s.name, datatype=s.datatype, shape=s.shape) for s in entry.outputs
            ],
        )

    @_answers
    async def ModelConfig(self, request: Any, context: Any) -> Any:
        """The model's configuration in Triton's ``ModelConfig`` message."""
        from model_runtime.server.triton.config import served_config

        entry = self.plane.entry(request.name, request.version)
        return pb.ModelConfigResponse(config=served_config(entry))

    # -- inference -------------------------------------------------------------------------------

    @_answers
    async def ModelInfer(self, request: Any, context: Any) -> Any:
        """One inference request: raw or typed contents in, raw contents out; refused
        (UNAVAILABLE) before it is decoded while its model is over its admission limit."""
        return await self._model_infer(request, context)

    async def model_infer_wire(self, data: bytes | Any, context: Any) -> bytes:
        """:meth:`ModelInfer` from and to the wire's bytes (a serialized ``ModelInferRequest``
        in, its answer serialized out), for a transport that frames messages itself: the
        answer is serialized once, and its size is its length. Bytes that do not parse end
        the call INTERNAL, as grpc's own deserializer does. A big request the transport
        parsed already (its tensors views of the message: ``context.raw_inputs``) comes as
        the ``ModelInferRequest``."""
        if not isinstance(data, bytes | bytearray | memoryview):
            request = data
        else:
            try:
                request = pb.ModelInferRequest.FromString(data)
            except Exception:
                await context.abort(grpc.StatusCode.INTERNAL, "Exception deserializing request!")
        answer = await self.ModelInfer(request, context)
        wire: bytes = answer.SerializeToString()
        return wire

    async def ModelStreamInfer(self, requests: AsyncIterator[Any], context: Any) -> Any:
        """Triton's streaming inference: requests in, their responses out as they finish (the
        steps of one sequence in their order: :mod:`model_runtime.sequences`; a stream's
        requests are decoded on the loop, in order, so none overtakes another): one per
        request, or each response of a decoupled model as it comes, each with Triton's
        ``triton_final_response`` (:mod:`.streaming`). A request that fails is answered with
        its ``error_message`` (and its id) and the stream goes on. At most
        :data:`STREAM_IN_FLIGHT` requests of a stream are held, from read to last answer
        sent: the next is read when a request's last answer has gone out."""
        answers: asyncio.Queue[tuple[Any, bool] | None] = asyncio.Queue()
        slots = asyncio.Semaphore(STREAM_IN_FLIGHT)
        running: set[asyncio.Task[None]] = set()

        async def infer_one(request: Any) -> Any:
            return await self._model_infer(request, context, inline=True)

        async def one(request: Any) -> None:
            try:
                async with aclosing(
                    stream_answers(self.plane, request, context, infer_one)
                ) as stream:
                    async for item in stream:
                        answers.put_nowait((item, False))  # each goes out as it comes
            except Exception as exc:
                answers.put_nowait((error_answer(request, _logged(exc, "ModelStreamInfer")), False))
            answers.put_nowait((None, True))  # the request's last answer: its slot is free

        async def read() -> None:
            try:
                async for request in requests:
                    await slots.acquire()
                    task = asyncio.create_task(one(request))
                    running.add(task)
                    task.add_done_callback(running.discard)
                await asyncio.gather(*list(running))
            finally:
                answers.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while (got := await answers.get()) is not None:
                item, last = got
                if item is not None:
                    yield item
                if last:
                    slots.release()
            await reader  # a failed read of the request stream fails the call
        finally:
            reader.cancel()
            for task in list(running):
                task.cancel()

    async def _model_infer(self, request: Any, context: Any, *, inline: bool = False) -> Any:
        plane = self.plane
        entry = plane.entry(request.model_name, request.model_version)
        admission = plane.admission
        # After the lookup: admission state is made for models that exist only (as over HTTP).
        # The native transport says how many calls the caller's connection has open: a
        # connection with others open is refused first (admission's fairness).
        calls = getattr(context, "connection_calls", None)
        crowded = calls is not None and calls() > 1
        refused = admission.try_admit(entry.name, crowded=crowded)
        if refused is not None:
            shed = getattr(context, "mark_shed", None)
            if shed is not None:  # the native transport may hold a shed call's refusal back
                shed()
            raise HTTPError(503, refused, OVERLOADED)
        queue_full = False
        try:
            runner = plane.serving_runner(entry)
            traceparent = observe.traceparent_of(context) if plane.tracer.reads_headers else None
            plane.enter_request(entry.name, entry.version, traceparent)
            t0 = time.perf_counter()
            reason: str | None = "internal"
            samples = 0
            try:
                response, samples = await self._infer(request, context, entry, runner, inline)
                reason = None
                return response
            except asyncio.CancelledError:
                reason = "cancelled"
                log.info("request_cancelled", model=entry.name)
                raise
            except BaseException as exc:
                reason = status_of(exc)[1]
                # the model's queue is full (one level's is not: the others may have room)
                queue_full = isinstance(exc, QueueFullError) and reason == "queue_full"
                raise
            finally:
                plane.finish_request(entry, reason, t0, samples)
        finally:
            admission.release(entry.name, queue_full=queue_full, crowded=crowded)

    async def _infer(
        self, request: Any, context: Any, entry: ModelEntry, runner: Any, inline: bool = False
    ) -> tuple[Any, int]:
        def parse() -> InferRequest:
            return parse_model_infer_request(
                request, entry.inputs, entry.outputs, model=entry.name, regions=regions, raw=raw
            )

        regions = self.plane.shared_memory
        # Views of a big message's raw contents, when the native transport took them out.
        raw = getattr(context, "raw_inputs", None)
        contents = request.raw_input_contents if raw is None else raw
        big = not inline and sum(map(len, contents)) > THREAD_PARSE_BYTES
        parsed = await decode_in_thread(parse) if big else parse()
        try:
            # The caller's gRPC deadline bounds the request as its `timeout` parameter does.
            results = await direct.run(self.plane, entry, runner, parsed, context.time_remaining())
            response = encode_model_infer_response(
                entry.name, entry.version, parsed, results, entry.datatypes, specs=entry.outputs
            )
        finally:
            parsed.release()  # its shared memory regions, if any
        return response, samples_of(entry, parsed.inputs, results)

    # -- shared memory: Triton's system extension; CUDA as Triton without GPUs answers -----------

    @_answers
    async def SystemSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        """Every registered region (empty name), or one."""
        response = pb.SystemSharedMemoryStatusResponse()
        for region in self.plane.shared_memory.status(request.name):
            response.regions[region.name].MergeFrom(
                pb.SystemSharedMemoryStatusResponse.RegionStatus(**asdict(region))
            )
        return response

    @_answers
    async def SystemSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        """Register part of a shared memory object as a region."""
        self.plane.shared_memory.register(
            request.name, request.key, request.offset, request.byte_size
        )
        return pb.SystemSharedMemoryRegisterResponse()

    @_answers
    async def SystemSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        """Unregister a region (every region for an empty name)."""
        self.plane.shared_memory.unregister(request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    @_answers
    async def CudaSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        """No CUDA region is ever registered."""
        self.plane.shared_memory.cuda_status(request.name)
        return pb.CudaSharedMemoryStatusResponse()

    @_answers
    async def CudaSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        """Refused: this server has no GPUs."""
        self.plane.shared_memory.cuda_register(request.name)
        return pb.CudaSharedMemoryRegisterResponse()  # pragma: no cover - always refused

    @_answers
    async def CudaSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        """Nothing to unregister."""
        self.plane.shared_memory.cuda_unregister(request.name)
        return pb.CudaSharedMemoryUnregisterResponse()

    # -- statistics and the repository -----------------------------------------------------------

    @_answers
    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        """The statistics extension: one model (version), or every model for an empty name."""
        if request.name:
            entries = [self.plane.entry(request.name, request.version)]
        else:
            entries = self.plane.repository.entries()
        response = pb.ModelStatisticsResponse()
        for entry in entries:
            doc = await model_statistics(entry, self.plane.metrics)
            json_format.ParseDict(doc, response.model_stats.add(), ignore_unknown_fields=True)
        return response

    @_answers
    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        """Every model, its state and why (``ready``: only those that are ready)."""
        _check_repository_name(request.repository_name)
        response = pb.RepositoryIndexResponse()
        for doc in self.plane.repository.index():
            if request.ready and doc.get("state") != ModelState.READY.value:
                continue
            json_format.ParseDict(doc, response.models.add(), ignore_unknown_fields=True)
        return response

    @_answers
    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        """Load or reload a model: the HTTP load's rules (explicit mode only; a ``config``
        override applied, files refused), codes and wording."""
        _check_repository_name(request.repository_name)
        # `config` (a ModelConfig in JSON) is applied as the HTTP load applies it.
        params = parameter_values("load", request.parameters)
        for key, value in params.items():
            if isinstance(value, bytes):  # `file:` contents: named in the refusal, not echoed
                params[key] = base64.b64encode(value[:16]).decode()
        body = orjson.dumps({"parameters": params}) if params else b""
        await control.load_model(self.plane, request.model_name, body)
        return pb.RepositoryModelLoadResponse()

    @_answers
    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        """Unload a model (explicit mode only), draining its in-flight requests."""
        _check_repository_name(request.repository_name)
        params = parameter_values("unload", request.parameters)
        # tritonclient always sends `unload_dependents`: an ensemble's composing models too
        dependents = params.pop("unload_dependents", False) is True
        if params:
            names = sorted(params)
            raise HTTPError(400, f"unload parameter(s) {names} are not supported", "bad_request")
        await control.unload_model(self.plane, request.model_name, dependents)
        return pb.RepositoryModelUnloadResponse()

    # -- logging and trace extensions ------------------------------------------------------------

    @_answers
    async def LogSettings(self, request: Any, context: Any) -> Any:
        """Triton's logging extension: read (and change) the log settings."""
        return observe.log_settings(request)

    @_answers
    async def TraceSetting(self, request: Any, context: Any) -> Any:
        """Triton's trace extension: read (and change) a trace setting."""
        return observe.trace_setting(self.plane, request)


def _check_repository_name(name: str) -> None:
    if name:
        raise HTTPError(
            400,
            f"repository {name!r}: this server has one model repository; leave the name empty",
            "bad_request",
        )


_SERVICE = "/inference.GRPCInferenceService/"
#: Methods of Triton's service that this server does not serve -> why (UNIMPLEMENTED).
UNSUPPORTED_METHODS: dict[str, str] = {}


class UnsupportedMethods(grpc.GenericRpcHandler):  # type: ignore[misc]
    """Answers the methods of Triton's service this server lacks (:data:`UNSUPPORTED_METHODS`)
    with UNIMPLEMENTED and a message that names what is unsupported, where grpcio would say
    only ``Method not found!``."""

    def service(self, handler_call_details: Any) -> Any:
        """The handler of an unsupported method (None: another handler's method)."""
        method: str = handler_call_details.method
        if not method.startswith(_SERVICE):
            return None
        name = method.removeprefix(_SERVICE)
        why = UNSUPPORTED_METHODS.get(name)
        if why is None:
            return None

        async def refuse(request: Any, context: Any) -> None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, why)

        return grpc.unary_unary_rpc_method_handler(refuse)

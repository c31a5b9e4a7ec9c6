"""The data plane: how the daemon runs one inference request, whichever front end read it.

:class:`DataPlane` is protocol-neutral (KServe's ``DataPlane``; Triton's core API under its
front ends). It owns the server options, the repository, the metrics, admission control, the
clients' shared memory regions and the in-flight count the drain waits for; it runs a request
(the runner that takes it now or the refusal, decoding, running within its deadline and
priority, encoding, statistics and metrics) and says what answers an exception. The HTTP
routes, the protocol-level HTTP path, the gRPC service, model control and the Ray deployment
are handed one; it imports none of them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import anyio
import structlog

from actors.queues.tracing import CURRENT as CURRENT_TRACE
from model_runtime.errors import ModelRuntimeError, RequestTimeoutError
from model_runtime.python_backend.runner import PythonModelRunner
from model_runtime.runner import ModelRunner
from model_runtime.sequences import SequenceStep
from model_runtime.server.answers import HTTPError, status_of
from model_runtime.server.ensemble import EnsembleRunner
from model_runtime.server.inference.accounting import (
    THREAD_PARSE_BYTES,
    TurnRecords,
    encodes_in_thread,
    json_length_of,
    samples_of,
)
from model_runtime.server.inference.admission import AdmissionControl
from model_runtime.server.inference.cache import ResponseCache, request_key
from model_runtime.server.inference.ensembles import EnsembleSteps
from model_runtime.server.inference.options import ServerOptions
from model_runtime.server.inference.python_calls import (
    PythonModelCalls,
    decoupled_over_infer,
    python_context,
)
from model_runtime.server.observability.metrics import DaemonMetrics
from model_runtime.server.observability.ratelog import RateLimitedLog
from model_runtime.server.observability.trace import Tracer
from model_runtime.server.observability.trace_record import RequestTrace
from model_runtime.server.repository.entries import ModelEntry, ModelState
from model_runtime.server.repository.python import PythonHooks
from model_runtime.server.repository.repository import ModelRepository
from model_runtime.server.security.restrict import RestrictionCounter
from model_runtime.server.serving import innermost
from model_runtime.server.tensors.codec import parse_infer_request
from model_runtime.server.tensors.encode import encode_infer_response
from model_runtime.server.tensors.parameters import not_a_sequence_model
from model_runtime.server.tensors.raw import parse_raw_request
from model_runtime.server.tensors.request import InferRequest
from model_runtime.server.tensors.shm import SharedMemoryRegistry
from model_runtime.server.tensors.shm_io import decode_in_thread
from model_runtime.server.triton.settings import DEFAULT_SETTINGS

__all__ = [
    "DataPlane",
    "ServerOptions",
]

log = structlog.get_logger("model_runtime.server.app")  # the logger its events always had

#: Refusals that leave a body unread: the connection closes after the answer.
_UNREAD = frozenset({"too_large", "body_timeout", "bad_encoding"})


class DataPlane:
    """Runs inference requests for the models of a :class:`ModelRepository` (see the module
    docstring); every front end of one daemon shares one."""

    def __init__(
        self,
        repository: ModelRepository,
        options: ServerOptions | None = None,
        metrics: DaemonMetrics | None = None,
        tracer: Tracer | None = None,
        cache: ResponseCache | None = None,
    ) -> None:
        self.repository = repository
        #: Triton's trace extension: which requests are traced, and their settings.
        self.tracer = tracer or Tracer()
        self.options = options or ServerOptions()
        self.metrics = metrics or DaemonMetrics()
        #: Triton's response cache (``--cache-config``; None: none), for the models that
        #: enable it (:mod:`model_runtime.server.inference.cache`).
        self.cache = cache
        self.metrics.cache = cache is not None
        #: Requests refused by a front end's restrictions, counted for every front end.
        self.restricted = RestrictionCounter(self.metrics.registry)
        repository.on_readiness = self.metrics.readiness_changed
        # A runner a reload swaps out (or an unload closes) is read into the totals first,
        # and what the cache holds of it is dropped.
        repository.on_retire = self._retire
        self.draining = False
        #: Listeners (``"grpc"``, ...) that stopped and are being restarted -> why.
        self.listeners_down: dict[str, str] = {}
        self._inflight = 0
        self._turn = TurnRecords(self.metrics, self.leave_request)  # finish_ok's
        self._idle = asyncio.Event()
        self._idle.set()
        self._queue_full_log = RateLimitedLog("requests_refused_queue_full")
        self._cache_insert_log = RateLimitedLog("response_cache_insert_failed")
        #: Triton's system shared memory extension: the regions clients registered
        self.shared_memory = SharedMemoryRegistry(enabled=self.options.allow_client_shm)
        self.admission = AdmissionControl(
            self.metrics.registry,
            queue_delay=self.options.admission_delay,
            retry_after=self.options.retry_after,
            capacity=self._capacity,
        )
        repository.on_install = self._installed
        #: What python models ask of the daemon (BLS calls, the model loading API).
        self.python_calls = PythonModelCalls(self)
        repository.python_hooks = PythonHooks(self.python_calls.infer, self.python_calls.control)
        #: How ensembles' steps run: each a request to its model, through this plane.
        repository.ensemble_call = EnsembleSteps(self)

    def _installed(self, entry: ModelEntry) -> None:
        # A stateful model's steps are never shed: its sequence slots bound its work, and a
        # step refused mid-sequence would break a client's session (model_runtime.sequences).
        self.admission.exempt(entry.name, entry.sequences is not None)
        self.metrics.configure(entry)  # its tags, cache and buckets before its first request

    async def _retire(self, model: str, version: str, runner: Any) -> None:
        if self.cache is not None:
            self.cache.drop(model, version)
        await self.metrics.retire_runner(model, version, runner)

    def _capacity(self, name: str) -> int:
        """Requests model ``name``'s replicas take at once: a batch computing and one filling
        per replica; a python model's instances, what its batcher lets them hold; an
        ensemble, what its composing models take together (0 when it is not loaded)."""
        try:
            runner = self.repository.get(name, None).runner
        except ModelRuntimeError:
            return 0
        inner = innermost(runner)
        if isinstance(inner, PythonModelRunner):
            return inner.capacity
        if isinstance(inner, EnsembleRunner):  # a pipeline: each of its stages full at once
            return sum(self._capacity(m) for m in inner.config.models)
        executable = getattr(runner and runner.current, "executable", None)
        if runner is None or executable is None:
            return 0
        return 2 * int(executable.metadata.batch_size) * len(runner.replica_status())

    # -- health and metadata ---------------------------------------------------------------------

    def extensions(self) -> list[str]:
        """The protocol extensions this server serves (HTTP and gRPC server metadata), in
        Triton's names and order.
        ``cuda_shared_memory``: its endpoints answer, and registering a region is refused, as a
        Triton without GPUs refuses it."""
        served = [
            "classification",
            "sequence",
            "model_repository",
            "model_repository(unload_dependents)",
            "schedule_policy",
            "model_configuration",
        ]
        if self.shared_memory.enabled:
            served += ["system_shared_memory", "cuda_shared_memory"]
        served += ["binary_tensor_data", "parameters", "statistics", "trace", "logging"]
        return served

    def not_ready_reason(self) -> str | None:
        """Why the server is not ready (None: it is): draining, a listener down (with why),
        or the repository's reason (Triton's strict readiness)."""
        if self.draining:
            return "the server is draining"
        if self.listeners_down:
            return "; ".join(self.listeners_down.values())
        return self.repository.not_ready_reason()

    def listener_changed(self, name: str, reason: str | None) -> None:
        """Record that listener ``name`` is down for ``reason`` (None: it is up again)."""
        if reason is None:
            self.listeners_down.pop(name, None)
        else:
            self.listeners_down[name] = reason

    def entry(self, name: str, version: str | None = None) -> ModelEntry:
        """The model ``name`` (``version``: None or "" for the one served).

        Raises:
            UnknownModelError: no such model, or no such version of it (Triton's wording).
        """
        return self.repository.get(name, version)

    # -- running a request -----------------------------------------------------------------------

    async def drain(self, grace: float) -> bool:
        """Refuse new requests (503) and wait up to ``grace`` s for in-flight ones; True if
        they all finished."""
        self.draining = True
        self.metrics.draining.set(1)
        with anyio.move_on_after(grace):
            await self._idle.wait()
            return True
        return False

    def error_answer(
        self, exc: Exception, path: str
    ) -> tuple[int, str, dict[str, str] | None, bool]:
        """What answers ``exc`` (raised serving ``path``): its status, message, extra headers,
        and whether the connection closes after it (a body left unread); logged as its cause
        calls for. Every front end answers alike through it."""
        status, reason = status_of(exc)
        headers = exc.headers if isinstance(exc, HTTPError) else None
        if reason == "queue_full":
            # Overload is answered, counted, and logged as a rate-limited summary only.
            headers = {"Retry-After": str(self.options.retry_after)}
            self._queue_full_log(path=path, error=str(exc))
        elif reason == "internal":
            log.error("request_failed", path=path, status=status, exc_info=exc)
        elif status >= 500:
            log.warning("request_failed", path=path, status=status, error=str(exc))
        return status, str(exc) or type(exc).__name__, headers, reason in _UNREAD

    def serving_runner(self, entry: ModelEntry, refusal: HTTPError | None = None) -> Any:
        """The runner that takes an infer request for ``entry`` now, whichever front end;
        ``refusal``: the front end's own answer from the request's head (HTTP: its announced
        size or encoding), given once the server and the model could take it.

        Raises:
            HTTPError: 503 while draining or the model is not ready; else ``refusal``;
                counted in the metrics as refused.
        """
        runner = entry.runner
        if self.draining:
            refusal = HTTPError(503, "the server is draining", "draining")
        elif runner is None or entry.state is not ModelState.READY:
            refusal = HTTPError(503, f"model {entry.name!r} is {entry.state.value}", "not_ready")
        if refusal is not None:
            self.metrics.observe(entry.name, refusal.reason, 0.0, 0, entry.version)
            raise refusal
        return runner

    async def answer_infer(
        self,
        entry: ModelEntry,
        runner: Any,
        header_length: str | None,
        body: bytes | Callable[[], Awaitable[bytes | bytearray]],
        traceparent: str | None = None,
    ) -> tuple[bytes, int | None]:
        """The answer to a REST infer request for ``entry`` (taken by ``runner``): ``body``
        (or ``await body()``, called once the head is read), with the
        ``Inference-Header-Content-Length`` header's value, decoded, run and encoded; counted
        in flight, in statistics and metrics. Returns the response body and its JSON part's
        length (None: all JSON). ``traceparent``: a W3C trace context a trace continues.

        Raises:
            HTTPError, ModelRuntimeError: what the request's answer is (see
                :meth:`error_answer`).
        """
        self.enter_request(entry.name, entry.version, traceparent)
        t0 = time.perf_counter()
        reason: str | None = "internal"
        samples = 0
        try:
            length = json_length_of(header_length)
            data = body if isinstance(body, bytes) else await body()
            out, json_length, samples = await self._infer(data, length, entry, runner)
            reason = None
            return out, json_length
        except asyncio.CancelledError:
            reason = "cancelled"
            log.info("request_cancelled", model=entry.name)
            raise
        except BaseException as exc:
            reason = status_of(exc)[1]
            raise
        finally:
            self.finish_request(entry, reason, t0, samples)

    async def _infer(
        self, body: bytes | bytearray, header_length: int | None, entry: ModelEntry, runner: Any
    ) -> tuple[bytes, int | None, int]:
        # Decoding ~1 MiB takes ~1-5 ms: below that the thread hop costs more than it saves.
        if len(body) > THREAD_PARSE_BYTES:
            parsed = await decode_in_thread(partial(self.decode, entry, header_length, body))
        else:
            parsed = self.decode(entry, header_length, body)
        try:
            results = await self.execute(entry, runner, parsed)
            if encodes_in_thread(results):
                out, json_length = await anyio.to_thread.run_sync(
                    self.encode, entry, parsed, results
                )
            else:
                out, json_length = self.encode(entry, parsed, results)
        finally:
            parsed.release()  # its shared memory regions, if any
        return out, json_length, samples_of(entry, parsed.inputs, results)

    def decode(
        self, entry: ModelEntry, header_length: int | None, body: bytes | bytearray
    ) -> InferRequest:
        """A REST infer request's ``body`` for ``entry`` decoded (``header_length``: its
        JSON part's length; 0: Triton's raw binary request, the body the one input).

        Raises:
            ProtocolError, HTTPError: the body does not fit the protocol or the model.
        """
        if header_length == 0:
            return parse_raw_request(body, entry.inputs, entry.outputs, model=entry.name)
        return parse_infer_request(
            body,
            header_length,
            entry.inputs,
            entry.outputs,
            model=entry.name,
            regions=self.shared_memory,
        )

    @staticmethod
    def encode(
        entry: ModelEntry, parsed: InferRequest, results: dict[str, Any]
    ) -> tuple[bytes, int | None]:
        """The REST answer to ``parsed`` for ``entry``: its body and its JSON part's length
        (None: all JSON)."""
        return encode_infer_response(
            entry.name, entry.version, parsed, results, entry.datatypes, specs=entry.outputs
        )

    async def execute(
        self,
        entry: ModelEntry,
        runner: Any,
        parsed: InferRequest,
        deadline: float | None = None,
        _traced: bool = False,
    ) -> dict[str, Any]:
        """Run a decoded request on ``runner`` (``entry``'s), whichever front end, within the
        shortest of the server's ``request_timeout``, the request's ``timeout`` and
        ``deadline`` (seconds: the gRPC caller's), at its priority.

        A model whose config enables the response cache, in a daemon that has one, is answered
        from it when an equal request was (:class:`CachedOutputs`, the runner not called).

        Raises:
            RequestTimeoutError: past the deadline (Triton's "Request timeout expired").
            ModelRuntimeError: whatever the runner raises (refusals, bad inputs, failures).
        """
        if self.tracer.active and not _traced and (trace := CURRENT_TRACE.get()) is not None:
            assert isinstance(trace, RequestTrace)
            return await self._execute_traced(trace, entry, runner, parsed, deadline)
        cache = self.cache
        settings = entry.settings
        if cache is None or settings is None or not settings.config.response_cache.enable:
            return await self._execute(entry, runner, parsed, deadline)
        if settings.decoupled or settings.sequence is not None or parsed.sequence is not None:
            return await self._execute(entry, runner, parsed, deadline)
        t0 = time.perf_counter_ns()
        inner = innermost(runner)
        key = request_key(entry.name, entry.version, inner, parsed)
        hit = cache.get(key)
        if hit is not None:
            self.metrics.cache_lookup(entry.name, entry.version, True, time.perf_counter_ns() - t0)
            return hit
        lookup = time.perf_counter_ns() - t0
        results = await self._execute(entry, runner, parsed, deadline)
        t1 = time.perf_counter_ns()
        # A result of a runner a reload swapped out meanwhile is not kept: never stale.
        if innermost(entry.runner) is inner and not cache.put(
            key, entry.name, entry.version, results
        ):
            self._cache_insert_log(model=entry.name, error="Failed to insert key: the "
                                   "response is larger than the whole cache")  # fmt: skip
        self.metrics.cache_lookup(
            entry.name, entry.version, False, lookup + time.perf_counter_ns() - t1
        )
        return results

    async def _execute(
        self, entry: ModelEntry, runner: Any, parsed: InferRequest, deadline: float | None
    ) -> dict[str, Any]:
        opts = self.options
        # The model's own settings (config.pbtxt / TOML) over the server's.
        settings = entry.settings or DEFAULT_SETTINGS
        priority = settings.priority(
            parsed.priority, opts.priority_levels, opts.default_priority_level
        )
        timeout, waits, delay = settings.deadline(opts.request_timeout, parsed.timeout, priority)
        if deadline is not None:
            timeout = deadline if timeout is None else min(timeout, deadline)
        sequence = parsed.sequence
        inner = innermost(runner)
        if isinstance(inner, EnsembleRunner):  # its steps, each a request through this plane
            if inner.decoupled:
                raise decoupled_over_infer(entry.name)
            return await inner.infer(parsed, timeout)
        if isinstance(inner, PythonModelRunner):  # Triton's request, as its model.py sees it
            if settings.decoupled:
                raise decoupled_over_infer(entry.name)
            return await inner.execute(
                parsed.inputs, timeout=timeout, priority=priority, context=python_context(parsed)
            )
        if settings.sequence is not None:  # a stateful model: every request is a step
            pending = runner.execute(
                parsed.inputs,
                timeout=timeout,
                priority=priority,
                sequence=sequence or SequenceStep(0),
            )
        elif sequence is not None:
            raise not_a_sequence_model(sequence, entry.name)
        elif waits is not None and isinstance(inner, ModelRunner):  # a queue policy's timeout
            pending = inner.execute(
                parsed.inputs, timeout=timeout, priority=priority, queue_timeout=waits, delay=delay
            )
        else:
            pending = runner.execute(parsed.inputs, timeout=timeout, priority=priority)
        if timeout is None or isinstance(inner, ModelRunner):
            # A ModelRunner enforces the deadline itself: its own timer fails the request (and
            # drops it before it reaches a device once passed), so no second timer here.
            results: dict[str, Any] = await pending
            return results
        try:
            async with asyncio.timeout(timeout):  # a runner of another make: the server's timer
                results = await pending
        except TimeoutError:
            raise RequestTimeoutError(
                f"Request timeout expired: model '{entry.name}' gave no answer within {timeout} s"
            ) from None
        return results

    async def _execute_traced(
        self,
        trace: RequestTrace,
        entry: ModelEntry,
        runner: Any,
        parsed: InferRequest,
        deadline: float | None,
    ) -> dict[str, Any]:
        """:meth:`execute` for a traced request: ``QUEUE_START`` as it is handed to the runner,
        and its tensors when the level has ``TENSORS``."""
        trace.request_id = parsed.id or ""
        trace.stamp("QUEUE_START")
        trace.tensors("TENSOR_QUEUE_INPUT", parsed.inputs)
        results = await self.execute(entry, runner, parsed, deadline, _traced=True)
        trace.tensors("TENSOR_BACKEND_OUTPUT", results)
        return results

    samples_of = staticmethod(samples_of)

    def enter_request(self, model: str, version: str = "1", traceparent: str | None = None) -> None:
        """Count an inference request in flight (the drain waits for it), any front end; a
        request the tracer samples is traced from here (``traceparent``: its W3C trace
        context) until :meth:`finish_request`, in this task's context."""
        if not self._inflight:  # (set again only once none is in flight)
            self._idle.clear()
        self._inflight += 1
        self.metrics.request_started(model, version)
        if self.tracer.active:
            CURRENT_TRACE.set(self.tracer.start(model, version, traceparent=traceparent))

    def finish_request(
        self, entry: ModelEntry, reason: str | None, t0: float, samples: int
    ) -> None:
        """An inference request begun at ``t0`` (``time.perf_counter``) ended, any front end:
        the model's statistics and metrics record it (``reason`` None: it succeeded), and it
        is no longer in flight (:meth:`leave_request`)."""
        if self.tracer.watching:
            trace = CURRENT_TRACE.get()
            if trace is not None:
                CURRENT_TRACE.set(None)
                assert isinstance(trace, RequestTrace)
                self.tracer.finish(trace)
        seconds = time.perf_counter() - t0
        entry.stats.record(reason is None, int(seconds * 1e9), samples)
        self.metrics.observe(entry.name, reason, seconds, samples, entry.version)
        self.leave_request(entry.name, entry.version)

    def finish_ok(self, entry: ModelEntry, t0: float, samples: int) -> None:
        """:meth:`finish_request` of a request begun at ``t0`` that succeeded, for a front end
        answering on the event loop: recorded with the others that end in this turn of the
        loop (:class:`~.accounting.TurnRecords`), in flight until then."""
        if self.tracer.watching:
            self.finish_request(entry, None, t0, samples)
            return
        self._turn.add(entry, time.perf_counter() - t0, samples)

    def leave_request(self, model: str, version: str = "1", count: int = 1) -> None:
        """Count an inference request (or ``count`` of them) done (see :meth:`enter_request`)."""
        self._inflight -= count
        self.metrics.request_finished(model, version, count)
        if self._inflight == 0:
            self._idle.set()

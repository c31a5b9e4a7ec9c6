"""How the daemon runs one inference request, whichever front end read it (DESIGN.md §11).

:class:`InferencePaths` is the part of :class:`~model_runtime.server.app.InferenceServer`
that the HTTP routes (aiohttp's and the protocol-level path, :mod:`.fastpath`) and the gRPC
service (:mod:`.grpc.service`) share: the runner that takes a request now (or the refusal, 503
while draining or not ready), decoding, running within the request's deadline and priority,
encoding, the in-flight count the drain waits for, the model's statistics and metrics, and
what answers an exception (status, message, headers, how it is logged).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio
import structlog
from aiohttp import web

from model_runtime.runner import ModelRunner
from model_runtime.sequences import SequenceStep
from model_runtime.server.access import RateLimitedLog
from model_runtime.server.answers import HTTPError, status_of
from model_runtime.server.body import HEADER_LENGTH, refuse_head
from model_runtime.server.codec import InferRequest, parse_infer_request
from model_runtime.server.encode import encode_infer_response
from model_runtime.server.metrics import DaemonMetrics
from model_runtime.server.parameters import not_a_sequence_model
from model_runtime.server.raw import parse_raw_request
from model_runtime.server.repository import ModelEntry, ModelRepository, ModelState
from model_runtime.server.serving import innermost
from model_runtime.server.shm import SharedMemoryRegistry
from model_runtime.server.shm_io import decode_in_thread
from model_runtime.server.triton.config import DEFAULT_SETTINGS

if TYPE_CHECKING:
    from model_runtime.server.app import ServerOptions

__all__ = ["InferencePaths"]

log = structlog.get_logger("model_runtime.server.app")  # the logger its events always had

_THREAD_PARSE_BYTES = 1 << 20
#: Refusals that leave a body unread: the connection closes after the answer.
_UNREAD = frozenset({"too_large", "body_timeout", "bad_encoding"})


class InferencePaths:
    """Running requests for :class:`~model_runtime.server.app.InferenceServer` (see the module
    docstring); it sets the attributes below."""

    repository: ModelRepository
    options: ServerOptions
    metrics: DaemonMetrics
    shared_memory: SharedMemoryRegistry
    draining: bool
    _inflight: int
    _idle: asyncio.Event
    _queue_full_log: RateLimitedLog

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
        calls for. The aiohttp routes and the protocol-level path
        (:mod:`model_runtime.server.fastpath`) answer alike through it."""
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

    def serving_runner(self, entry: ModelEntry, request: web.Request | None = None) -> Any:
        """The runner that takes an infer request for ``entry`` now (HTTP and gRPC alike);
        an HTTP ``request``'s head is checked too (its announced size and encoding).

        Raises:
            HTTPError: 503 while draining or the model is not ready; 400 for a body whose
                ``Content-Length`` is past the limit, 501 for an encoding Triton does not
                read (Triton's words); counted in the metrics as refused.
        """
        runner = entry.runner
        refusal: HTTPError | None = None
        if self.draining:
            refusal = HTTPError(503, "the server is draining", "draining")
        elif runner is None or entry.state is not ModelState.READY:
            refusal = HTTPError(503, f"model {entry.name!r} is {entry.state.value}", "not_ready")
        elif request is not None:
            refusal = refuse_head(request, self.options.max_body_size)
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
    ) -> tuple[bytes, int | None]:
        """The answer to an infer request for ``entry`` (taken by ``runner``): ``body`` (or
        what awaiting ``body()`` gives: called only once the head is read, so a request
        refused before its body leaves nothing unawaited), with the
        ``Inference-Header-Content-Length`` header's value, decoded, run and encoded;
        counted in flight, in the model's statistics and in the metrics. Returns the
        response body and its JSON part's length (None: all JSON). HTTP's two paths
        (aiohttp's route and :mod:`model_runtime.server.fastpath`) share it.

        Raises:
            HTTPError, ModelRuntimeError: what the request's answer is (see
                :meth:`error_answer`).
        """
        self.enter_request(entry.name, entry.version)
        t0 = time.perf_counter()
        reason: str | None = "internal"
        samples = 0
        try:
            try:
                length = None if header_length is None else int(header_length)
            except ValueError:
                raise HTTPError(400, f"{HEADER_LENGTH} must be an integer", "bad_request") from None
            data = body if isinstance(body, bytes) else await body()
            out, json_length, samples = await self._infer(data, length, entry, runner)
            reason = None
            return out, json_length
        except asyncio.CancelledError:
            reason = "cancelled"
            log.info("request_cancelled", model=entry.name)
            raise
        except BaseException as exc:
            reason = "too_large" if isinstance(exc, web.HTTPRequestEntityTooLarge) else None
            reason = reason or status_of(exc)[1]
            raise
        finally:
            self.finish_request(entry, reason, t0, samples)

    async def _infer(
        self, body: bytes | bytearray, header_length: int | None, entry: ModelEntry, runner: Any
    ) -> tuple[bytes, int | None, int]:
        def parse() -> InferRequest:
            if header_length == 0:  # Triton's raw binary request: the body is the one input
                return parse_raw_request(body, entry.inputs, entry.outputs, model=entry.name)
            return parse_infer_request(
                body,
                header_length,
                entry.inputs,
                entry.outputs,
                model=entry.name,
                regions=self.shared_memory,
            )

        # Decoding ~1 MiB takes ~1-5 ms: below that the thread hop costs more than it saves.
        if len(body) > _THREAD_PARSE_BYTES:
            parsed = await decode_in_thread(parse)
        else:
            parsed = parse()
        try:
            results = await self.execute(entry, runner, parsed)

            def encode() -> tuple[bytes, int | None]:
                return encode_infer_response(
                    entry.name, entry.version, parsed, results, entry.datatypes, specs=entry.outputs
                )

            if sum(a.nbytes for a in results.values()) > _THREAD_PARSE_BYTES // 4:
                out, json_length = await anyio.to_thread.run_sync(encode)
            else:
                out, json_length = encode()
        finally:
            parsed.release()  # its shared memory regions, if any
        first = next(iter(parsed.inputs.values()))
        samples = int(first.shape[0]) if first.ndim else 1
        return out, json_length, samples

    async def execute(
        self, entry: ModelEntry, runner: Any, parsed: InferRequest, deadline: float | None = None
    ) -> dict[str, Any]:
        """Run a decoded request on ``runner`` (``entry``'s), HTTP or gRPC, within the shortest
        of the server's ``request_timeout``, the request's ``timeout`` and ``deadline``
        (seconds: the gRPC caller's), at its priority.

        Raises:
            TimeoutError, ExecutionTimeoutError: past the deadline.
            ModelRuntimeError: whatever the runner raises (refusals, bad inputs, failures).
        """
        opts = self.options
        # The model's own settings (config.pbtxt / TOML) over the server's.
        settings = entry.settings or DEFAULT_SETTINGS
        timeout = settings.deadline(opts.request_timeout, parsed.timeout)
        if deadline is not None:
            timeout = deadline if timeout is None else min(timeout, deadline)
        priority = settings.priority(
            parsed.priority, opts.priority_levels, opts.default_priority_level
        )
        sequence = parsed.sequence
        if settings.sequence is not None:  # a stateful model: every request is a step
            pending = runner.execute(
                parsed.inputs,
                timeout=timeout,
                priority=priority,
                sequence=sequence or SequenceStep(0),
            )
        elif sequence is not None:
            raise not_a_sequence_model(sequence, entry.name)
        else:
            pending = runner.execute(parsed.inputs, timeout=timeout, priority=priority)
        if timeout is None or isinstance(innermost(runner), ModelRunner):
            # A ModelRunner enforces the deadline itself: its own timer fails the request (and
            # drops it before it reaches a device once passed), so no second timer here.
            results: dict[str, Any] = await pending
            return results
        async with asyncio.timeout(timeout):  # a runner of another make: the server's timer
            results = await pending
        return results

    def enter_request(self, model: str, version: str = "1") -> None:
        """Count an inference request in flight (the drain waits for it), HTTP or gRPC."""
        self._inflight += 1
        self._idle.clear()
        self.metrics.request_started(model, version)

    def finish_request(
        self, entry: ModelEntry, reason: str | None, t0: float, samples: int
    ) -> None:
        """An inference request begun at ``t0`` (``time.perf_counter``) ended, HTTP or gRPC:
        the model's statistics and metrics record it (``reason`` None: it succeeded), and it
        is no longer in flight (:meth:`leave_request`)."""
        seconds = time.perf_counter() - t0
        entry.stats.record(reason is None, int(seconds * 1e9), samples)
        self.metrics.observe(entry.name, reason, seconds, samples, entry.version)
        self.leave_request(entry.name, entry.version)

    def leave_request(self, model: str, version: str = "1") -> None:
        """Count an inference request done (see :meth:`enter_request`)."""
        self._inflight -= 1
        self.metrics.request_finished(model, version)
        if self._inflight == 0:
            self._idle.set()

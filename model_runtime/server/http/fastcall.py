"""One infer request answered at the protocol level by callbacks, without a task.

:class:`FastCall` takes a request whose body is in hand for a plain model
(:func:`~model_runtime.server.inference.direct.plain_runner`): decoded and queued as its head
is read (:func:`~model_runtime.server.inference.direct.submit`), answered from its future's
done callback (encoded, written, counted as :meth:`DataPlane.answer_infer` counts it, its
admission left, its access log line). Every answer is written on a later turn of the loop than
the one that read the request, as a task's would be. ``cancel()`` (the client went away) drops
it: its rows never run, no answer is written, and the access log says 499.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import structlog

from model_runtime.server.answers import status_of
from model_runtime.server.inference.accounting import (
    encodes_in_thread,
    json_length_of,
    samples_of,
)
from model_runtime.server.inference.direct import Expiry, plain_runner, submit
from model_runtime.server.inference.ensembles import submit_ensemble, taken_ensemble
from model_runtime.server.repository.entries import ModelState

if TYPE_CHECKING:
    from model_runtime.server.inference.admission import ModelAdmission
    from model_runtime.server.inference.plane import DataPlane
    from model_runtime.server.repository.entries import ModelEntry
    from model_runtime.server.tensors.request import InferRequest

__all__ = ["FastAnswers", "FastCall", "FastConnection"]

log = structlog.get_logger("model_runtime.server.app")  # the data plane's events


class FastConnection(Protocol):
    """What the fast path needs of a connection
    (:class:`~model_runtime.server.http.connection.GuardedConnection`)."""

    def fast_answer(self, answer: bytes | list[bytes], close: bool = False) -> None: ...

    def fast_done(self) -> None: ...

    def fast_reply(self, answer: bytes | list[bytes]) -> None: ...


class FastAnswers(Protocol):
    """What a :class:`FastCall` needs of the fast path that made it
    (:class:`~model_runtime.server.http.fastpath.FastInfer`): the plane, the answers' bytes,
    and the request's leaving."""

    @property
    def plane(self) -> DataPlane: ...

    def hold(self, task: asyncio.Task[None]) -> None: ...

    def ok_answer(self, out: bytes, json_length: int | None, rid: str) -> bytes | list[bytes]: ...

    def error_answer(
        self, exc: Exception, target: bytes, rid: str
    ) -> tuple[int, bytes | list[bytes], bool, bool]: ...

    def answered(
        self,
        conn: FastConnection,
        state: ModelAdmission,
        target: bytes,
        rid: str,
        out: bytes,
        json_length: int | None,
        t0: float,
    ) -> None: ...

    def leave(
        self,
        conn: FastConnection,
        state: ModelAdmission,
        target: bytes,
        rid: str,
        status: int,
        queue_full: bool,
        t0: float,
    ) -> None: ...


class FastCall:
    """One request answered by callbacks (see the module docstring)."""

    __slots__ = (
        "_cancelled",
        "_conn",
        "_ended",
        "_entry",
        "_fast",
        "_future",
        "_parsed",
        "_rid",
        "_state",
        "_t0",
        "_target",
        "_task",
        "_timer",
    )

    def __init__(
        self,
        fast: FastAnswers,
        conn: FastConnection,
        target: bytes,
        rid: str,
        state: ModelAdmission,
    ) -> None:
        self._fast = fast
        self._conn = conn
        self._target = target
        self._rid = rid
        self._state = state
        self._t0 = time.perf_counter()
        self._cancelled = self._ended = False
        self._entry: ModelEntry | None = None  # set once counted in flight
        self._parsed: InferRequest | None = None
        self._future: asyncio.Future[dict[str, Any]] | None = None
        self._timer: Expiry | None = None
        self._task: asyncio.Task[None] | None = None

    def begin(self, where: tuple[str, str | None], header_length: str | None, body: bytes) -> bool:
        """Decode and queue the request for model ``where`` (name, version); its answer
        follows by callbacks. False: its model is not plain (nothing was done: a task
        answers it)."""
        plane = self._fast.plane
        try:
            entry = plane.entry(*where)
            runner = entry.runner
            if plane.draining or runner is None or entry.state is not ModelState.READY:
                runner = plane.serving_runner(entry)  # its refusal
            inner = plain_runner(plane, entry, runner)
            ensemble = None if inner is not None else taken_ensemble(plane, entry, runner)
        except Exception as exc:
            asyncio.get_running_loop().call_soon(self._fail, exc)
            return True
        if inner is None and ensemble is None:
            return False
        plane.enter_request(entry.name, entry.version)
        self._entry = entry
        try:
            json_length = None if header_length is None else json_length_of(header_length)
            parsed = self._parsed = plane.decode(entry, json_length, body)
            if ensemble is not None:  # its steps, each queued on its model's runner
                self._future = submit_ensemble(plane, entry, ensemble, parsed, then=self._ran)
                return True
            assert inner is not None
            self._future, self._timer = submit(plane, entry, inner, parsed)
        except Exception as exc:
            self._finish(status_of(exc)[1], 0)
            asyncio.get_running_loop().call_soon(self._fail, exc)
            return True
        self._future.add_done_callback(self._ran)
        return True

    def cancel(self) -> bool:
        """The client went away: the request is dropped (its rows never run) and ends
        with 499. False: it had ended."""
        if self._ended or self._cancelled:
            return False
        self._cancelled = True
        if self._future is not None:
            self._future.cancel()  # _ran ends it
        elif self._task is not None:
            self._task.cancel()
        return True

    def _ran(self, future: asyncio.Future[dict[str, Any]]) -> None:
        """Its outputs (or failure) are in: encode and answer."""
        self._future = None
        if self._timer is not None:
            self._timer.cancel()
        if self._cancelled or future.cancelled():
            self._dropped()
            return
        exc = future.exception()
        if exc is None:
            results = future.result()
            if encodes_in_thread(results):
                task = self._task = asyncio.get_running_loop().create_task(self._encode(results))
                self._fast.hold(task)
                return
            entry, parsed = self._entry, self._parsed
            assert entry is not None and parsed is not None
            try:
                out, json_length = self._fast.plane.encode(entry, parsed, results)
            except Exception as e:
                exc = e
            else:  # _answered, in place (the common path: a call less per step)
                if parsed.leases:
                    parsed.release()  # its shared memory regions
                self._entry = None
                self._ended = True
                fast = self._fast
                fast.plane.finish_ok(entry, self._t0, samples_of(entry, parsed.inputs))
                fast.answered(
                    self._conn, self._state, self._target, self._rid, out, json_length, self._t0
                )
                return
        self._release()
        self._finish(status_of(exc)[1], 0)
        self._fail(exc)

    async def _encode(self, results: dict[str, Any]) -> None:
        """Encode large outputs off the event loop, then answer."""
        try:
            out, json_length = await anyio.to_thread.run_sync(
                self._fast.plane.encode, *self._request(), results
            )
        except asyncio.CancelledError:
            self._dropped()
            return
        except Exception as exc:
            self._release()
            self._finish(status_of(exc)[1], 0)
            self._fail(exc)
            return
        self._answered(out, json_length)

    def _request(self) -> tuple[ModelEntry, InferRequest]:
        """Its model and decoded request (once queued)."""
        assert self._entry is not None and self._parsed is not None
        return self._entry, self._parsed

    def _answered(self, out: bytes, json_length: int | None) -> None:
        entry, parsed = self._request()
        self._release()
        self._finish(None, samples_of(entry, parsed.inputs))
        self._conn.fast_answer(self._fast.ok_answer(out, json_length, self._rid))
        self._end(200)

    def _dropped(self) -> None:
        """Cancelled: no answer (the client is gone); counted and logged as a task's."""
        self._release()
        if self._entry is not None:
            self._in_context(log.info, "request_cancelled", model=self._entry.name)
            self._finish("cancelled", 0)
        self._end(499)

    def _fail(self, exc: BaseException) -> None:
        """Answer ``exc`` (already counted), in Triton's words."""
        if self._cancelled:
            self._end(499)
            return
        if not isinstance(exc, Exception):  # not an answer's error: as a task would die
            self._end(500)
            raise exc
        status, answer, close, queue_full = self._in_context(
            self._fast.error_answer, exc, self._target, self._rid
        )
        self._conn.fast_answer(answer, close)
        self._end(status, queue_full)

    def _release(self) -> None:
        if self._parsed is not None:
            self._parsed.release()  # its shared memory regions, if any

    def _finish(self, reason: str | None, samples: int) -> None:
        """The request is no longer in flight (if it was counted): statistics and metrics."""
        entry, self._entry = self._entry, None
        if entry is not None:
            self._fast.plane.finish_request(entry, reason, self._t0, samples)

    def _end(self, status: int, queue_full: bool = False) -> None:
        if self._ended:
            return
        self._ended = True
        self._fast.leave(
            self._conn, self._state, self._target, self._rid, status, queue_full, self._t0
        )

    def _in_context(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn`` called with the request id bound for the log lines it writes."""
        ctx = contextvars.copy_context()
        ctx.run(structlog.contextvars.bind_contextvars, request_id=self._rid)
        return ctx.run(fn, *args, **kwargs)

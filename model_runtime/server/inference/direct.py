"""A decoded request queued on its model's runner directly, without a coroutine between: what
:meth:`DataPlane.execute` does for a plain model (an ONNX model's :class:`ModelRunner`, a
python model's :class:`PythonModelRunner`), for any front end.

:func:`plain_runner` says whether a model's requests may go this way (else the front end
awaits :meth:`DataPlane.execute`); :func:`submit` queues one and gives the future of its
outputs; :func:`run` awaits it (a front end that answers in a coroutine).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from model_runtime.deadlines import Deadlines
from model_runtime.python_backend.runner import PythonModelRunner
from model_runtime.runner import ModelRunner
from model_runtime.runner_requests import expire_request
from model_runtime.server.inference.python_calls import python_context
from model_runtime.server.serving import ServingRunner
from model_runtime.server.tensors.parameters import not_a_sequence_model
from model_runtime.server.triton.settings import DEFAULT_SETTINGS

if TYPE_CHECKING:
    from model_runtime.server.inference.options import ServerOptions
    from model_runtime.server.inference.plane import DataPlane
    from model_runtime.server.repository.entries import ModelEntry
    from model_runtime.server.tensors.request import InferRequest
    from model_runtime.server.triton.settings import ModelSettings

__all__ = ["Expiry", "plain_runner", "run", "submit"]


class Expiry(Protocol):
    """A request's deadline, as :func:`submit` gives it: ``cancel()`` once it is answered."""

    def cancel(self) -> None: ...


def plain_runner(
    plane: DataPlane, entry: ModelEntry, runner: Any
) -> ModelRunner | PythonModelRunner | None:
    """The :class:`ModelRunner` (or python model's runner) that serves ``entry`` through
    ``runner`` when :func:`submit` may take its requests (not a stateful or decoupled model,
    no other make of runner or wrapper between, no trace being taken, not answered from the
    response cache); else None (await :meth:`DataPlane.execute`)."""
    inner = runner.current if type(runner) is ServingRunner else runner
    if plane.tracer.active:
        return None
    settings = entry.settings
    if type(inner) is PythonModelRunner:
        if settings is not None and (
            settings.decoupled
            or (plane.cache is not None and settings.config.response_cache.enable)
        ):
            return None
        return inner
    if type(inner) is not ModelRunner:
        return None
    if settings is not None and (
        settings.sequence is not None
        or (plane.cache is not None and settings.config.response_cache.enable)
    ):
        return None
    return inner


def submit(
    plane: DataPlane,
    entry: ModelEntry,
    inner: ModelRunner | PythonModelRunner,
    parsed: InferRequest,
    deadline: float | None = None,
    then: Callable[[asyncio.Future[dict[str, Any]]], None] | None = None,
) -> tuple[asyncio.Future[dict[str, Any]], Expiry | None]:
    """:meth:`DataPlane.execute` without a coroutine, on the runner :func:`plain_runner` gave:
    the request is queued now, within the shortest of the server's ``request_timeout``, the
    request's ``timeout`` and ``deadline`` (seconds: the gRPC caller's). Returns the future of
    its outputs (cancel it: its rows never run) and its deadline, which fails it with
    :class:`RequestTimeoutError` once past (cancel it once the future is done). ``then``:
    called with the future once it is done: as it is settled for a python model's
    (:meth:`PythonModelRunner.submit`; not once cancelled), else as its done callback.

    Raises:
        ModelRuntimeError: what ``DataPlane.execute`` raises at once (refusals, bad inputs).
    """
    settings = entry.settings or DEFAULT_SETTINGS
    opts = plane.options
    if parsed.priority == 0 and parsed.timeout is None:  # the common case: kept per model
        plain = _PLAIN.get(id(settings))
        if plain is None or plain[0] is not settings or plain[1] is not opts:
            plain = _plain(settings, opts)
        priority, timeout, waits, delay = plain[2]
    else:
        priority = settings.priority(
            parsed.priority, opts.priority_levels, opts.default_priority_level
        )
        timeout, waits, delay = settings.deadline(opts.request_timeout, parsed.timeout, priority)
    if deadline is not None:
        timeout = deadline if timeout is None else min(timeout, deadline)
    if type(inner) is PythonModelRunner:  # Triton's request, as its model.py sees it
        return inner.submit(parsed.inputs, python_context(parsed), timeout, then), None
    assert isinstance(inner, ModelRunner)
    if parsed.sequence is not None:
        raise not_a_sequence_model(parsed.sequence, entry.name)
    pending = inner.execute_async(parsed.inputs, None, None, None, priority, waits, delay)
    future = pending if isinstance(pending, asyncio.Future) else asyncio.ensure_future(pending)
    if then is not None:
        future.add_done_callback(then)
    if timeout is None:
        return future, None
    # The runner's own expiry (its error and words), in this loop's book of deadlines (one
    # timer for the requests that come in deadline order, not one per request).
    return future, expire_in(future, timeout)


class _Due:
    """One request's place in its loop's book of deadlines (what :func:`submit` gives as its
    :class:`Expiry`)."""

    __slots__ = ("_book", "_future")

    def __init__(self, book: Deadlines[asyncio.Future[Any]], future: asyncio.Future[Any]):
        self._book = book
        self._future = future

    def cancel(self) -> None:
        self._book.discard(self._future)


#: The deadlines of the requests :func:`submit` queued, of one event loop (another loop's
#: replaces it).
_book: Deadlines[asyncio.Future[Any]] | None = None


def expire_in(future: asyncio.Future[Any], timeout: float) -> Expiry:
    """Fail ``future`` with the runner's :class:`RequestTimeoutError` ``timeout`` seconds from
    now, unless the returned deadline is cancelled first. One book per event loop: one timer
    serves the requests that come in deadline order, whatever their timeouts."""
    global _book
    book = _book
    if book is None or book.loop is not future.get_loop():
        book = _book = Deadlines(future.get_loop(), expire_request)
    book.add(future, timeout)
    return _Due(book, future)


_Plain = tuple[int, float | None, float | None, bool]  # priority, timeout, waits, delay
#: The priority and deadline of a request that names neither, by its model's settings (the
#: settings and server options they were made from, both frozen, kept with them).
_PLAIN: dict[int, tuple[ModelSettings, ServerOptions, _Plain]] = {}


def _plain(
    settings: ModelSettings, opts: ServerOptions
) -> tuple[ModelSettings, ServerOptions, _Plain]:
    """What :func:`submit` computes for a request without a priority or a timeout, kept."""
    priority = settings.priority(0, opts.priority_levels, opts.default_priority_level)
    timeout, waits, delay = settings.deadline(opts.request_timeout, None, priority)
    if len(_PLAIN) >= 1024:
        _PLAIN.clear()
    kept = _PLAIN[id(settings)] = (settings, opts, (priority, timeout, waits, delay))
    return kept


async def run(
    plane: DataPlane,
    entry: ModelEntry,
    runner: Any,
    parsed: InferRequest,
    deadline: float | None = None,
) -> dict[str, Any]:
    """:meth:`DataPlane.execute`, through :func:`submit` when the model is plain (its outputs
    awaited here, with no coroutine of the plane or the runner between).

    Raises:
        RequestTimeoutError: past the deadline (Triton's "Request timeout expired").
        ModelRuntimeError: whatever the runner raises (refusals, bad inputs, failures).
    """
    inner = plain_runner(plane, entry, runner)
    if inner is None:
        return await plane.execute(entry, runner, parsed, deadline)
    future, timer = submit(plane, entry, inner, parsed, deadline)
    if timer is None:
        return await future  # cancelled with the caller: its rows never run
    try:
        return await future
    finally:
        timer.cancel()

"""An ensemble request whose steps form a chain (each one, after the first, reads what the
one before it writes: the common pipeline) run by callbacks, without a task: each step is
queued from the done callback of the one before it, and the request's future is settled from
the last one's. What :func:`~.schedule.run_steps` does for a chain, step for step: the same
inputs given, a step whose inputs were all left out skipped, the deadline checked before each
step, a failing step's error in Triton's words (:func:`~.schedule.step_failed`).
Cancelling the request's future cancels the step it waits on (that step's rows never run)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from model_runtime.server.ensemble.schedule import chain_of, step_failed, time_left
from model_runtime.server.triton.ensemble import EnsembleConfig, EnsembleStep

__all__ = ["ChainCall", "start_chain"]

#: Queues one step: (step, its inputs by model input name, seconds left or None, ``then``) ->
#: the future of its outputs by model output name, ``then`` called with it once it is done
#: (perhaps not once cancelled); or a coroutine of them (``then`` is not called).
ChainCall = Callable[
    [EnsembleStep, dict[str, Any], float | None, Callable[[asyncio.Future[Any]], None]],
    Awaitable[Mapping[str, Any]],
]


def start_chain(
    config: EnsembleConfig,
    inputs: Mapping[str, Any],
    wanted: Sequence[str],
    call: ChainCall,
    timeout: float | None,
    finish: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    then: Callable[[asyncio.Future[dict[str, Any]]], None] | None = None,
    loop: asyncio.AbstractEventLoop | None = None,
    ended: Callable[[], None] | None = None,
) -> asyncio.Future[dict[str, Any]] | None:
    """Queue the first step of ``config``'s chain for the outputs ``wanted`` on the ensemble
    ``inputs`` (each step through ``call``, with the time left of ``timeout`` seconds); the
    future of the ``wanted`` tensors written (``finish`` applied to them), or of the error
    :func:`~.schedule.run_steps` would raise. ``then`` is called with it once, when it is
    done: as a step's end settles it, in that turn of the event loop; as its done callback
    when it was cancelled, or settled before this returned. ``ended`` is called once it is
    done, before ``then`` where both are (in its done callback: a turn later). ``loop``: the
    running loop (None: asked for). None: the steps needed are not a chain (nothing was done:
    run them with :func:`~.schedule.run_steps`)."""
    links = chain_of(config, wanted)
    if not links:
        return None
    if loop is None:
        loop = asyncio.get_running_loop()
    run = _Chain(config, links, dict(inputs), wanted, call, timeout, finish, then, loop, ended)
    run.next()
    run.started = True
    return run.future


class _Chain:
    """One request's chain run (see the module docstring)."""

    __slots__ = (
        "_at",
        "_call",
        "_config",
        "_deadline",
        "_ended_hook",
        "_finish",
        "_links",
        "_pending",
        "_tensors",
        "_then",
        "_wanted",
        "future",
        "started",
    )  # fmt: skip

    def __init__(
        self,
        config: EnsembleConfig,
        links: tuple[Any, ...],
        tensors: dict[str, Any],
        wanted: Sequence[str],
        call: ChainCall,
        timeout: float | None,
        finish: Callable[[dict[str, Any]], dict[str, Any]] | None,
        then: Callable[[asyncio.Future[dict[str, Any]]], None] | None,
        loop: asyncio.AbstractEventLoop,
        ended: Callable[[], None] | None,
    ) -> None:
        self._config = config
        self._links = links
        self._tensors = tensors
        self._wanted = wanted
        self._call = call
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._finish = finish
        self._then = then
        #: False while :func:`start_chain` queues the first step (``then`` waits a turn)
        self.started = False
        self._at = 0
        self._pending: asyncio.Future[Mapping[str, Any]] | None = None
        self._ended_hook = ended
        self.future: asyncio.Future[dict[str, Any]] = loop.create_future()
        self.future.add_done_callback(self._ended)

    def next(self) -> None:
        """Queue the next step that has inputs, or settle the future once none is left."""
        tensors, links = self._tensors, self._links
        while self._at < len(links):
            step, reads, _ = links[self._at]
            given = {m: tensors[t] for m, t in reads if t in tensors}
            if not given:  # everything it reads was left out: so is what it writes
                self._at += 1
                continue
            try:
                left = time_left(self._config.name, step, self._deadline)
            except Exception as exc:  # the deadline passed: its own error, the step named
                self._settle(exc)
                return
            at = self._at
            try:
                pending = self._call(step, given, left, self._ran)
                if not isinstance(pending, asyncio.Future):
                    pending = asyncio.ensure_future(pending)
                    pending.add_done_callback(self._ran)
            except Exception as exc:
                self._settle(step_failed(self._config.name, step, exc))
                return
            if self._at == at:  # (else it ended as it was queued: ``_ran`` went on)
                self._pending = pending
            return
        out = {t: tensors[t] for t in self._wanted if t in tensors}
        try:
            out = out if self._finish is None else self._finish(out)
        except Exception as exc:
            self._settle(exc)
        else:
            self._settle(out)

    def _settle(self, outcome: dict[str, Any] | BaseException) -> None:
        """Settle the request's future, and call ``then`` with it (once started)."""
        future = self.future
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
        then = self._then
        if then is not None and self.started:
            self._then = None
            try:
                then(future)
            except Exception as exc:  # as the loop reports a callback's
                future.get_loop().call_exception_handler(
                    {"message": "an ensemble request's answer failed", "exception": exc}
                )

    def _ran(self, pending: asyncio.Future[Mapping[str, Any]]) -> None:
        """The step waited on ended: its outputs written, the next step queued."""
        self._pending = None
        future = self.future
        if future.done():
            return  # the request was cancelled
        step, _, writes = self._links[self._at]
        if pending.cancelled():
            future.cancel()
            return
        exc = pending.exception()
        if exc is not None:
            error = step_failed(self._config.name, step, exc) if isinstance(exc, Exception) else exc
            self._settle(error)
            return
        outputs = pending.result()
        tensors = self._tensors
        for model_output, tensor in writes:
            if model_output in outputs:
                tensors[tensor] = outputs[model_output]
        self._at += 1
        self.next()

    def _ended(self, future: asyncio.Future[dict[str, Any]]) -> None:
        pending = self._pending
        if future.cancelled() and pending is not None:
            self._pending = None
            pending.cancel()
        if self._ended_hook is not None:
            self._ended_hook()
        then, self._then = self._then, None
        if then is not None:  # cancelled, or settled as it started
            then(future)

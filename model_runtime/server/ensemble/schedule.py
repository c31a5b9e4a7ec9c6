"""Running one ensemble request: its steps as a graph over named tensors. A step starts as
soon as every tensor it reads exists (or is known to be absent), so independent steps run at
once; tensors pass from step to step by reference (the arrays a step returned are what the next
one is given, never copied); steps whose outputs nobody asked for are not run (Triton's
pruning); a step all of whose tensors are absent (optional ensemble inputs left out) is skipped,
and what it would write is absent too. The first step to fail ends the request: the others are
cancelled and the error names the step and its model in Triton's words. An ensemble with a
decoupled step streams (:func:`stream_steps`): what depends on that step runs once per response
it gives, each response's branch at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

from model_runtime.errors import ExecutionTimeoutError
from model_runtime.server.answers import HTTPError, grpc_code_of, status_of
from model_runtime.server.triton.ensemble import EnsembleConfig, EnsembleStep

__all__ = [
    "StepCall", "StepStream", "chain_of", "needed_steps", "run_steps", "step_failed",
    "stream_steps", "time_left",
]  # fmt: skip

#: Runs one step: (step, its inputs by model input name, seconds left or None) -> its outputs
#: by model output name (a coroutine, or the future of a step queued as it is called: cancel
#: it to drop the step).
StepCall = Callable[[EnsembleStep, dict[str, Any], float | None], Awaitable[Mapping[str, Any]]]
#: Runs one decoupled step: as :data:`StepCall`, each of its responses' outputs as they come.
StepStream = Callable[
    [EnsembleStep, dict[str, Any], float | None], AsyncIterator[Mapping[str, Any]]
]


def needed_steps(config: EnsembleConfig, wanted: Sequence[str]) -> list[EnsembleStep]:
    """The steps that write ``wanted`` (ensemble outputs) or what those steps read, in the
    config's order."""
    need = set(wanted)
    chosen: set[int] = set()
    grew = True
    while grew:
        grew = False
        for step in config.steps:
            if step.index not in chosen and need.intersection(step.outputs.values()):
                chosen.add(step.index)
                need.update(step.inputs.values())
                grew = True
    return [s for s in config.steps if s.index in chosen]


def _chain(config: EnsembleConfig, steps: Sequence[EnsembleStep]) -> tuple[EnsembleStep, ...]:
    """``steps`` in the order they run when they can only run one at a time (each one, after
    the first, reads what the one before it writes), else () (some could run at once)."""
    have = set(config.inputs)
    left = list(steps)
    order: list[EnsembleStep] = []
    while left:
        ready = [s for s in left if have.issuperset(s.inputs.values())]
        if len(ready) != 1:
            return ()
        order.append(ready[0])
        left.remove(ready[0])
        have.update(ready[0].outputs.values())
    return tuple(order)


#: One step of a chain: the step, its (model input, ensemble tensor) pairs and its (model
#: output, ensemble tensor) pairs.
_Link = tuple[EnsembleStep, tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]

#: (the steps needed, and the same as a chain of links or ()) of an (ensemble, wanted
#: outputs), by the config's ``id`` (the config kept with them, so an id is not reused while
#: they are here)
_PLANS: dict[
    tuple[int, tuple[str, ...]],
    tuple[EnsembleConfig, tuple[EnsembleStep, ...], tuple[_Link, ...]],
] = {}


def _plan(
    config: EnsembleConfig, wanted: Sequence[str]
) -> tuple[tuple[EnsembleStep, ...], tuple[_Link, ...]]:
    """:func:`needed_steps` and :func:`_chain` of them, worked out once per ensemble config
    and outputs asked for."""
    key = (id(config), wanted if type(wanted) is tuple else tuple(wanted))
    known = _PLANS.get(key)
    if known is None or known[0] is not config:
        if len(_PLANS) >= 1024:
            _PLANS.clear()
        steps = tuple(needed_steps(config, wanted))
        links = tuple(
            (s, tuple(s.inputs.items()), tuple(s.outputs.items())) for s in _chain(config, steps)
        )
        known = _PLANS[key] = (config, steps, links)
    return known[1], known[2]


def chain_of(config: EnsembleConfig, wanted: Sequence[str]) -> tuple[_Link, ...]:
    """The steps ``wanted`` needs as a chain (:func:`_chain`) of links: each step, its (model
    input, ensemble tensor) pairs and its (model output, ensemble tensor) pairs; () when some
    could run at once."""
    return _plan(config, wanted)[1]


def step_failed(ensemble: str, step: EnsembleStep, exc: BaseException) -> HTTPError:
    """The answer to an ensemble request whose ``step`` failed with ``exc``: the status the
    step's own failure has, Triton's prefix, and the step and model named."""
    status, reason = status_of(exc)
    text = str(exc) or type(exc).__name__
    message = f"in ensemble '{ensemble}', step {step.index} (model '{step.model}'): {text}"
    return HTTPError(status, message, reason, grpc=grpc_code_of(exc, status))


async def run_steps(
    config: EnsembleConfig,
    inputs: Mapping[str, Any],
    wanted: Sequence[str],
    call: StepCall,
    timeout: float | None = None,
) -> dict[str, Any]:
    """Run the steps of ``config`` that ``wanted`` needs on the ensemble ``inputs``, each step
    through ``call`` with the time left of ``timeout`` (seconds from now; None: none); the
    ensemble tensors ``wanted`` names that were written.

    Raises:
        HTTPError: a step failed (:func:`step_failed`).
        ExecutionTimeoutError: the deadline passed before a step could start.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    tensors: dict[str, Any] = dict(inputs)
    steps, chain = _plan(config, wanted)
    if chain:  # one step at a time: each awaited in turn, in this task
        # (a tensor nobody wrote is simply not in ``tensors``: each step reads what is there)
        for step, reads, writes in chain:
            given = {m: tensors[t] for m, t in reads if t in tensors}
            if not given:  # everything it reads was left out: so is what it writes
                continue
            left = None if deadline is None else time_left(config.name, step, deadline)
            try:
                outputs = await call(step, given, left)
            except Exception as exc:
                raise step_failed(config.name, step, exc) from exc
            for model_output, tensor in writes:
                if model_output in outputs:
                    tensors[tensor] = outputs[model_output]
    else:
        absent: set[str] = {t for t in config.inputs if t not in tensors}
        await _run_ready(config, tensors, absent, list(steps), call, deadline, frozenset())
    return {t: tensors[t] for t in wanted if t in tensors}


async def stream_steps(
    config: EnsembleConfig,
    inputs: Mapping[str, Any],
    wanted: Sequence[str],
    call: StepCall,
    stream: StepStream,
    decoupled: frozenset[int],
    timeout: float | None = None,
) -> AsyncIterator[dict[str, Any]]:
    """The responses of an ensemble with decoupled steps (their indices: ``decoupled``, each
    run through ``stream``, the others through ``call``), as :func:`run_steps` runs them, as
    Triton's ensemble scheduler does: each response of a decoupled step starts what depends on
    it at once, as a branch of its own, while the step streams on and the branches of its
    other responses run (decoupled steps ready at once stream at once, too); each branch that
    ends with a ``wanted`` tensor written is one response, yielded as it ends (not in the
    order of the branches). Without a decoupled step needed, one response.

    Raises:
        HTTPError: a step failed (:func:`step_failed`): the stream ends, what still runs is
            cancelled.
        ExecutionTimeoutError: the deadline passed before a step could start.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    absent: set[str] = {t for t in config.inputs if t not in inputs}
    waiting = list(_plan(config, wanted)[0])
    #: what the branches end with, in the order they end: tensors, an error, or None (all
    #: branches have ended)
    ended: asyncio.Queue[dict[str, Any] | BaseException | None] = asyncio.Queue()
    live: set[asyncio.Future[None]] = set()

    def finished(task: asyncio.Future[None]) -> None:
        live.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            ended.put_nowait(exc)
        elif not live:
            ended.put_nowait(None)

    def start(coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        live.add(task)
        task.add_done_callback(finished)

    async def branch(
        tensors: dict[str, Any], absent: set[str], waiting: list[EnsembleStep]
    ) -> None:
        """Run what can run but the decoupled steps; then every decoupled step that can run,
        at once; a branch with nothing left to split has ended."""
        await _run_ready(config, tensors, absent, waiting, call, deadline, decoupled)
        splits = [s for s in waiting if _ready(s, tensors, absent)]
        if not splits:
            ended.put_nowait(tensors)
            return
        rest = [s for s in waiting if s not in splits]
        if len(splits) == 1:
            await split(splits[0], tensors, absent, rest)
        else:
            await asyncio.gather(*(split(s, tensors, absent, rest) for s in splits))

    async def split(
        step: EnsembleStep, tensors: dict[str, Any], absent: set[str], rest: list[EnsembleStep]
    ) -> None:
        """Stream ``step``: each of its responses starts a branch of what is ``rest``."""
        given = {m: tensors[t] for m, t in step.inputs.items() if t in tensors}
        responses = stream(step, given, time_left(config.name, step, deadline))
        try:
            async for outputs in responses:
                child = dict(tensors)
                for model_output, tensor in step.outputs.items():
                    if model_output in outputs:
                        child[tensor] = outputs[model_output]
                start(branch(child, set(absent), list(rest)))
        except Exception as exc:
            raise step_failed(config.name, step, exc) from exc
        finally:
            close = getattr(responses, "aclose", None)
            if close is not None:
                await close()

    start(branch(dict(inputs), absent, waiting))
    try:
        while (done := await ended.get()) is not None:
            if isinstance(done, BaseException):
                raise done
            out = {t: done[t] for t in wanted if t in done}
            if out:
                yield out
    finally:
        for task in live:
            task.cancel()
        if live:
            await asyncio.gather(*live, return_exceptions=True)


def _ready(step: EnsembleStep, tensors: Mapping[str, Any], absent: set[str]) -> bool:
    return all(t in tensors or t in absent for t in step.inputs.values())


def time_left(name: str, step: EnsembleStep, deadline: float | None) -> float | None:
    """Seconds left before ``deadline`` for ``step`` (None: no deadline).

    Raises:
        HTTPError: none left.
    """
    left = None if deadline is None else deadline - time.monotonic()
    if left is not None and left <= 0:
        raise step_failed(name, step, _expired(name))
    return left


async def _run_ready(
    config: EnsembleConfig,
    tensors: dict[str, Any],
    absent: set[str],
    waiting: list[EnsembleStep],
    call: StepCall,
    deadline: float | None,
    held: frozenset[int],
) -> None:
    """Run every step of ``waiting`` that can run but those ``held``, each as soon as what it
    reads is written or known absent, writing ``tensors`` and ``absent``; the steps run are
    taken from ``waiting``.

    Raises:
        HTTPError: a step failed (the others are cancelled).
    """
    running: dict[asyncio.Future[Mapping[str, Any]], EnsembleStep] = {}
    try:
        while waiting or running:
            ready: list[tuple[EnsembleStep, dict[str, Any]]] = []
            for step in list(waiting):
                if step.index in held or not _ready(step, tensors, absent):
                    continue
                waiting.remove(step)
                given = {m: tensors[t] for m, t in step.inputs.items() if t in tensors}
                if not given:  # everything it reads was left out: so is what it writes
                    absent.update(step.outputs.values())
                    continue
                ready.append((step, given))
            if len(ready) == 1 and not running:
                # The only step that can run: awaited here, in this task (a chain of steps,
                # the common case, runs in one coroutine, no task nor wait per step).
                step, given = ready[0]
                left = time_left(config.name, step, deadline)
                try:
                    outputs = await call(step, given, left)
                except Exception as exc:
                    raise step_failed(config.name, step, exc) from exc
                _write(step, outputs, tensors, absent)
                continue
            for step, given in ready:
                left = time_left(config.name, step, deadline)
                try:  # (a step may be refused as it is queued, before any await)
                    pending = asyncio.ensure_future(call(step, given, left))
                except Exception as exc:
                    raise step_failed(config.name, step, exc) from exc
                running[pending] = step
            if not running:
                break  # what is left waits on tensors nobody writes, or is held
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                step = running.pop(task)
                try:
                    outputs = task.result()
                except Exception as exc:
                    raise step_failed(config.name, step, exc) from exc
                _write(step, outputs, tensors, absent)
    finally:
        for task in running:
            task.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)


def _write(
    step: EnsembleStep, outputs: Mapping[str, Any], tensors: dict[str, Any], absent: set[str]
) -> None:
    """The ensemble tensors ``step`` writes, from its model's ``outputs`` (one it did not
    give is absent)."""
    for model_output, tensor in step.outputs.items():
        if model_output in outputs:
            tensors[tensor] = outputs[model_output]
        else:
            absent.add(tensor)


def _expired(name: str) -> ExecutionTimeoutError:
    return ExecutionTimeoutError(f"the deadline of the request to ensemble '{name}' has passed")

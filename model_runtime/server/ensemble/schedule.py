"""Running one ensemble request: its steps as a graph over named tensors. A step starts as
soon as every tensor it reads exists (or is known to be absent), so independent steps run at
once; tensors pass from step to step by reference (the arrays a step returned are what the next
one is given, never copied); steps whose outputs nobody asked for are not run (Triton's
pruning); a step all of whose tensors are absent (optional ensemble inputs left out) is skipped,
and what it would write is absent too. The first step to fail ends the request: the others are
cancelled and the error names the step and its model in Triton's words."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from model_runtime.errors import ExecutionTimeoutError
from model_runtime.server.answers import HTTPError, grpc_code_of, status_of
from model_runtime.server.triton.ensemble import EnsembleConfig, EnsembleStep

__all__ = ["StepCall", "needed_steps", "run_steps", "step_failed"]

#: Runs one step: (step, its inputs by model input name, seconds left or None) -> its outputs
#: by model output name.
StepCall = Callable[[EnsembleStep, dict[str, Any], float | None], Awaitable[Mapping[str, Any]]]


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
    absent: set[str] = {t for t in config.inputs if t not in tensors}
    waiting = needed_steps(config, wanted)
    running: dict[asyncio.Task[Mapping[str, Any]], EnsembleStep] = {}
    try:
        while waiting or running:
            for step in list(waiting):
                sources = step.inputs.values()
                if not all(t in tensors or t in absent for t in sources):
                    continue
                waiting.remove(step)
                given = {m: tensors[t] for m, t in step.inputs.items() if t in tensors}
                if not given:  # everything it reads was left out: so is what it writes
                    absent.update(step.outputs.values())
                    continue
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise step_failed(config.name, step, _expired(config.name))
                running[asyncio.ensure_future(call(step, given, left))] = step
            if not running:
                break  # what is left waits on tensors nobody writes (pruned away)
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                step = running.pop(task)
                try:
                    outputs = task.result()
                except Exception as exc:
                    raise step_failed(config.name, step, exc) from exc
                for model_output, tensor in step.outputs.items():
                    if model_output in outputs:
                        tensors[tensor] = outputs[model_output]
                    else:
                        absent.add(tensor)
    finally:
        for task in running:
            task.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)
    return {t: tensors[t] for t in wanted if t in tensors}


def _expired(name: str) -> ExecutionTimeoutError:
    return ExecutionTimeoutError(f"the deadline of the request to ensemble '{name}' has passed")

"""Every response to one inference request, as it comes, whichever front end streams them (gRPC
``ModelStreamInfer``, HTTP ``generate`` / ``generate_stream``).

A decoupled python model (``model_transaction_policy { decoupled: true }``) answers with zero or
more responses and then the final flag (Triton's response sender); any other model answers once.
A model's error for a request comes as a :class:`Reply` with ``error`` set (Triton puts it in
that response; a decoupled model's stream goes on after it); what fails before the model runs
(a refusal, inputs that do not fit the model, a deadline passed) is raised.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from model_runtime.errors import PythonModelError
from model_runtime.python_backend.runner import PythonModelRunner
from model_runtime.server.answers import status_of
from model_runtime.server.ensemble import EnsembleRunner
from model_runtime.server.inference.python_calls import python_context
from model_runtime.server.repository.entries import ModelEntry
from model_runtime.server.serving import innermost
from model_runtime.server.tensors.request import InferRequest
from model_runtime.server.triton.settings import DEFAULT_SETTINGS

__all__ = ["Reply", "is_decoupled", "replies"]


@dataclass(frozen=True, slots=True)
class Reply:
    """One response: outputs (or the model's ``error`` for it), response parameters, and
    whether it is the last (``final``; a final reply may carry no outputs: the flag alone)."""

    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    error: Exception | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    final: bool = True
    #: a flag only (a decoupled model's ``send(flags=FINAL)`` with no response)
    empty: bool = False


class _Plane(Protocol):
    """What :func:`replies` needs of the data plane (:class:`~.plane.DataPlane`)."""

    @property
    def options(self) -> Any: ...
    async def execute(
        self, entry: ModelEntry, runner: Any, parsed: InferRequest, deadline: float | None = None
    ) -> dict[str, Any]: ...
    def enter_request(self, model: str, version: str = "1") -> None: ...
    def finish_request(
        self, entry: ModelEntry, reason: str | None, t0: float, samples: int
    ) -> None: ...
    def samples_of(self, entry: ModelEntry, inputs: Any) -> int: ...


def is_decoupled(entry: ModelEntry) -> bool:
    """Whether ``entry`` answers a request with a stream of responses (a decoupled python
    model, or an ensemble with a step of one)."""
    settings = entry.settings or DEFAULT_SETTINGS
    inner = innermost(entry.runner)
    if isinstance(inner, EnsembleRunner):
        return inner.decoupled
    return settings.decoupled and isinstance(inner, PythonModelRunner)


async def replies(
    plane: _Plane,
    entry: ModelEntry,
    runner: Any,
    parsed: InferRequest,
    deadline: float | None = None,
) -> AsyncGenerator[Reply, None]:
    """The responses to ``parsed`` (decoded for ``entry``, taken by ``runner``) as they come,
    the last with ``final``, within the server's ``request_timeout``, the request's
    ``timeout`` and ``deadline`` (seconds); counted in flight, in the model's statistics and
    metrics as one request.

    Raises:
        ModelRuntimeError, TimeoutError: what fails the request before its model answers, or
            ends a stream (a crashed instance, the deadline): see the module docstring.
    """
    plane.enter_request(entry.name, entry.version)
    t0 = time.perf_counter()
    reason: str | None = "internal"
    try:
        inner = innermost(runner)
        if not is_decoupled(entry):
            try:
                outputs = await plane.execute(entry, runner, parsed, deadline)
            except PythonModelError as exc:  # the model's own answer to this request
                reason = status_of(exc)[1]
                yield Reply(error=exc)
                return
            reason = None
            yield Reply(outputs)
            return
        settings = entry.settings or DEFAULT_SETTINGS
        timeout = settings.deadline(plane.options.request_timeout, parsed.timeout)[0]
        if deadline is not None:
            timeout = deadline if timeout is None else min(timeout, deadline)
        if isinstance(inner, EnsembleRunner):  # each response as its last step gives it
            async for outputs in inner.stream(parsed, timeout):
                yield Reply(outputs, final=False)
            reason = None
            yield Reply(final=True, empty=True)
            return
        assert isinstance(inner, PythonModelRunner)  # is_decoupled said so
        failed: str | None = None
        async for response in inner.stream(
            parsed.inputs, context=python_context(parsed), timeout=timeout
        ):
            if response.error is not None and failed is None:
                failed = status_of(response.error)[1]
            empty = response.final and not response.outputs and response.error is None
            yield Reply(
                response.outputs,
                response.error,
                response.parameters,
                response.final,
                empty and not response.parameters,
            )
        reason = failed
    except asyncio.CancelledError:
        reason = "cancelled"
        raise
    except GeneratorExit:
        reason = "cancelled"  # the caller stopped reading: its client went away
        raise
    except BaseException as exc:
        reason = status_of(exc)[1] if isinstance(exc, Exception) else "cancelled"
        raise
    finally:
        plane.finish_request(entry, reason, t0, plane.samples_of(entry, parsed.inputs))

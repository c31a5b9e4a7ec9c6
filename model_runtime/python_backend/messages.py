"""What the daemon's side hands an instance and gets back: requests, responses, BLS calls.

Plain frozen records with numpy arrays; the wire's forms live in :mod:`.wire` and :mod:`.stub`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from model_runtime.errors import (
    InputValidationError,
    ModelNotFoundError,
    ModelRuntimeError,
    ModelUnavailableError,
    PythonModelError,
    RunnerStoppedError,
)

__all__ = [
    "BlsRequest",
    "ControlHook",
    "InferHook",
    "PyRequest",
    "PyResponse",
    "triton_code_of",
]


# PyRequest and PyResponse are made once per request: not frozen, since a frozen dataclass's
# __init__ sets each field through object.__setattr__ (3.7 and 2.4 us against 0.5). Nothing
# changes them once made.


@dataclass(slots=True)
class PyRequest:
    """One inference request for a python model, with what Triton gives ``execute`` of it."""

    inputs: Mapping[str, np.ndarray]
    #: output names the caller wants (None or empty: all the model returns)
    requested_outputs: Sequence[str] | None = None
    request_id: str = ""
    correlation_id: int | str = 0
    #: TRITONSERVER_REQUEST_FLAG_SEQUENCE_START (1) / _END (2)
    flags: int = 0
    parameters: Mapping[str, Any] | None = None


@dataclass(slots=True)
class PyResponse:
    """One response: outputs, or the model's error for this request. ``final``: no more follow
    (always True for a model that is not decoupled; a decoupled model's last response may be
    a flag only, with no outputs)."""

    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    error: PythonModelError | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    final: bool = True


@dataclass(frozen=True, slots=True)
class BlsRequest:
    """A request a python model makes of another model (``pb_utils.InferenceRequest.exec``)."""

    model_name: str
    model_version: int  #: -1: the version the server's policy picks
    inputs: dict[str, np.ndarray]
    requested_outputs: list[str]
    request_id: str = ""
    correlation_id: int | str = 0
    flags: int = 0
    timeout_s: float | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    #: the model called wants a decoupled call: responses as they come
    decoupled: bool = False


#: The daemon's data plane, as BLS calls reach it: one response, or a stream of them.
InferHook = Callable[[BlsRequest], Awaitable[PyResponse] | AsyncIterator[PyResponse]]
#: ``load_model`` / ``unload_model`` / ``is_model_ready`` with Triton's keyword arguments.
ControlHook = Callable[[str, dict[str, Any]], Awaitable[Any]]


def triton_code_of(exc: BaseException) -> str:
    """The Triton error code name an error is answered with, to a model that made a BLS call."""
    if isinstance(exc, PythonModelError):
        return exc.code
    if isinstance(exc, ModelNotFoundError):
        return "NOT_FOUND"
    if isinstance(exc, InputValidationError):
        return "INVALID_ARG"
    if isinstance(exc, (ModelUnavailableError, RunnerStoppedError)):
        return "UNAVAILABLE"
    if isinstance(exc, ModelRuntimeError):
        return "INTERNAL"
    return "INTERNAL"

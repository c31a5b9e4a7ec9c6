"""``triton_python_backend_utils``: Triton's Python API for ``model.py``, as its README documents.

The instance process registers this module under that name in ``sys.modules`` before it imports
a model, so ``import triton_python_backend_utils as pb_utils`` finds it. What needs the daemon
(sending responses, BLS, logging, metrics, the model loading API) goes through the one
:class:`~.pb_bridge.Bridge` the instance process installs; outside an instance process
those calls raise :class:`TritonModelException`.
"""

from __future__ import annotations

import asyncio
import json
import queue
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from model_runtime.python_backend.dtypes import numpy_of, triton_of
from model_runtime.python_backend.pb_bridge import TritonModelException, bridge
from model_runtime.python_backend.pb_config import (
    ModelConfig,
    get_input_config_by_name,
    get_output_config_by_name,
    using_decoupled_model_transaction_policy,
)
from model_runtime.python_backend.pb_metrics import Logger, Metric, MetricFamily
from model_runtime.python_backend.pb_tensor import Tensor

__all__ = [
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "Logger",
    "Metric",
    "MetricFamily",
    "ModelConfig",
    "ResponseIterator",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "is_model_ready",
    "load_model",
    "numpy_to_triton_type",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
    "unload_model",
    "using_decoupled_model_transaction_policy",
]

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
TRITONSERVER_MEMORY_CPU = 0
TRITONSERVER_MEMORY_GPU = 2

#: TRITONSERVER_DataType numbers, as ``triton_to_numpy_type`` takes them
_TYPE_NUMBERS = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32"]
_TYPE_NUMBERS += ["INT64", "FP16", "FP32", "FP64", "BYTES"]


class TritonError:
    """An error for one response, with Triton's error code (``INTERNAL`` by default)."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7
    CODE_NAMES: tuple[str, ...] = ("UNKNOWN", "INTERNAL", "NOT_FOUND", "INVALID_ARG")
    CODE_NAMES += ("UNAVAILABLE", "UNSUPPORTED", "ALREADY_EXISTS", "CANCELLED")

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._message = str(message)
        self._code = code if code in range(len(self.CODE_NAMES)) else self.INTERNAL

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, {self.CODE_NAMES[self._code]})"


def _parameters(value: Mapping[str, Any] | str | None, what: str) -> str:
    if not value or value == "{}":
        return "{}"
    if isinstance(value, str):
        value = json.loads(value)
    if not isinstance(value, Mapping):
        raise TritonModelException(f"{what} parameters must be a dict")
    for key, item in value.items():
        if not isinstance(key, str) or not isinstance(item, (bool, int, str, float)):
            raise TritonModelException(
                f"{what} parameter {key!r}: keys are str, values bool, int, float or str"
            )
    return json.dumps(dict(value))


class InferenceResponse:
    """The answer to one request: output tensors, or an error (``TritonError``)."""

    __slots__ = ("_error", "_outputs", "_parameters")

    def __init__(
        self,
        output_tensors: Sequence[Tensor] | None = None,
        error: TritonError | str | None = None,
        parameters: Mapping[str, Any] | str | None = None,
    ) -> None:
        self._outputs = list(output_tensors) if output_tensors is not None else []
        self._error = TritonError(error) if isinstance(error, str) else error
        self._parameters = _parameters(parameters, "response")

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return self._parameters


class InferenceResponseSender:
    """Sends a request's responses (decoupled models: any number, then the final flag)."""

    __slots__ = ("_closed", "_key")

    def __init__(self, key: int) -> None:
        self._key = key
        self._closed = False

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        """Raises: TritonModelException: the final flag was sent already, or no response
        and no final flag."""
        if self._closed:
            raise TritonModelException("the response sender is closed (the final flag was sent)")
        if response is None and not flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            raise TritonModelException("send() needs a response or the final flag")
        if flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            self._closed = True
        bridge().send(self._key, response, flags)

    def is_cancelled(self) -> bool:
        return bridge().cancelled(self._key)


class ResponseIterator:
    """The responses of a decoupled BLS call, as they come (sync or async iteration).
    ``pump(timeout)`` reads the instance's wire while a sync iteration waits."""

    def __init__(self, pump: Callable[[float], None] | None = None) -> None:
        self._queue: queue.SimpleQueue[InferenceResponse | None] = queue.SimpleQueue()
        self._done = False
        self._pump = pump
        self.cancel_hook: Any = None

    def put(self, response: InferenceResponse | None) -> None:
        """Called by the instance process: a response, or None after the last one."""
        self._queue.put(response)

    def __iter__(self) -> Iterator[InferenceResponse]:
        return self

    def __next__(self) -> InferenceResponse:
        if self._done:
            raise StopIteration
        while True:
            try:
                item = self._queue.get_nowait()
                break
            except queue.Empty:
                if self._pump is None:
                    item = self._queue.get()
                    break
                self._pump(0.05)
        if item is None:
            self._done = True
            raise StopIteration
        return item

    def __aiter__(self) -> AsyncIterator[InferenceResponse]:
        return self

    async def __anext__(self) -> InferenceResponse:
        if self._done:
            raise StopAsyncIteration
        try:
            item = self._queue.get_nowait()
        except queue.Empty:
            item = await asyncio.get_running_loop().run_in_executor(None, self._queue.get)
        if item is None:
            self._done = True
            raise StopAsyncIteration
        return item

    def cancel(self) -> None:
        if self.cancel_hook is not None:
            self.cancel_hook()


class InferenceRequest:
    """A request: given to ``execute``, or built by a model to call another model (BLS)."""

    __slots__ = (
        "_correlation_id", "_flags", "_inputs", "_key", "_model_name", "_model_version",
        "_parameters", "_request_id", "_requested", "_timeout",
    )  # fmt: skip

    @classmethod
    def given(
        cls,
        key: int,
        model_name: str,
        inputs: list[Tensor],
        requested: list[str],
        request_id: str,
        correlation_id: int | str,
        flags: int,
        parameters: str | None,
    ) -> InferenceRequest:
        """A request the instance hands ``execute`` (its tensors made by the instance).

        Raises:
            TritonModelException: ``parameters`` (JSON text) that are not Triton's."""
        request = cls.__new__(cls)
        request._model_name = model_name
        request._inputs = inputs
        request._requested = requested
        request._request_id = request_id
        request._correlation_id = correlation_id
        request._model_version = -1
        request._flags = flags
        request._timeout = 0
        request._parameters = _parameters(parameters, "request") if parameters else "{}"
        request._key = key
        return request

    def __init__(
        self,
        model_name: str = "",
        inputs: Sequence[Tensor] = (),
        requested_output_names: Sequence[str] = (),
        request_id: str = "",
        correlation_id: int | str = 0,
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: Any = None,
        trace: Any = None,
        parameters: Mapping[str, Any] | str | None = None,
    ) -> None:
        for t in inputs:
            if not isinstance(t, Tensor):
                raise TritonModelException(
                    f"inputs must be pb_utils.Tensor, not {type(t).__name__}"
                )
        self._model_name = model_name
        self._inputs = list(inputs)
        self._requested = [str(n) for n in requested_output_names]
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._model_version = model_version
        self._flags = flags
        self._timeout = timeout
        self._parameters = _parameters(parameters, "request")
        self._key = -1  # set for requests given to execute

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def get_input_tensor_by_name(self, name: str) -> Tensor | None:
        for tensor in self._inputs:
            if tensor.name() == name:
                return tensor
        return None

    def requested_output_names(self) -> list[str]:
        return self._requested

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def model_name(self) -> str:
        return self._model_name

    def model_version(self) -> int:
        return self._model_version

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        return self._parameters

    def get_response_sender(self) -> InferenceResponseSender:
        if self._key < 0:
            raise TritonModelException("only a request given to execute has a response sender")
        return InferenceResponseSender(self._key)

    def is_cancelled(self) -> bool:
        return self._key >= 0 and bridge().cancelled(self._key)

    def set_release_flags(self, flags: int) -> None:
        raise TritonModelException("request rescheduling is not supported by this server")

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on ``model_name`` and wait: a response (``decoupled``: an iterator
        of responses). Errors come back as ``response.has_error()``."""
        if decoupled:
            return bridge().bls_stream(self)
        return bridge().bls(self).result()

    async def async_exec(self, decoupled: bool = False) -> Any:
        """As :meth:`exec`, awaited on the model's event loop."""
        if decoupled:
            return bridge().bls_stream(self)
        return await asyncio.wrap_future(bridge().bls(self))


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    return request.get_input_tensor_by_name(name)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    for tensor in response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def triton_string_to_numpy(triton_type_string: str) -> Any:
    """``"TYPE_FP32"`` -> ``np.float32`` (``TYPE_STRING``: ``np.object_``, ``TYPE_BOOL``: bool).

    Raises:
        KeyError: not a Triton config data type (as Triton's table raises).
    """
    if triton_type_string == "TYPE_BOOL":
        return bool
    try:
        return numpy_of(triton_type_string).type
    except ValueError:
        raise KeyError(triton_type_string) from None


def triton_to_numpy_type(data_type: int) -> Any:
    """TRITONSERVER_DataType number (1 BOOL ... 13 BYTES) -> numpy type; None if unknown."""
    if 1 <= data_type <= len(_TYPE_NUMBERS):
        return numpy_of(_TYPE_NUMBERS[data_type - 1]).type
    return None


def numpy_to_triton_type(data_type: Any) -> int | None:
    """numpy type -> TRITONSERVER_DataType number; None if Triton has none."""
    try:
        name = triton_of(np.dtype(data_type))
    except (TypeError, ValueError):
        return None
    return _TYPE_NUMBERS.index(name) + 1


def load_model(model_name: str, config: str = "", files: Mapping[str, bytes] | None = None) -> None:
    """Load (or reload) a model of this server. Raises: TritonModelException: refused."""
    import base64

    encoded = {k: base64.b64encode(v).decode() for k, v in (files or {}).items()}
    bridge().call("load_model", {"model_name": model_name, "config": config, "files": encoded})


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Unload a model of this server. Raises: TritonModelException: refused."""
    bridge().call(
        "unload_model", {"model_name": model_name, "unload_dependents": unload_dependents}
    )


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """Whether a model (version) of this server is ready."""
    args = {"model_name": model_name, "model_version": str(model_version)}
    return bool(bridge().call("is_model_ready", args))

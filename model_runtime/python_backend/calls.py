"""What an instance process asks of the daemon: BLS calls, the model loading API, custom
metrics and log lines. Each BLS call runs as a task of its own (so many batch together in the
data plane) and is cancelled when the model cancels it or the instance ends."""

from __future__ import annotations

import asyncio
import base64
import inspect
import json
from collections.abc import AsyncIterator
from typing import Any, Protocol

import numpy as np

from model_runtime.python_backend.messages import (
    BlsRequest,
    ControlHook,
    InferHook,
    PyResponse,
    triton_code_of,
)
from model_runtime.python_backend.metrics import CustomMetrics

__all__ = ["CallHandler", "Wire"]

_LEVELS = {"INFO": "info", "WARNING": "warning", "ERROR": "error", "VERBOSE": "debug"}


class Wire(Protocol):
    """What the handler needs of its instance: its log, and its end of the wire."""

    @property
    def log(self) -> Any: ...

    def decode(self, descs: Any, payload: memoryview) -> dict[str, np.ndarray]: ...

    def send(self, header: dict[str, Any], tensors: Any = None) -> None: ...


class CallHandler:
    """Serves one instance's calls to the daemon: BLS through ``infer``, the model loading API
    through ``control`` (None: refused, saying so), custom metrics into ``metrics``."""

    def __init__(
        self,
        wire: Wire,
        infer: InferHook | None,
        control: ControlHook | None,
        metrics: CustomMetrics,
    ) -> None:
        self._wire = wire
        self._infer = infer
        self._control = control
        self._metrics = metrics
        self._tasks: dict[int, asyncio.Task[None]] = {}

    @property
    def busy(self) -> bool:
        """The instance waits on the daemon (a BLS or API call): its silence is not a stall."""
        return bool(self._tasks)

    def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        self._tasks.clear()

    def frame(self, kind: str, header: dict[str, Any], payload: memoryview) -> None:
        wire = self._wire
        if kind == "bls":
            inputs = wire.decode(header.get("T", []), payload)
            self._spawn(header["k"], self._bls(header, inputs))
        elif kind == "bls_cancel":
            task = self._tasks.get(header["k"])
            if task is not None:
                task.cancel()
        elif kind == "call":
            self._spawn(header["k"], self._call(header["k"], header["op"], header.get("a", {})))
        elif kind == "metric":
            try:
                self._metrics.apply(header)
            except ValueError as exc:
                wire.log.warning("python_model_metric_refused", error=str(exc))
        elif kind == "log":
            level = _LEVELS.get(str(header.get("l")), "info")
            getattr(wire.log, level)("python_model_log", message=str(header.get("m")))
        else:
            raise ValueError(f"unknown frame type {kind!r}")

    def _spawn(self, k: int, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks[k] = task
        task.add_done_callback(lambda _: self._tasks.pop(k, None))

    def _reply(self, k: int, response: PyResponse | None, final: bool) -> None:
        header: dict[str, Any] = {"t": "bls_r", "k": k, "fin": final}
        tensors = None
        if response is not None:
            if response.error is not None:
                header["e"] = [response.error.code, str(response.error)]
            else:
                tensors = list(response.outputs.items())
            header["p"] = json.dumps(response.parameters)
        self._wire.send(header, tensors)

    async def _bls(self, header: dict[str, Any], inputs: dict[str, Any]) -> None:
        k = header["k"]
        infer = self._infer
        timeout_us = int(header.get("to") or 0)
        try:
            if infer is None:
                raise LookupError("BLS needs the server: this instance has no way to call models")
            params = header.get("p") or "{}"
            request = BlsRequest(
                model_name=str(header["m"]),
                model_version=int(header.get("v", -1)),
                inputs=inputs,
                requested_outputs=[str(n) for n in header.get("o") or ()],
                request_id=str(header.get("rq", "")),
                correlation_id=header.get("c", 0),
                flags=int(header.get("f", 0)),
                timeout_s=timeout_us / 1e6 if timeout_us > 0 else None,
                parameters=json.loads(params) if isinstance(params, str) else dict(params),
                decoupled=bool(header.get("d")),
            )
            async with asyncio.timeout(request.timeout_s):
                result = infer(request)
                if inspect.isawaitable(result):
                    self._reply(k, await result, True)
                    return
                assert isinstance(result, AsyncIterator)
                if not request.decoupled:  # one response for a caller that asked for one
                    first = await anext(aiter(result), None)
                    self._reply(k, first or PyResponse(), True)
                    return
                async for response in result:
                    self._reply(k, response, False)
                self._reply(k, None, True)
        except asyncio.CancelledError:
            self._reply(k, None, True)
            raise
        except TimeoutError:
            self._error(k, "UNAVAILABLE", f"the BLS request timed out after {timeout_us} us")
        except Exception as exc:
            self._error(k, triton_code_of(exc), str(exc) or type(exc).__name__)

    def _error(self, k: int, code: str, message: str) -> None:
        self._wire.send({"t": "bls_r", "k": k, "fin": True, "e": [code, message]})

    async def _call(self, k: int, op: str, args: dict[str, Any]) -> None:
        metrics, control = self._metrics, self._control
        value: Any = None
        error = None
        try:
            if op == "family":
                metrics.family(str(args["name"]), str(args["description"]), str(args["kind"]))
            elif op == "metric":
                metrics.apply(args)
            elif op == "metric_value":
                value = metrics.value(str(args["family"]), dict(args["labels"]))
            elif op in ("load_model", "unload_model", "is_model_ready"):
                if control is None:
                    raise LookupError(f"{op} needs the server: this instance has no model control")
                args = dict(args)
                if op == "load_model":  # files cross as base64; the hook gets their bytes
                    files = args.get("files") or {}
                    args["files"] = {str(k): base64.b64decode(v) for k, v in files.items()}
                value = await control(op, args)
            else:
                raise LookupError(f"unknown call {op!r}")
        except Exception as exc:
            error = str(exc) or type(exc).__name__
        self._wire.send({"t": "call_r", "k": k, "v": value, "e": error})

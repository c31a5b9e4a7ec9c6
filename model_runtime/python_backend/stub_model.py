"""The model inside an instance process: loading ``model.py`` and calling it as Triton does.

Everything here runs on the instance process's main thread. Whatever the model
does wrong (``model.py`` that does not import, ``initialize`` that raises, ``execute`` that raises,
returns the wrong count or something that is not a response) becomes an error the daemon can
hand to whom it concerns: a load error, or that batch's requests' errors, with a text that says
what is wrong. The process itself keeps serving.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import sys
import traceback
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Protocol

from model_runtime.python_backend import pb_utils
from model_runtime.python_backend.pb_config import ModelConfig

__all__ = ["ModelHost"]

_FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class _Wire(Protocol):
    def write(self, header: dict[str, Any], build: Any = None) -> None: ...
    def respond(
        self, items: list[tuple[int, Any, int]], done: list[int] | None = None, ran: int = 0
    ) -> None: ...


def _describe(exc: BaseException) -> str:
    """``Type: message`` and where in the model it was raised (its last frame)."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" ({Path(frames[-1].filename).name}, line {frames[-1].lineno})" if frames else ""
    text = str(exc)
    if isinstance(exc, pb_utils.TritonModelException):
        return text or "TritonModelException"
    return f"{type(exc).__name__}: {text}{where}" if text else f"{type(exc).__name__}{where}"


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


class ModelHost:
    """Loads the model and runs its calls; tracks which requests still await a final response."""

    def __init__(self, wire: _Wire) -> None:
        self._wire = wire
        self.finished = False
        #: called once the process has nothing more to do (finalized, or not loaded)
        self.on_finished: Callable[[], None] = lambda: None
        self.model: Any = None
        self.decoupled = False
        self.is_async = False
        #: rows an ``execute`` of merged batches may hold (0: batches are not merged: a model
        #: without batching, decoupled, async, or with sequence batching)
        self.merge_rows = 0
        #: the model batches (``max_batch_size`` > 0): an execute's size is its requests' rows
        self.batching = False
        #: request key -> requested output names (None: all); present while a request is open
        self.requested: dict[int, frozenset[str] | None] = {}

    def is_open(self, key: int) -> bool:
        return key in self.requested

    def closed(self, key: int) -> None:
        self.requested.pop(key, None)

    def handle(self, header: dict[str, Any]) -> Coroutine[Any, Any, None] | None:
        """Act on a frame for the model; what is left to run on the event loop, if anything
        (the caller runs it to completion, or as a task for a model with async execute)."""
        kind = header["t"]
        if kind == "exec":
            return self._execute(header)
        if kind == "init":
            return self._init(header)
        if kind == "isready":
            return self._is_ready(header["k"])
        if kind == "fin":
            return self._finalize()
        return None

    # -- load --------------------------------------------------------------------------------

    async def _init(self, header: dict[str, Any]) -> None:
        stage = "import"
        try:
            path = Path(header["model_file"])
            sys.path.insert(0, str(path.parent))
            spec = importlib.util.spec_from_file_location(f"_triton_model_{path.parent.name}", path)
            if spec is None or spec.loader is None:
                raise ImportError(f"{path} cannot be imported")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            cls = getattr(module, "TritonPythonModel", None)
            if cls is None:
                raise ImportError(f"{path.name} defines no class TritonPythonModel")
            config: dict[str, Any] = header["config"]
            if header.get("auto_complete") and hasattr(cls, "auto_complete_config"):
                stage = "auto_complete_config"
                done = cls.auto_complete_config(ModelConfig(json.dumps(config)))
                if inspect.isawaitable(done):
                    done = await done
                if not isinstance(done, ModelConfig):
                    raise TypeError(
                        f"auto_complete_config returned a {type(done).__name__}, "
                        "not a pb_utils.ModelConfig"
                    )
                config = done.as_dict()
            if header.get("initialize"):
                stage = "initialize"
                self.model = model = cls()
                self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
                args = dict(header["args"], model_config=json.dumps(config))
                if hasattr(model, "initialize"):
                    done = model.initialize(args)
                    if inspect.isawaitable(done):
                        await done
                if not callable(getattr(model, "execute", None)):
                    raise TypeError("TritonPythonModel has no execute(requests) method")
                self.is_async = inspect.iscoroutinefunction(model.execute)
                self.batching = int(config.get("max_batch_size") or 0) > 0
                if not (self.decoupled or self.is_async or "sequence_batching" in config):
                    self.merge_rows = max(0, int(config.get("max_batch_size") or 0))
        except BaseException as exc:
            self._wire.write({"t": "init_err", "stage": stage, "m": _describe(exc)})
            self._done()
            return
        self._wire.write({"t": "ready", "config": config, "async": self.is_async})
        if not header.get("initialize"):
            self._done()  # an auto-complete-only process ends here

    # -- execute -----------------------------------------------------------------------------

    def _requests(self, header: dict[str, Any]) -> list[pb_utils.InferenceRequest]:
        requests = []
        model = header.get("m", "")
        given = pb_utils.InferenceRequest.given
        requested = self.requested
        for item in header["r"]:
            key = item["k"]
            if len(item) == 2:  # its key and tensors: every other field at its default
                requests.append(given(key, model, item["T"], [], "", 0, 0, None))
                requested[key] = None
                continue
            wanted = item.get("o")
            request = given(
                key, model, item["T"], [str(n) for n in wanted] if wanted else [],
                item.get("rq", ""), item.get("c", 0), item.get("f", 0), item.get("p"),
            )  # fmt: skip
            requested[key] = frozenset(wanted) if wanted else None
            requests.append(request)
        return requests

    def _execute(self, header: dict[str, Any]) -> Coroutine[Any, Any, None] | None:
        requests = self._requests(header)
        batch: list[int] = header.get("bs") or [header["b"]]
        size = self._size(requests)
        if self.is_async:
            return self._execute_async(batch, requests, size)
        try:
            result = self.model.execute(requests)
        except BaseException as exc:
            self._finish(batch, requests, size, None, exc)
        else:
            self._finish(batch, requests, size, result, None)
        return None

    def _size(self, requests: list[pb_utils.InferenceRequest]) -> int:
        """An execute's batch size as Triton counts it: its requests' rows (the first input's
        first dimension) for a model that batches, else one per request."""
        if not self.batching:
            return len(requests)
        rows = 0
        for request in requests:
            inputs = request.inputs()
            shape = inputs[0].as_numpy().shape if inputs else ()
            rows += shape[0] if shape else 1
        return rows

    async def _execute_async(
        self, batch: list[int], requests: list[pb_utils.InferenceRequest], size: int
    ) -> None:
        try:
            result = await self.model.execute(requests)
        except BaseException as exc:
            self._finish(batch, requests, size, None, exc)
        else:
            self._finish(batch, requests, size, result, None)

    def _finish(
        self,
        batch: list[int],
        requests: list[pb_utils.InferenceRequest],
        size: int,
        result: Any,
        exc: BaseException | None,
    ) -> None:
        """Send what ``execute`` returned, or the error every open request of the batch gets,
        with the end of the batch and the execute's ``size`` (the daemon's statistics)."""
        if exc is None and result is None and self.decoupled:
            self._wire.respond(
                [], done=batch, ran=size
            )  # the model answers later, from where it likes
            return
        problem: str | None = None
        if exc is not None:
            problem = _describe(exc)
        elif result is None:
            problem = "execute returned None and sent no response for this request"
        elif self.decoupled:
            problem = "a decoupled model's execute must return None (it sends responses)"
        elif not isinstance(result, (list, tuple)):
            problem = f"execute returned a {type(result).__name__}, not a list of responses"
        elif len(result) != len(requests):
            problem = (
                f"execute returned {_count(len(result), 'response')} for "
                f"{_count(len(requests), 'request')}"
            )
        items: list[tuple[int, Any, int]] = []
        open_ = self.requested
        for i, request in enumerate(requests):
            key = request._key
            if key not in open_:
                continue  # answered already through its response sender
            if problem is not None:
                items.append((key, pb_utils.InferenceResponse(error=problem), _FINAL))
            else:
                response = result[i]
                if response is None or not isinstance(response, pb_utils.InferenceResponse):
                    what = "None" if response is None else f"a {type(response).__name__}"
                    response = pb_utils.InferenceResponse(
                        error=f"execute returned {what} for request {i}, "
                        "not a pb_utils.InferenceResponse"
                    )
                items.append((key, response, _FINAL))
        self._wire.respond(items, done=batch, ran=size)

    # -- the rest of the life cycle ----------------------------------------------------------

    async def _is_ready(self, k: int) -> None:
        ready, error = True, None
        check = getattr(self.model, "is_ready", None)
        if check is not None:
            try:
                value = check()
                if inspect.isawaitable(value):
                    value = await value
                if not isinstance(value, bool):
                    raise TypeError(f"is_ready returned a {type(value).__name__}, not a bool")
                ready = value
            except BaseException as exc:
                ready, error = False, _describe(exc)
        self._wire.write({"t": "isready_r", "k": k, "v": ready, "e": error})

    async def _finalize(self) -> None:
        error = None
        done = getattr(self.model, "finalize", None)
        if done is not None:
            try:
                value = done()
                if inspect.isawaitable(value):
                    await value
            except BaseException as exc:
                error = _describe(exc)
        self._wire.write({"t": "finalized", "e": error})
        self._done()

    def _done(self) -> None:
        self.finished = True
        self.on_finished()

"""One instance of a python model, in a process of its own: the daemon's end of its wire.

:class:`InstanceProcess` spawns the instance process (:mod:`.stub`) with a socket pair and the
shared memory of :mod:`.arena`, sends it the model to load, and then hands it batches: every
request gets its responses (one, or a decoupled model's stream), and every request the process
held when it died gets :class:`InstanceCrashedError` that says how it died. Frames from the
process are checked, never trusted: a frame that does not parse ends the process, a tensor that
does not fit fails its request. BLS calls and the model loading API come back through the hooks
the runner gives; custom metrics land in its :class:`~.metrics.CustomMetrics`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from actors.clock import Clock, SystemClock
from model_runtime.errors import (
    InstanceCrashedError,
    ModelLoadError,
)
from model_runtime.python_backend.arena import ParentArena
from model_runtime.python_backend.calls import CallHandler
from model_runtime.python_backend.channel import Channel
from model_runtime.python_backend.held import Call, Held, Sink
from model_runtime.python_backend.messages import ControlHook, InferHook, PyRequest, PyResponse
from model_runtime.python_backend.metrics import CustomMetrics
from model_runtime.python_backend.stacking import stackable, stacked
from model_runtime.python_backend.wire import Encoder, decode_tensors

__all__ = ["InstanceProcess", "InstanceSpec", "describe_exit"]

_log = structlog.get_logger(__name__)
STUB = Path(__file__).resolve().with_name("stub.py")
_FINAL = 1


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """What an instance process runs: ``model_file`` is ``REPOSITORY/NAME/VERSION/model.py``."""

    model_name: str
    model_version: int
    model_file: Path
    config: dict[str, Any]
    instance_name: str = ""
    kind: str = "KIND_CPU"
    device_id: int = 0
    python: str = sys.executable
    #: bytes of each direction's ring in the shared memory (a larger tensor goes inline)
    ring_bytes: int = 8 << 20
    hooks_infer: InferHook | None = None
    hooks_control: ControlHook | None = None
    metrics: CustomMetrics = field(default_factory=CustomMetrics)

    def args(self) -> dict[str, str]:
        """Triton's ``initialize(args)`` (``model_config`` is added by the instance)."""
        return {
            "model_instance_kind": self.kind.removeprefix("KIND_"),
            "model_instance_name": self.instance_name or f"{self.model_name}_0_0",
            "model_instance_device_id": str(self.device_id),
            "model_repository": str(self.model_file.parent.parent),
            "model_version": str(self.model_version),
            "model_name": self.model_name,
        }


def describe_exit(returncode: int | None) -> str:
    """``exited with code 3`` / ``was killed by signal SIGKILL``."""
    if returncode is None:
        return "stopped"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = str(-returncode)
        return f"was killed by signal {name}"
    return f"exited with code {returncode}"


class InstanceProcess:
    """The daemon's side of one instance process. Not reusable: a new process, a new object.

    ``start`` loads the model; ``execute``/``stream`` run requests; ``stop`` finalizes; ``kill``
    is SIGKILL. :attr:`death` is set (an :class:`InstanceCrashedError`) once the process ended
    while it was expected to serve.
    """

    def __init__(self, spec: InstanceSpec, *, clock: Clock | None = None) -> None:
        self.spec = spec
        self.clock = clock or SystemClock()
        self.log = _log.bind(model=spec.model_name, instance=spec.instance_name)
        self.process: asyncio.subprocess.Process | None = None
        self.death: InstanceCrashedError | None = None
        self.died = asyncio.Event()
        self.last_progress = self.clock.monotonic()
        self.config: dict[str, Any] = spec.config
        self._arena: ParentArena | None = None
        self._channel: Channel | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._held = Held()
        self._keys = 0
        self._waiters: dict[int, asyncio.Future[Any]] = {}
        self._tasks: list[asyncio.Task[Any]] = []
        self._stopping = False
        self._reason: str | None = None
        self._on_executed: Callable[[list[int]], None] = lambda sizes: None
        #: the model's execute is ``async def`` (many batches at once)
        self.is_async = False
        self.calls = CallHandler(self, spec.hooks_infer, spec.hooks_control, spec.metrics)

    # -- state for the runner ----------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    @property
    def alive(self) -> bool:
        return self.process is not None and self.death is None and not self._stopping

    @property
    def held(self) -> int:
        """Requests the instance holds now (the runner sends to the least loaded)."""
        return len(self._held)

    @property
    def executing(self) -> int:
        """Batches whose ``execute`` has not returned yet."""
        return self._held.executing

    def on_batch_done(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` whenever a batch's ``execute`` returns or the process dies."""
        self._held.on_batch_done = callback

    def on_executed(self, callback: Callable[[list[int]], None]) -> None:
        """Call ``callback`` with the batch sizes of the ``execute`` calls that returned."""
        self._on_executed = callback

    def stalled(self, now: float, deadline: float) -> bool:
        """Busy, waiting on nothing of ours, and silent for ``deadline`` seconds."""
        return bool(self._held) and not self.calls.busy and now - self.last_progress > deadline

    # -- life cycle --------------------------------------------------------------------------

    async def start(
        self, *, initialize: bool = True, auto_complete: bool = False, timeout: float = 120.0
    ) -> dict[str, Any]:
        """Spawn the process and load the model; the config it runs with (auto-completed if
        asked). With ``initialize=False`` the process ends after ``auto_complete_config``.

        Raises:
            ModelLoadError: the interpreter cannot start, ``model.py`` does not import, has no
                ``TritonPythonModel``, ``auto_complete_config``/``initialize`` raise, or the
                process dies or takes longer than ``timeout`` seconds.
        """
        spec = self.spec
        name = spec.model_name
        parent_sock, child_sock = socket.socketpair()
        try:
            self._arena = arena = ParentArena(spec.ring_bytes)
            self.process = await asyncio.create_subprocess_exec(
                spec.python, str(STUB), str(child_sock.fileno()), str(arena.fd),
                str(spec.ring_bytes), pass_fds=(child_sock.fileno(), arena.fd),
                stdin=asyncio.subprocess.DEVNULL,
            )  # fmt: skip
        except OSError as exc:
            parent_sock.close()
            self._close_arena()
            raise ModelLoadError(name, f"cannot start python {spec.python!r}: {exc}", exc) from exc
        finally:
            child_sock.close()
        self._loop = loop = asyncio.get_running_loop()
        _, self._channel = await loop.create_unix_connection(
            lambda: Channel(self._frame), sock=parent_sock
        )
        ready: asyncio.Future[Any] = loop.create_future()
        self._waiters[0] = ready
        self._tasks = [loop.create_task(self._watch())]
        self.send(
            {"t": "init", "model_file": str(spec.model_file), "config": spec.config,
             "args": spec.args(), "auto_complete": auto_complete, "initialize": initialize}
        )  # fmt: skip
        try:
            header = await asyncio.wait_for(ready, timeout)
        except TimeoutError:
            self.kill()
            raise ModelLoadError(name, f"the python instance did not load in {timeout} s") from None
        except InstanceCrashedError as exc:
            raise ModelLoadError(name, f"the python instance {exc}", exc) from exc
        except ModelLoadError:
            await self.wait_exit(5.0)
            raise
        self.config = header["config"]
        if not initialize:
            self._stopping = True  # it ends by itself now: no death to report
        self.is_async = bool(header.get("async"))
        self.last_progress = self.clock.monotonic()
        if not initialize:
            await self.wait_exit(5.0)
        self.log.debug("python_instance_started", pid=self.pid)
        return self.config

    async def stop(self, grace: float = 30.0) -> None:
        """Call the model's ``finalize`` and let the process exit; past ``grace``, kill it.
        Requests still held get :class:`InstanceCrashedError`. Raises: nothing."""
        if self.process is None or self.process.returncode is not None:
            self._close_arena()
            return
        if self.death is None and not self._stopping:
            loop = asyncio.get_running_loop()
            done: asyncio.Future[Any] = loop.create_future()
            self._waiters[-1] = done
            self.send({"t": "fin"})
            self._stopping = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(done, grace)
        self._stopping = True
        await self.wait_exit(grace)

    def kill(self) -> None:
        """SIGKILL the process (its requests fail once its exit is seen)."""
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()

    async def wait_exit(self, grace: float) -> None:
        """Wait for the process to end; past ``grace`` seconds, kill it."""
        if self.process is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(self.died.wait()), grace)
        except TimeoutError:
            self.kill()
            await self.died.wait()

    def _close_arena(self) -> None:
        if self._arena is not None:
            self._arena.close()
            self._arena = None

    # -- requests ----------------------------------------------------------------------------

    def submit(self, requests: Sequence[PyRequest], *, stream: bool = False) -> list[Call]:
        """Send one batch; its calls, in order.

        Raises:
            InstanceCrashedError: the process is gone or stopping.
            ValueError: an input of a dtype Triton has no datatype for.
        """
        return self.submit_many([requests], stream=stream)[0]

    def submit_many(
        self,
        batches: Sequence[Sequence[PyRequest]],
        *,
        stream: bool = False,
        alone: Sequence[bool] = (),
        now: bool = False,
        sink: Sink | None = None,
        owners: Sequence[Sequence[Any]] = (),
    ) -> list[list[Call]]:
        """Send batches in one frame; the calls of each, in order. The model runs them one
        after the other; an instance of a model that batches merges batches that wait for it
        into one ``execute`` (up to ``max_batch_size`` rows), except those ``alone`` says
        (requests that were in a crash: each its own ``execute``). The frame leaves at the
        end of this turn of the event loop (``now``: at once). ``sink``: the answer of each
        request (not a stream) goes to ``sink(owner, answer)``, its owner the request's
        in ``owners`` (by batch), instead of a future. Raises: as :meth:`submit`."""
        if not self.alive or self._channel is None or self._arena is None:
            raise self.death or InstanceCrashedError(f"the python instance {describe_exit(None)}")
        enc = Encoder(self._arena)
        header: dict[str, Any] = {"t": "exec", "m": self.spec.model_name}
        out: list[list[Call]] = []
        ids: list[int] = []
        wire = []
        by_batch = [[list(request.inputs.items()) for request in rs] for rs in batches]
        # The whole frame's requests agree: one tensor per input for them all, a row each.
        framed = len(batches) > 1 and stackable([n for named in by_batch for n in named])
        if framed:
            header["S"] = enc.tensors(stacked([n for named in by_batch for n in named]))
        for n, requests in enumerate(batches):
            batch = self._keys = self._keys + 1
            calls: list[Call] = []
            items: list[dict[str, Any]] = []
            entry: dict[str, Any] = {"b": batch, "r": items}
            named = by_batch[n]
            together = framed or stackable(named)
            if together and not framed:  # one tensor per input for the batch, a row each
                entry["S"] = enc.tensors(stacked(named))
            for i, (request, inputs) in enumerate(zip(requests, named, strict=True)):
                self._keys += 1
                key = self._keys
                item: dict[str, Any] = {"k": key}
                if not together:
                    item["T"] = enc.tensors(inputs)
                # what a request leaves at its default does not cross (the instance's default)
                if request.request_id:
                    item["rq"] = request.request_id
                if request.correlation_id:
                    item["c"] = request.correlation_id
                if request.flags:
                    item["f"] = request.flags
                if request.requested_outputs:
                    item["o"] = list(request.requested_outputs)
                if request.parameters:
                    item["p"] = json.dumps(dict(request.parameters))
                items.append(item)
                sunk = None if sink is None else (sink, owners[n][i])
                calls.append(Call(key, batch, stream, self._loop, sunk))
            if n < len(alone) and alone[n]:
                entry["a"] = 1  # not merged with other batches
            wire.append(entry)
            out.append(calls)
            ids.append(batch)
        idle = not self._held
        for batch, calls in zip(ids, out, strict=True):
            self._held.add(batch, calls)
        if idle:
            self.last_progress = self.clock.monotonic()  # idle until now: the clock starts here
        header["B"] = wire
        self._channel.write(enc.finish(header, self._arena.sender.head, fast=True), now)
        return out

    async def execute(self, requests: Sequence[PyRequest]) -> list[PyResponse]:
        """One response per request, in order; a request the model failed has ``error`` set.

        Raises:
            InstanceCrashedError: the process died (or was killed) while it held the batch.
        """
        calls = self.submit(requests)
        try:
            return [await call.future for call in calls]  # type: ignore[misc]
        except asyncio.CancelledError:
            self.cancel(calls)
            raise

    async def stream(self, request: PyRequest) -> AsyncIterator[PyResponse]:
        """A decoupled model's responses to one request, up to the final one.

        Raises:
            InstanceCrashedError: the process died while it held the request.
        """
        (call,) = self.submit([request], stream=True)
        assert call.queue is not None
        try:
            while True:
                item = await call.queue.get()
                if isinstance(item, BaseException):
                    raise item
                if item.outputs or item.error is not None or item.parameters:
                    yield item
                elif item.final:
                    yield item  # a flag-only final response ends the stream as Triton says
                if item.final:
                    return
        finally:
            if call.key in self._held:
                self.cancel([call])

    def cancel(self, calls: Sequence[Call]) -> None:
        """Tell the model these requests are cancelled (``request.is_cancelled()``)."""
        keys = [c.key for c in calls if c.key in self._held]
        if keys and self.alive:
            self.send({"t": "cancel", "k": keys})

    async def is_ready(self, timeout: float = 5.0) -> bool:
        """The model's own ``is_ready()`` (True when it has none); False past ``timeout``."""
        if not self.alive:
            return False
        self._keys += 1
        k = self._keys
        waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiters[k] = waiter
        self.send({"t": "isready", "k": k})
        try:
            header = await asyncio.wait_for(waiter, timeout)
        except (TimeoutError, InstanceCrashedError):
            return False
        finally:
            self._waiters.pop(k, None)
        return bool(header.get("v"))

    # -- the wire ----------------------------------------------------------------------------

    def send(self, header: dict[str, Any], tensors: Any = None) -> None:
        """Send one frame to the process (dropped when the channel is gone)."""
        if self._channel is None or self._arena is None:
            return
        enc = Encoder(self._arena)
        if tensors is not None:
            header["T"] = enc.tensors(tensors)
        self._channel.write(enc.finish(header, self._arena.sender.head))

    async def _watch(self) -> None:
        assert self.process is not None
        channel = self._channel
        assert channel is not None
        exited: asyncio.Future[Any] = asyncio.ensure_future(self.process.wait())
        await asyncio.wait([exited, channel.closed], return_when=asyncio.FIRST_COMPLETED)
        if channel.closed.done() and channel.closed.result() is not None:
            self._reason = self._reason or channel.closed.result()
            self.log.error("python_instance_bad_frame", error=self._reason)
            self.kill()
        returncode = await self.process.wait()
        # The last frames first (a grandchild holding the socket: 1 s at most).
        await asyncio.wait([channel.closed], timeout=1.0)
        reason = self._reason
        expected = self._stopping and not self._held
        text = f"the python instance {self.spec.instance_name} (pid {self.process.pid}) "
        text += reason or describe_exit(returncode)
        self.death = InstanceCrashedError(text, returncode)
        if not expected:
            self.log.warning("python_instance_died", returncode=returncode, reason=reason)
        for waiter in self._waiters.values():
            if not waiter.done():
                waiter.set_exception(self.death)
        self._held.fail_all(self.death)
        channel.close()
        self.calls.close()
        self._close_arena()
        self.died.set()

    def set_reason(self, reason: str) -> None:
        """Why the runner killed the process (replaces the exit status in the error text)."""
        self._reason = reason

    def _frame(self, header: dict[str, Any], payload: memoryview) -> None:
        self.last_progress = self.clock.monotonic()
        kind = header["t"]
        if kind == "resp":
            self._held.responses(header, payload, self.decode)
            if "x" in header:
                self._on_executed(header["x"])
        elif kind in ("ready", "init_err"):
            waiter = self._waiters.pop(0, None)
            if waiter is not None and not waiter.done():
                if kind == "ready":
                    waiter.set_result(header)
                else:
                    waiter.set_exception(
                        ModelLoadError(self.spec.model_name, f"{header['stage']}: {header['m']}")
                    )
        elif kind in ("isready_r", "finalized"):
            waiter = self._waiters.get(-1 if kind == "finalized" else header["k"])
            if waiter is not None and not waiter.done():
                waiter.set_result(header)
        else:
            self.calls.frame(kind, header, payload)
        if self._arena is not None:
            self._arena.consumed(int(header.get("h", 0)))

    def decode(self, descs: Any, payload: memoryview) -> dict[str, np.ndarray]:
        """Raises: WireError: a tensor that does not parse or lies outside the shared memory."""
        assert self._arena is not None
        return dict(decode_tensors(descs, payload, self._arena))

"""The embedded application runtime (seed 000, DESIGN.md §9).

``ctx = await embedded_runtime_start(path, startup_inputs, engine_name)`` starts (or reuses) a
named *engine*: a :class:`~model_runtime.runner.ModelRunner` in the runtime's tree on the
process's shared blocking portal (:func:`~model_runtime.blocking.shared_portal`), owned by a
process-wide registry. It outlives the task and the thread that started it;
:func:`embedded_runtime_stop` (or interpreter exit) stops it.

``startup_inputs`` are the executable's mutable variables (a list in variable order, or a dict
by name), passed once: they become the runner's frozen inputs, uploaded by the load program and
again after any device reset. ``await embedded_runtime_call(inputs, ctx)`` returns the outfeed,
one array per output in ``ctx.output_types`` order. The ``*_sync`` variants do the same from
synchronous threads (they block the calling thread, never an event loop).

``timeout`` (seconds) is how long the engine waits for more calls before it runs a partly filled
group of batches (the seed's flush timeout): with device iterations ``I``, one main run consumes
``I`` batches, so a lone call waits at most ``timeout``; ``I`` concurrent calls share one run.

A stateful model (issue 32) starts with ``sequences=`` its
:class:`~model_runtime.sequences.SequenceConfig`: each call is then a step of the sequence its
``sequence=`` :class:`~model_runtime.sequences.SequenceStep` names (one row; the engine keeps the
state and fills the control inputs, which the context's signature leaves out).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import functools
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import numpy as np
import structlog

from model_runtime.blocking import run_in_portal, shared_portal
from model_runtime.errors import ConfigurationError, InputValidationError, RunnerStoppedError
from model_runtime.executable import Executable
from model_runtime.io import DataDesc, describe_anchor
from model_runtime.runner import ModelRunner, ModelRunnerConfig
from model_runtime.sequences import SequenceConfig, SequenceRunner, SequenceStep

__all__ = [
    "EngineConflictError",
    "RuntimeContext",
    "embedded_runtime_call",
    "embedded_runtime_call_sync",
    "embedded_runtime_start",
    "embedded_runtime_start_sync",
    "embedded_runtime_stop",
]

log = structlog.get_logger(__name__)

#: Default flush timeout, seconds (the seed's default is 5000 µs).
DEFAULT_TIMEOUT = 0.005
#: Seconds to wait for an engine's runner to start or stop.
_START_STOP_TIMEOUT = 60.0

StartupInputs = Sequence[Any] | Mapping[str, Any]
CallInputs = Sequence[Any] | Mapping[str, Any]


class EngineConflictError(ConfigurationError):
    """An engine name is already running a different executable."""


@dataclass(frozen=True, slots=True)
class RuntimeContext:
    """What a call needs: the engine's name, its input signature and output types."""

    name: str
    executable_path: str
    package_hash: str
    signature: tuple[DataDesc, ...]
    output_types: tuple[DataDesc, ...]
    #: The engine runs a stateful model: each call is a step of a sequence.
    stateful: bool = False


class _Engine:
    """One named engine: a runner in the runtime's tree on the shared blocking portal."""

    def __init__(
        self,
        name: str,
        exe: Executable,
        frozen: dict[str, np.ndarray],
        timeout: float,
        sequences: SequenceConfig | None = None,
    ) -> None:
        self.name = name
        self.exe = exe
        self.sequences = sequences
        self.ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        if sequences is None:
            self.runner: Any = ModelRunner(
                exe, ModelRunnerConfig(frozen_inputs=frozen, timeout=timeout)
            )
        else:  # one row per step, batched with other sequences' steps
            config = ModelRunnerConfig(frozen_inputs=frozen, timeout=timeout, batching_dim=0)
            self.runner = SequenceRunner(ModelRunner(exe, config), sequences, name)

    def start(self) -> None:
        """Start the runner (the thread that created the engine does); others wait ``ready``.

        Raises:
            ModelRuntimeError: the runner did not start (``ready`` carries it too).
        """
        try:
            run_in_portal(self.runner.start, timeout=_START_STOP_TIMEOUT)
        except BaseException as exc:
            self.ready.set_exception(exc)
            raise
        self.ready.set_result(None)
        log.info("embedded_engine_started", engine=self.name, model=self.exe.metadata.model_name)

    def submit(
        self,
        inputs: Mapping[str, np.ndarray],
        timeout: float | None,
        sequence: SequenceStep | None = None,
    ) -> concurrent.futures.Future[dict[str, np.ndarray]]:
        execute = self.runner.execute
        if self.sequences is not None:
            execute = functools.partial(execute, sequence=sequence or SequenceStep(0))
        elif sequence is not None:
            raise InputValidationError(
                f"embedded engine {self.name!r} runs a stateless model: a call names no "
                "sequence (start the engine with sequences= for a stateful one)"
            )
        try:
            return shared_portal().start_task_soon(execute, inputs, None, None, timeout)
        except RuntimeError as exc:  # the portal stopped (interpreter exit)
            raise RunnerStoppedError(f"embedded engine {self.name!r} is not running") from exc

    def stop(self) -> None:
        if not self.ready.done() or self.ready.exception() is not None:
            return
        try:
            run_in_portal(self.runner.close, timeout=_START_STOP_TIMEOUT)
        except RunnerStoppedError:
            pass  # the portal already stopped, and the runner with it
        log.info("embedded_engine_stopped", engine=self.name)


_lock = threading.Lock()
_engines: dict[str, _Engine] = {}


def _startup_feed(exe: Executable, startup_inputs: StartupInputs) -> dict[str, np.ndarray]:
    variables = exe.metadata.variables
    names = [v.name for v in variables]
    where = f"model {exe.metadata.model_name!r}"
    if isinstance(startup_inputs, Mapping):
        unknown = sorted(set(startup_inputs) - set(names))
        missing = [n for n in names if n not in startup_inputs]
        if unknown or missing:
            raise InputValidationError(
                f"{where}: startup inputs must be its variables {names}; "
                + (f"unknown: {unknown} " if unknown else "")
                + (f"missing: {missing}" if missing else "")
            )
        given = [startup_inputs[n] for n in names]
    else:
        given = list(startup_inputs)
        if len(given) != len(names):
            raise InputValidationError(
                f"{where}: {len(given)} startup inputs given, but it has {len(names)} variables "
                f"{names}; pass one value per variable, in that order (or a dict by name)"
            )
    feed = {}
    for anchor, value in zip(variables, given, strict=True):
        arr = (
            np.asarray(value) if isinstance(value, np.ndarray) else np.asarray(value, anchor.dtype)
        )
        if arr.shape != anchor.shape or arr.dtype != anchor.dtype:
            raise InputValidationError(
                f"{where}: startup input {anchor.name!r} is {arr.dtype.name}{list(arr.shape)}, "
                f"the variable is {anchor.dtype.name}{list(anchor.shape)}"
                + (
                    f"; cast it with .astype(np.{anchor.dtype.name})"
                    if arr.shape == anchor.shape
                    else ""
                )
            )
        feed[anchor.name] = np.array(arr, copy=True, order="C")
    return feed


def embedded_runtime_start_sync(
    path: str | os.PathLike[str],
    startup_inputs: StartupInputs,
    engine_name: str,
    timeout: float = DEFAULT_TIMEOUT,
    sequences: SequenceConfig | None = None,
) -> RuntimeContext:
    """:func:`embedded_runtime_start` for synchronous threads (blocks until the engine runs).

    Raises:
        As :func:`embedded_runtime_start`.
    """
    if not isinstance(engine_name, str) or not engine_name:
        raise ConfigurationError("engine_name must be a non-empty string")
    if timeout < 0:
        raise ConfigurationError(f"timeout must be >= 0 seconds, got {timeout}")
    exe = Executable.load(path)
    with _lock:
        engine = _engines.get(engine_name)
        if engine is not None:
            running = engine.exe.metadata.package_hash
            if running != exe.metadata.package_hash or engine.sequences != sequences:
                raise EngineConflictError(
                    f"embedded engine {engine_name!r} already runs another executable "
                    f"({engine.exe.metadata.model_name!r}, package hash {running[:12]}), or "
                    "with other sequence settings; use "
                    "another engine name, or stop it first with embedded_runtime_stop("
                    f"{engine_name!r})"
                )
            reused = True
        else:
            feed = _startup_feed(exe, startup_inputs)
            engine = _Engine(engine_name, exe, feed, timeout, sequences)
            _engines[engine_name] = engine
            reused = False
    try:
        if not reused:
            engine.start()
        engine.ready.result(_START_STOP_TIMEOUT)
    except BaseException:
        with _lock:
            if _engines.get(engine_name) is engine:
                del _engines[engine_name]
        raise
    if reused:
        log.debug("embedded_engine_reused", engine=engine_name)
    meta = engine.exe.metadata
    hidden_in = sequences.hidden_inputs if sequences else frozenset()
    hidden_out = sequences.hidden_outputs if sequences else frozenset()
    return RuntimeContext(
        name=engine_name,
        executable_path=os.fspath(path),
        package_hash=meta.package_hash,
        signature=tuple(describe_anchor(a) for a in meta.user_inputs if a.name not in hidden_in),
        # What a call returns: the model's outputs without the new values of its variables
        # (those stay on the device, as the seed's mutable variables do) or its next states.
        output_types=tuple(
            describe_anchor(a) for a in meta.execute_outputs if a.name not in hidden_out
        ),
        stateful=sequences is not None,
    )


async def embedded_runtime_start(
    path: str | os.PathLike[str],
    startup_inputs: StartupInputs,
    engine_name: str,
    timeout: float = DEFAULT_TIMEOUT,
    sequences: SequenceConfig | None = None,
) -> RuntimeContext:
    """Start the engine ``engine_name`` for the executable at ``path`` (or reuse it).

    ``startup_inputs``: the executable's variables, a list in variable order or a dict by name.
    ``timeout``: seconds to wait for more calls before running a partial group of batches.
    ``sequences``: a stateful model's sequence batching (module docstring).

    Raises:
        InvalidExecutableError: the file is not a valid executable.
        InputValidationError: startup inputs with wrong names, count, shapes or dtypes.
        EngineConflictError: ``engine_name`` already runs a different executable.
        ConfigurationError: an empty engine name or a negative timeout.
        DeviceUnavailableError: no device could be attached.
    """
    return await anyio.to_thread.run_sync(
        embedded_runtime_start_sync, path, startup_inputs, engine_name, timeout, sequences
    )


def _engine(context: RuntimeContext) -> _Engine:
    engine = _engines.get(context.name)
    if engine is None or engine.exe.metadata.package_hash != context.package_hash:
        raise RunnerStoppedError(
            f"embedded engine {context.name!r} is not running (stopped, or restarted with another "
            "executable); start it again with embedded_runtime_start"
        )
    return engine


def _call_feed(inputs: CallInputs, context: RuntimeContext) -> dict[str, np.ndarray]:
    if isinstance(inputs, Mapping):
        return {k: np.asarray(v) for k, v in inputs.items()}
    given = list(inputs)
    if len(given) != len(context.signature):
        raise InputValidationError(
            f"embedded engine {context.name!r}: {len(given)} inputs given, the executable takes "
            f"{[d.name for d in context.signature]}"
        )
    return {d.name: np.asarray(v) for d, v in zip(context.signature, given, strict=True)}


def _outfeed(result: Mapping[str, np.ndarray], context: RuntimeContext) -> list[np.ndarray]:
    return [result[d.name] for d in context.output_types]


def embedded_runtime_call_sync(
    inputs: CallInputs,
    context: RuntimeContext,
    timeout: float | None = None,
    sequence: SequenceStep | None = None,
) -> list[np.ndarray]:
    """:func:`embedded_runtime_call` for synchronous threads (blocks the calling thread).

    Raises:
        As :func:`embedded_runtime_call`.
    """
    future = _engine(context).submit(_call_feed(inputs, context), timeout, sequence)
    return _outfeed(future.result(), context)


async def embedded_runtime_call(
    inputs: CallInputs,
    context: RuntimeContext,
    timeout: float | None = None,
    sequence: SequenceStep | None = None,
) -> list[np.ndarray]:
    """Run the engine on ``inputs`` (a list in signature order, or a dict by name); for a
    stateful engine, as the step ``sequence`` of its sequence.

    Returns the outfeed: one array per output, in ``context.output_types`` order.

    Raises:
        RunnerStoppedError: the engine is not running.
        InputValidationError: the inputs do not fit the executable.
        ExecutionTimeoutError: the call passed ``timeout`` seconds.
        RuntimeFailure: the device failed.
    """
    future = _engine(context).submit(_call_feed(inputs, context), timeout, sequence)
    result: dict[str, np.ndarray] = await asyncio.wrap_future(future)
    return _outfeed(result, context)


def embedded_runtime_stop(engine_name: str | None = None) -> None:
    """Stop the engine ``engine_name`` (every engine when ``None``); unknown names are ignored.

    Raises:
        nothing.
    """
    with _lock:
        names = list(_engines) if engine_name is None else [engine_name]
        engines = [_engines.pop(n) for n in names if n in _engines]
    for engine in engines:
        engine.stop()


atexit.register(embedded_runtime_stop)

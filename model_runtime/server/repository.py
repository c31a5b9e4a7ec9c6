"""The daemon's model repository: named models, each served by its own ModelRunner.

Models come from explicit paths (``NAME=PATH`` or ``PATH``; the name is then the file's stem)
and from a repository directory of ``NAME.mrx`` / ``NAME.onnx`` files. An ``.onnx`` model is
compiled on load through the executable cache. Names from clients (load/unload) are checked
against a strict pattern and resolved inside the directory: ``../`` and symlinks that lead out
are refused.
"""

from __future__ import annotations

import asyncio
import enum
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import anyio
import anyio.abc
import numpy as np
import structlog

from actors.session.state import ReplicaStatus
from model_runtime.errors import (
    InputValidationError,
    InvalidExecutableError,
    ModelRuntimeError,
)
from model_runtime.io import DataDesc
from model_runtime.runner_config import ModelRunnerConfig
from model_runtime.server.codec import TensorSpec
from model_runtime.server.datatypes import datatype_of

__all__ = [
    "ModelEntry",
    "ModelNotFoundError",
    "ModelRepository",
    "ModelState",
    "ModelStats",
    "RunnerFactory",
    "RunnerLike",
    "parse_model_arg",
    "replica_states",
]

log = structlog.get_logger(__name__)

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")
SUFFIXES = (".mrx", ".onnx")


class ModelNotFoundError(ModelRuntimeError):
    """No model of that name is known to the repository (HTTP 404)."""


class RunnerLike(Protocol):
    """What the daemon needs from a :class:`model_runtime.runner.ModelRunner`."""

    async def start(self) -> None: ...
    async def close(self) -> None: ...
    async def execute(
        self,
        inputs: Mapping[str, np.ndarray],
        outputs: Mapping[str, np.ndarray] | None = None,
        replica_id: int | None = None,
        timeout: float | None = None,
    ) -> dict[str, np.ndarray]: ...
    def get_execute_inputs(self) -> list[DataDesc]: ...
    def get_execute_outputs(self) -> list[DataDesc]: ...
    def replica_status(self) -> list[ReplicaStatus]: ...
    @property
    def is_ready(self) -> bool: ...
    async def get_monitoring_statistics_total_count(
        self, replica_id: int = 0
    ) -> dict[str, float]: ...
    async def get_monitoring_statistics_mean(self, replica_id: int = 0) -> dict[str, float]: ...


#: Builds a (not yet started) runner for an executable file.
RunnerFactory = Callable[[Path, ModelRunnerConfig], RunnerLike]


def _default_factory(path: Path, config: ModelRunnerConfig) -> RunnerLike:
    from model_runtime.runner import ModelRunner  # the runner sits above the server's imports

    return ModelRunner(path, config)


class ModelState(enum.Enum):
    """Repository states (names from the protocol's repository extension)."""

    UNAVAILABLE = "UNAVAILABLE"
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"


@dataclass(slots=True)
class ModelStats:
    """Counters the daemon keeps per model (the protocol's statistics extension)."""

    success_count: int = 0
    success_ns: int = 0
    fail_count: int = 0
    fail_ns: int = 0
    inference_count: int = 0
    last_inference_ms: int = 0

    def record(self, ok: bool, duration_ns: int, samples: int) -> None:
        """Count one finished request."""
        if ok:
            self.success_count += 1
            self.success_ns += duration_ns
            self.inference_count += samples
        else:
            self.fail_count += 1
            self.fail_ns += duration_ns
        self.last_inference_ms = time.time_ns() // 1_000_000


@dataclass(slots=True)
class ModelEntry:
    """One model the repository knows, loaded or not."""

    name: str
    source: Path
    state: ModelState = ModelState.UNAVAILABLE
    reason: str = ""
    runner: RunnerLike | None = None
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    datatypes: dict[str, str] = field(default_factory=dict)
    stats: ModelStats = field(default_factory=ModelStats)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    stop: anyio.Event | None = None

    @property
    def is_ready(self) -> bool:
        """True when loaded and at least one replica is ready."""
        return self.state is ModelState.READY and self.runner is not None and self.runner.is_ready


def parse_model_arg(arg: str) -> tuple[str, Path]:
    """Split a ``NAME=PATH`` or ``PATH`` command-line model into its name and path.

    Raises:
        InputValidationError: the name is not a valid model name or the suffix is unknown.
    """
    name, eq, path = arg.partition("=")
    p = Path(path if eq else arg)
    if not eq:
        name = p.stem
    if not _NAME.fullmatch(name) or ".." in name:
        raise InputValidationError(f"invalid model name {name!r} (letters, digits, _ . -)")
    if p.suffix not in SUFFIXES:
        raise InputValidationError(f"model {str(p)!r} must be an .mrx or .onnx file")
    return name, p


def replica_states(runner: object) -> list[Any]:
    """The runner's per-replica state objects (status, device_id, runs, resets, ``changed``
    event); [] for a runner without replicas (a test's stand-in)."""
    fn = getattr(runner, "replica_states", None)
    return list(fn()) if callable(fn) else []


async def _first_of(events: Sequence[anyio.Event]) -> None:
    """Return when any of ``events`` is set."""
    async with anyio.create_task_group() as tg:

        async def wait(event: anyio.Event) -> None:
            await event.wait()
            tg.cancel_scope.cancel()

        for event in events:
            tg.start_soon(wait, event)


def _specs(descs: Sequence[DataDesc], axis: int) -> tuple[TensorSpec, ...]:
    out = []
    for d in descs:
        shape = list(d.shape)
        if 0 <= axis < len(shape):
            shape[axis] = -1
        try:
            datatype = datatype_of(d.dtype)
        except ValueError as exc:
            raise InvalidExecutableError(f"tensor {d.name!r}: {exc}") from None
        out.append(TensorSpec(d.name, datatype, tuple(shape)))
    return tuple(out)


class ModelRepository:
    """Named models and their runners; loads, unloads and indexes them.

    Use as ``async with ModelRepository(...) as repo``: runners are clients of the runtime's
    tree, started by a load and closed by an unload from whichever task asks; the repository's
    task group only watches their readiness. ``compile_source`` turns an ``.onnx`` path into
    an ``.mrx`` path (it runs in a worker thread); ``runner_factory`` builds runners (tests
    pass fakes).
    """

    def __init__(
        self,
        config: ModelRunnerConfig,
        *,
        directory: Path | None = None,
        compile_source: Callable[[Path], Path] | None = None,
        runner_factory: RunnerFactory | None = None,
    ) -> None:
        self.config = config
        self.directory = directory.resolve() if directory is not None else None
        self._compile = compile_source
        self._factory = runner_factory or _default_factory
        self._models: dict[str, ModelEntry] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        #: Called with (model, ready) whenever a loaded model's readiness changes.
        self.on_readiness: Callable[[str, bool], None] | None = None

    async def __aenter__(self) -> ModelRepository:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        """Close every runner, then the task group that hosts them."""
        await self.close_all()
        tg, self._tg = self._tg, None
        if tg is not None:
            tg.cancel_scope.cancel()
            await tg.__aexit__(None, None, None)

    # -- lookup ------------------------------------------------------------------------------

    def add(self, name: str, source: Path) -> ModelEntry:
        """Register a model by name (not loaded).

        Raises:
            InputValidationError: the name is already taken by another file.
        """
        entry = self._models.get(name)
        if entry is not None and entry.source != source:
            raise InputValidationError(f"two models are named {name!r}: {entry.source}, {source}")
        if entry is None:
            entry = self._models[name] = ModelEntry(name, source)
        return entry

    def scan(self) -> list[str]:
        """Register every model file of the repository directory; return their names."""
        if self.directory is None:
            return []
        names = set()
        for path in self.directory.iterdir():
            if path.suffix in SUFFIXES and _NAME.fullmatch(path.stem):
                found = self._resolve(path.stem)
                if found is not None and path.stem not in self._models:
                    self.add(path.stem, found)
                if path.stem in self._models:
                    names.add(path.stem)
        return sorted(names)

    def _resolve(self, name: str) -> Path | None:
        """The file of ``name`` inside the repository directory (``.mrx`` first), or None."""
        assert self.directory is not None
        for suffix in SUFFIXES:
            candidate = (self.directory / f"{name}{suffix}").resolve()
            if candidate.parent == self.directory and candidate.is_file():
                return candidate
        return None

    def get(self, name: str) -> ModelEntry:
        """The model called ``name``.

        Raises:
            ModelNotFoundError: no such model.
        """
        entry = self._models.get(name)
        if entry is None:
            raise ModelNotFoundError(f"unknown model {name!r}")
        return entry

    def entries(self) -> list[ModelEntry]:
        """Every known model, by name."""
        return [self._models[n] for n in sorted(self._models)]

    def index(self) -> list[dict[str, str]]:
        """The repository index (protocol repository extension)."""
        self.scan()
        return [
            {"name": e.name, "version": "1", "state": e.state.value, "reason": e.reason}
            for e in self.entries()
        ]

    # -- load / unload -------------------------------------------------------------------------

    def _lookup_for_load(self, name: str) -> ModelEntry:
        if not _NAME.fullmatch(name) or ".." in name:
            raise InputValidationError(f"invalid model name {name!r}")
        entry = self._models.get(name)
        if entry is not None:
            return entry
        found = self._resolve(name) if self.directory is not None else None
        if found is None:
            raise ModelNotFoundError(f"no model {name!r} in the model repository")
        return self.add(name, found)

    async def load(self, name: str) -> ModelEntry:
        """Load (or reload) ``name``: compile if needed, start its runner.

        Raises:
            InputValidationError: ``name`` is not a valid model name (path tricks included).
            ModelNotFoundError: no such model.
            ModelRuntimeError: compiling or starting failed (the entry records the reason).
        """
        entry = self._lookup_for_load(name)
        async with entry.lock:
            if entry.runner is not None:
                await self._close(entry)
            entry.state, entry.reason = ModelState.LOADING, ""
            try:
                await self._start(entry)
            except Exception as exc:
                entry.state, entry.reason = ModelState.UNAVAILABLE, f"load failed: {exc}"
                log.error("model_load_failed", model=name, error=str(exc))
                raise
            entry.state = ModelState.READY
        log.info("model_loaded", model=name, source=str(entry.source))
        return entry

    async def _start(self, entry: ModelEntry) -> None:
        path = entry.source
        if path.suffix == ".onnx":
            if self._compile is None:
                raise ModelRuntimeError(f"cannot compile {path}: no compiler configured")
            compile_source = self._compile
            path = await anyio.to_thread.run_sync(lambda: compile_source(entry.source))
        if self._tg is None:
            raise ModelRuntimeError("the model repository is not open (use `async with`)")
        # A runner is a client of the runtime's tree: started here, closed by whichever task
        # unloads it. The repository hosts nothing but the readiness watchers.
        config = replace(self.config, replica_to_save_programs_outputs={})
        runner = self._factory(path, config)
        await runner.start()
        axis = config.batching_dim if config.batching_dim is not None else 0
        entry.inputs = _specs(runner.get_execute_inputs(), axis)
        entry.outputs = _specs(runner.get_execute_outputs(), axis)
        entry.datatypes = {s.name: s.datatype for s in entry.outputs}
        entry.runner, entry.stop = runner, anyio.Event()
        self._tg.start_soon(self._watch_readiness, entry, runner, entry.stop)

    async def _watch_readiness(
        self, entry: ModelEntry, runner: RunnerLike, stop: anyio.Event
    ) -> None:
        """Log (and report to ``on_readiness``) every change of the model's readiness, however
        short: each replica's state sets an event on every status change."""
        states = replica_states(runner)
        ready = runner.is_ready
        while states and not stop.is_set():
            await _first_of([*(s.changed for s in states), stop])
            now = runner.is_ready
            if now != ready and not stop.is_set():
                ready = now
                statuses = [s.value for s in runner.replica_status()]
                log.info("model_readiness_changed", model=entry.name, ready=now, replicas=statuses)
                if self.on_readiness is not None:
                    self.on_readiness(entry.name, now)

    async def unload(self, name: str) -> None:
        """Drain and stop ``name``'s runner (in-flight requests finish first).

        Raises:
            ModelNotFoundError: no such model.
        """
        entry = self.get(name)
        async with entry.lock:
            await self._close(entry)
        log.info("model_unloaded", model=name)

    async def _close(self, entry: ModelEntry) -> None:
        runner = entry.runner
        if runner is None:
            return
        entry.state = ModelState.UNLOADING
        if entry.stop is not None:
            entry.stop.set()
        try:
            await runner.close()
        except Exception as exc:
            log.error("model_close_failed", model=entry.name, error=str(exc))
        finally:
            entry.runner = entry.stop = None
            entry.state, entry.reason = ModelState.UNAVAILABLE, "unloaded"

    async def close_all(self) -> None:
        """Unload every model (runs save programs per the config); never raises."""
        for entry in self.entries():
            try:
                async with entry.lock:
                    await self._close(entry)
            except Exception as exc:
                log.error("model_close_failed", model=entry.name, error=str(exc))

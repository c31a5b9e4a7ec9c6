"""The daemon's model repository: named models, each served by its own ModelRunner.

Which models there are and where their files are is :class:`ModelCatalogue`'s (names,
directories, the index); :class:`ModelRepository` adds their runners. Per-model settings
override the server-wide ones; an ``.onnx`` model is compiled on load through the executable
cache, for its configured batch, else the batch it fixes itself, else the server's.

Each model loads, fails, reloads and unloads on its own (Triton's per-model availability):

- A model that fails to load is ``UNAVAILABLE`` with the reason in the index; the others serve.
- A reload loads and warms the new version *beside* the serving one, then swaps it in with one
  assignment (:class:`ServingRunner`): a request goes whole to the old version or to the new,
  the old one drains what it took, then closes. A failed reload leaves the old one serving and
  says why (``failed to load '<name>': ...``, Triton's wording). The new version needs its own
  devices while the old one holds its own: a reload waits up to ``reload_device_wait`` seconds
  for them (another reload's old version frees its devices as it retires), then fails.
- Model control modes are Triton's (:class:`ControlMode`): the repository API may load and
  unload only in ``explicit`` mode; ``poll`` mode follows the files (:meth:`poll`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TypeVar

import anyio
import anyio.abc
import structlog

from model_runtime.errors import ModelControlError, ModelLoadError, ModelRuntimeError
from model_runtime.runner_config import ModelRunnerConfig
from model_runtime.server.ensemble import StepCaller
from model_runtime.server.repository.catalogue import ModelCatalogue
from model_runtime.server.repository.ensembles import ensemble_users, start_ensemble_version
from model_runtime.server.repository.entries import ControlMode, ModelEntry, ModelState, ModelStats
from model_runtime.server.repository.lifecycle import (
    close_versions,
    detached,
    install,
    load_failed,
    retire,
    watch_readiness,
    why_failed,
)
from model_runtime.server.repository.python import PythonHooks, start_python_version
from model_runtime.server.repository.versions import StartedVersion, start_version
from model_runtime.server.repository.warmup import warm_up_or_close
from model_runtime.server.serving import (
    RunnerFactory,
    RunnerLike,
    default_factory,
)
from model_runtime.server.triton.config import parse_override
from model_runtime.server.triton.fields import check_complete
from model_runtime.server.triton.layout import fingerprint as _fingerprint, plan_model
from model_runtime.server.triton.settings import ModelSettings

__all__ = ["ModelRepository"]

log = structlog.get_logger(__name__)

_T = TypeVar("_T")


class ModelRepository(ModelCatalogue):
    """Named models and their runners; loads, reloads, unloads, polls and indexes them.

    Use as ``async with ModelRepository(...) as repo``: runners are clients of the runtime's
    tree, started by a load and closed by an unload from whichever task asks; the repository's
    task group only watches their readiness. ``compile_source`` turns an ``.onnx`` path into
    an ``.mrx`` path (it runs in a worker thread), ``compile_source(path, batch_size)`` for a
    model whose batch is its own; ``runner_factory`` builds runners (tests
    pass fakes). ``control_mode`` governs :meth:`client_load` / :meth:`client_unload` only
    (a repository built in code is controlled by its code: ``EXPLICIT``; the daemon passes its
    ``--model-control-mode``, default ``none``). ``strict_readiness`` and ``starting`` decide
    :meth:`not_ready_reason`. ``more_directories``: further repository directories (Triton's
    repeated ``--model-repository``; a name in two of them is refused). ``auto_complete``
    off: a model directory's config must give its inputs and outputs.
    """

    def __init__(
        self,
        config: ModelRunnerConfig,
        *,
        directory: Path | None = None,
        more_directories: Sequence[Path] = (),
        compile_source: Callable[..., Path] | None = None,
        runner_factory: RunnerFactory | None = None,
        control_mode: ControlMode = ControlMode.EXPLICIT,
        strict_readiness: bool = True,
        reload_device_wait: float = 10.0,
        auto_complete: bool = True,
    ) -> None:
        super().__init__(
            directory=directory,
            more_directories=more_directories,
            strict_readiness=strict_readiness,
        )
        self.config = config
        self.control_mode = control_mode
        #: Triton's auto-complete: off, a model directory's config must describe the model.
        self.auto_complete = auto_complete
        self.reload_device_wait = reload_device_wait
        self._compile = compile_source
        self._factory = runner_factory or default_factory
        self._tg: anyio.abc.TaskGroup | None = None
        #: Called with (model, ready) whenever a loaded model's readiness changes.
        self.on_readiness: Callable[[str, bool], None] | None = None
        #: Awaited with (model, version, runner) just before a runner that served closes (a
        #: reload swapped it out, or an unload): the last chance to read what it ran. Its
        #: errors are logged; the runner closes anyway.
        self.on_retire: Callable[[str, str, RunnerLike], Awaitable[None]] | None = None
        #: Called with the entry each time a version is installed (it serves from now on).
        self.on_install: Callable[[ModelEntry], None] | None = None
        #: How python models reach the daemon (BLS, model loading); the data plane sets them.
        self.python_hooks = PythonHooks()
        #: How an ensemble's steps run (through the data plane, which sets it).
        self.ensemble_call: StepCaller | None = None
        #: where python models' archived environments (EXECUTION_ENV_PATH) are unpacked
        self.python_env_cache: Path | None = None

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

    # -- the repository API (control modes) ------------------------------------------------------

    def _check_control(self, action: str) -> None:
        """Refuse a client's load or unload outside ``explicit`` mode, in Triton's words (it
        says "polling" for its ``none`` mode too)."""
        if self.control_mode is not ControlMode.EXPLICIT:
            raise ModelControlError(
                "explicit model load / unload is not allowed if polling is enabled"
            )

    async def client_load(self, name: str, config: str | None = None) -> ModelEntry:
        """A load asked through the repository API: :meth:`load`, in ``explicit`` mode only.
        ``config``: Triton's configuration override (a ``ModelConfig`` in JSON) for this load.

        Raises:
            ModelControlError: the control mode is not ``explicit``.
            InputValidationError, UnknownModelError, ModelLoadError: as :meth:`load`.
        """
        self._check_control("load")
        return await detached(self._tg, self.load(name, config))

    async def client_unload(self, name: str, dependents: bool = False) -> None:
        """An unload asked through the repository API: :meth:`unload`, in ``explicit`` mode only;
        ``dependents`` (Triton's ``unload_dependents``): an ensemble's composing models too,
        those no other loaded ensemble runs.

        Raises:
            ModelControlError: the control mode is not ``explicit``.
            UnknownModelError: no such model.
        """
        self._check_control("unload")
        await detached(self._tg, self._unload_with(name, dependents))

    async def _unload_with(self, name: str, dependents: bool) -> None:
        settings = self.get(name).settings
        await self.unload(name)
        ensemble = settings.ensemble if settings is not None and dependents else None
        for model in ensemble.models if ensemble is not None else ():
            if model in self._models and not ensemble_users(self._models.values(), model):
                await self.unload(model)

    # -- load / reload / unload ------------------------------------------------------------------

    async def load(self, name: str, config: str | None = None) -> ModelEntry:
        """Load ``name``, or reload it beside the serving version and swap atomically.

        Compiles an ``.onnx`` file, starts (and warms) a runner, then makes it the one that
        serves; a version that was serving drains its requests and closes after the swap, so
        no request is refused. On failure a serving version keeps serving. ``config``: a
        configuration override (Triton's ``ModelConfig`` in JSON) used instead of the model's
        ``config.pbtxt`` / TOML for this load (a later load without one reads the files);
        an invalid one fails the load like a bad ``config.pbtxt``.

        Raises:
            ProtocolError: ``name`` is empty or has a path in it (Triton's words).
            UnknownModelError: no such model (Triton's wording).
            ModelLoadError: compiling or starting failed; the entry records the reason.
        """
        entry = self._lookup_for_load(name)
        entry.wanted = True
        async with entry.lock:
            await self._load_locked(entry, config)
        return entry

    async def ensure_loaded(self, name: str) -> ModelEntry:
        """``name``, loaded unless it is already (an ensemble's composing model, a model
        the start loads that an ensemble loaded first).

        Raises:
            as :meth:`load`.
        """
        entry = self._lookup_for_load(name)
        entry.wanted = True
        async with entry.lock:
            if entry.runner is None:
                await self._load_locked(entry)
        return entry

    async def _load_locked(self, entry: ModelEntry, config: str | None = None) -> None:
        serving = entry.runner
        source = self._source_now(entry)
        fingerprint = None if source is None else _fingerprint(source)
        if config is not None:
            fingerprint = None  # not the files' settings: a poll would load the files again
        if serving is None:
            entry.state, entry.reason = ModelState.LOADING, ""
        started: dict[str, StartedVersion] = {}
        try:
            if source is None:
                raise ModelLoadError(entry.name, f"its file {entry.source} is gone")
            override = None if config is None else parse_override(config, entry.name)
            plan = await anyio.to_thread.run_sync(plan_model, entry.name, source, override)
            if not self.auto_complete and plan.settings.triton:
                where = plan.settings.source or plan.settings.origin or entry.name
                check_complete(plan.settings.config, where)
            for version, path in plan.files.items():  # highest first
                started[version] = await self._start_version(
                    entry, path, plan.settings, beside=serving is not None, version=version
                )
        except Exception as exc:
            await self._close_started(entry.name, started)
            load_failed(entry, exc, fingerprint)
            if isinstance(exc, ModelLoadError):
                raise
            raise ModelLoadError(entry.name, why_failed(exc, entry), exc) from exc
        except BaseException:  # cancelled: as if it had not been asked
            await self._close_started(entry.name, started)
            if serving is None:
                entry.state, entry.reason = ModelState.UNAVAILABLE, "load cancelled"
            raise
        assert source is not None
        entry.source, entry.fingerprint, entry.settings = source, fingerprint, plan.settings
        before = [entry, *entry.versions.values()]
        # (version, runner) now: the swap may change which version an entry serves.
        old = [(e.version, e.runner.current) for e in before if e.runner is not None]
        old_stops = [e.stop for e in before if e.stop is not None]
        stats = {e.version: e.stats for e in before}
        # The swap: everything a request reads about the model changes in this one step.
        top, *rest = started
        others = {}
        for version in rest:
            other = entry.versions.get(version) or ModelEntry(
                entry.name, plan.files[version], version=version, wanted=True
            )
            other.settings = plan.settings
            self._install(other, version, started[version], stats)
            others[version] = other
        for version, gone in entry.versions.items():
            if version not in others:
                gone.runner = gone.stop = gone.served = gone.sequences = None
                gone.state, gone.reason = ModelState.UNAVAILABLE, "version no longer served"
        self._install(entry, top, started[top], stats)
        entry.versions = others
        entry.loads += 1
        log.info(
            "model_loaded",
            model=entry.name,
            source=str(source),
            versions=entry.served_versions(),
            load=entry.loads,
        )
        for stop in old_stops:
            stop.set()
        with anyio.CancelScope(shield=True):  # what the old ones took gets its answers
            for version, runner in old:
                await retire(entry.name, runner, version, self.on_retire)

    def _install(
        self, entry: ModelEntry, version: str, new: StartedVersion, stats: dict[str, ModelStats]
    ) -> None:
        """Make ``new`` the runner ``entry`` serves ``version`` with (no await: one step),
        its readiness watched from now on."""
        assert self._tg is not None
        stop = anyio.Event()
        self._tg.start_soon(watch_readiness, entry, new.runner, stop, self._readiness_changed)
        install(entry, version, new, stats, stop)
        if self.on_install is not None:
            self.on_install(entry)

    def _readiness_changed(self, name: str, ready: bool) -> None:
        if self.on_readiness is not None:
            self.on_readiness(name, ready)

    async def _close_started(self, name: str, started: dict[str, StartedVersion]) -> None:
        """Close the versions a failed or cancelled load had started already."""
        with anyio.CancelScope(shield=True):
            for version in started.values():
                await retire(name, version.runner, None, None)  # never served: no report

    async def _start_version(
        self,
        entry: ModelEntry,
        source: Path,
        settings: ModelSettings,
        *,
        beside: bool,
        version: str = "1",
    ) -> StartedVersion:
        if self._tg is None:
            raise ModelRuntimeError("the model repository is not open (use `async with`)")
        for note in settings.notes:
            log.info("config_field_not_applied", model=entry.name, version=version, note=note)
        if settings.ensemble is not None:  # nothing of its own to warm up
            return await start_ensemble_version(
                entry, settings, load=self.ensure_loaded, call=self.ensemble_call, composing=self
            )
        if settings.python:
            started = await start_python_version(
                entry,
                source,
                settings,
                hooks=self.python_hooks,
                version=version,
                auto_complete=self.auto_complete,
                env_cache=self.python_env_cache,
            )
        else:
            started = await start_version(
                entry,
                source,
                settings,
                defaults=self.config,
                compile_source=self._compile,
                factory=self._factory,
                reload_device_wait=self.reload_device_wait if beside else None,
                version=version,
            )
        await warm_up_or_close(started.runner, settings, entry.name, version)  # before ready
        return started

    async def unload(self, name: str) -> None:
        """Drain and stop ``name``'s runner (in-flight requests finish first).

        Raises:
            UnknownModelError: no such model.
        """
        entry = self.get(name)
        entry.wanted = False
        async with entry.lock:
            await close_versions(entry, self.on_retire)
        log.info("model_unloaded", model=name)

    async def close_all(self) -> None:
        """Unload every model (runs save programs per the config); never raises."""
        for entry in self._models_by_name():
            try:
                async with entry.lock:
                    await close_versions(entry, None)
            except Exception as exc:
                log.error("model_close_failed", model=entry.name, error=str(exc))

    # -- poll --------------------------------------------------------------------------------

    async def poll(self) -> None:
        """One pass of ``poll`` mode: load models whose files appeared, reload those whose
        files changed since they were last loaded (or tried), unload those whose files are
        gone (a directory model then leaves the index). A failed load is logged and kept in
        the index; the poll goes on with the next model.

        Raises:
            nothing: an unreadable directory is logged and the pass skipped.
        """
        try:
            self.scan()
        except OSError as exc:
            log.error("repository_poll_failed", error=str(exc))
            return
        for entry in self._models_by_name():
            source = self._source_now(entry)
            if source is None:
                await self._poll_removed(entry)
                continue
            if source == entry.source and _fingerprint(source) == entry.fingerprint:
                continue
            log.info("repository_change", model=entry.name, source=str(source))
            try:
                await self.load(entry.name)
            except ModelRuntimeError:
                pass  # logged by load; the index has the reason

    async def _poll_removed(self, entry: ModelEntry) -> None:
        if entry.runner is not None or entry.wanted:
            log.info("repository_change", model=entry.name, source=None)
            await self.unload(entry.name)
        entry.fingerprint = None
        if entry.in_directory and entry.runner is None and self._models.get(entry.name) is entry:
            del self._models[entry.name]

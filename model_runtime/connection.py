"""Device connection types and the runtime configuration (seed 004, 001; DESIGN.md §8).

When is a device attached, relative to compiling? :class:`DeviceConnectionType` says:

* ``ALWAYS``: attach, then compile. Execution runs on the device attached first.
* ``ON_DEMAND``: compile; attach when the first execution needs the device.
* ``PRE_COMPILE``: never attach; compile into the executable cache (a cache path is required),
  log ``A pre-compiled program has been saved to <path>``; executions return zeros of the
  outputs' shapes and dtypes. Copy the cache to a machine with devices and run there with the
  same ``executable_cache_path``: the executables are found, not compiled again.
* ``NEVER``: never attach; compile only. Executing raises :class:`CompilationOnlyError`.

:func:`configure` sets the process-wide :class:`RuntimeConfiguration`; an
:class:`OnnxProgram` (an ONNX model compiled through the cache and run per the connection type)
takes the process values unless given its own.
"""

from __future__ import annotations

import enum
import os
import tempfile
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any

import anyio
import numpy as np
import onnx
import structlog

from actors.device.manager import AttachedDevice, DeviceManager
from actors.device.wait import DeviceWaitConfig
from model_runtime import custom_ops
from model_runtime.compiler import CompileOptions, ExecutableCache, cache_key, compile_model
from model_runtime.compiler.source import ModelLike, load_source
from model_runtime.errors import (
    ConfigurationError,
    DeviceUnavailableError,
    InputValidationError,
    RunnerStoppedError,
)
from model_runtime.executable import Executable
from model_runtime.flags import get_flags
from model_runtime.runner import ModelRunner, ModelRunnerConfig

__all__ = [
    "CompilationOnlyError",
    "DeviceConnectionType",
    "OnnxProgram",
    "RuntimeConfiguration",
    "compile_and_run",
    "configure",
    "get_configuration",
]

log = structlog.get_logger(__name__)


class DeviceConnectionType(enum.Enum):
    """When a device is attached relative to compiling (seed: ``device_connection.type``)."""

    ALWAYS = "ALWAYS"
    ON_DEMAND = "ON_DEMAND"
    PRE_COMPILE = "PRE_COMPILE"
    NEVER = "NEVER"

    @classmethod
    def parse(cls, value: DeviceConnectionType | str) -> DeviceConnectionType:
        """``value`` as a connection type (case-insensitive name).

        Raises:
            ConfigurationError: an unknown name; the message lists the valid ones.
        """
        if isinstance(value, DeviceConnectionType):
            return value
        try:
            return cls[str(value).strip().upper()]
        except KeyError:
            valid = ", ".join(m.name for m in cls)
            raise ConfigurationError(
                f"unknown device connection type {value!r}; use one of {valid}"
            ) from None


class CompilationOnlyError(DeviceUnavailableError):
    """Execution was asked of a runtime configured for compilation only (``NEVER``)."""


@dataclass(frozen=True, slots=True)
class RuntimeConfiguration:
    """Process-wide runtime settings (see :func:`configure`)."""

    connection_type: DeviceConnectionType = DeviceConnectionType.ALWAYS
    #: ``None``: use ``MODEL_RUNTIME_FLAGS=--executable_cache_path=DIR`` if set.
    executable_cache_path: str | None = None
    #: Custom op libraries that may be imported (plus ``MODEL_RUNTIME_CUSTOM_OP_ALLOW``).
    custom_op_libraries: tuple[str, ...] = ()

    def cache_path(self) -> str | None:
        """The cache directory in effect: this configuration's, else ``MODEL_RUNTIME_FLAGS``'s.

        Raises:
            ConfigurationError: ``MODEL_RUNTIME_FLAGS`` does not parse.
        """
        return self.executable_cache_path or get_flags().executable_cache_path


_lock = threading.Lock()
_config = RuntimeConfiguration()


def check_cache_path(path: str | os.PathLike[str]) -> str:
    """Create the cache directory if needed and prove it is writable; return it as a string.

    Raises:
        ConfigurationError: it cannot be created or written; the message says what to do.
    """
    directory = Path(path)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".write-test-"):
            pass
    except OSError as exc:
        raise ConfigurationError(
            f"executable cache path {str(directory)!r} is not a writable directory "
            f"({exc.strerror or exc}); choose one you can write, e.g. "
            "MODEL_RUNTIME_FLAGS='--executable_cache_path=/tmp/model-runtime-cache'"
        ) from exc
    return str(directory)


def configure(
    *,
    connection_type: DeviceConnectionType | str | None = None,
    executable_cache_path: str | os.PathLike[str] | None = None,
    custom_op_libraries: Iterable[str] | None = None,
) -> RuntimeConfiguration:
    """Set the process-wide runtime configuration; arguments left out keep their values.

    Returns the new configuration.

    Raises:
        ConfigurationError: an unknown connection type, a cache path that cannot be written,
            or a custom op library name that is not a module name.
    """
    global _config
    with _lock:
        new = _config
        if connection_type is not None:
            new = replace(new, connection_type=DeviceConnectionType.parse(connection_type))
        if executable_cache_path is not None:
            new = replace(new, executable_cache_path=check_cache_path(executable_cache_path))
        if custom_op_libraries is not None:
            names = tuple(custom_op_libraries)
            custom_ops.set_allowed_libraries(names)
            new = replace(new, custom_op_libraries=names)
        _config = new
        return new


def get_configuration() -> RuntimeConfiguration:
    """The process-wide runtime configuration now."""
    return _config


class _HeldDeviceManager(DeviceManager):
    """Hands the runner the device attached earlier (ALWAYS attaches before compiling)."""

    def __init__(self, base: DeviceManager, held: AttachedDevice) -> None:
        super().__init__(base.inventory, lock_dir=base.lock_dir, clock=base.clock)
        self._held: AttachedDevice | None = held

    async def get_device_for(
        self,
        executable: Executable,
        wait_config: DeviceWaitConfig = DeviceWaitConfig(),  # noqa: B008 (frozen)
    ) -> AttachedDevice:
        held, self._held = self._held, None
        if held is not None and held.is_attached:
            return held
        return await super().get_device_for(executable, wait_config)


def _load_proto(model: ModelLike) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, bytes):
        return onnx.load_model_from_string(model)
    return onnx.load_model(os.fspath(model), load_external_data=False)


class OnnxProgram:
    """An ONNX model compiled through the executable cache and run per a connection type.

    Use as ``async with OnnxProgram(model, options) as program: await program.run(inputs)``.
    ``connection_type`` and ``executable_cache_path`` default to the process configuration
    (:func:`configure`); ``runner_config`` configures the runner that executes it.
    """

    def __init__(
        self,
        model: ModelLike,
        options: CompileOptions | None = None,
        *,
        connection_type: DeviceConnectionType | str | None = None,
        executable_cache_path: str | os.PathLike[str] | None = None,
        runner_config: ModelRunnerConfig | None = None,
        device_manager: DeviceManager | None = None,
        wait_config: DeviceWaitConfig | None = None,
    ) -> None:
        """Describe the program; nothing is compiled or attached until :meth:`start`.

        Raises:
            ConfigurationError: an unknown connection type.
        """
        config = get_configuration()
        self.connection_type = DeviceConnectionType.parse(
            connection_type if connection_type is not None else config.connection_type
        )
        self._explicit_cache = executable_cache_path
        self._model = model
        self._options = options or CompileOptions()
        self._runner_config = runner_config
        self._manager = device_manager
        self._wait = wait_config or DeviceWaitConfig()
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._runner: ModelRunner | None = None
        self._start_lock = anyio.Lock()
        self.executable: Executable | None = None
        self.path: Path | None = None

    @property
    def name(self) -> str:
        """The model's name in logs."""
        if self.executable is not None:
            return self.executable.metadata.model_name
        return self._options.model_name or "model"

    async def __aenter__(self) -> OnnxProgram:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def start(self) -> None:
        """Attach (ALWAYS) and compile, in the order the connection type promises.

        Raises:
            ConfigurationError: PRE_COMPILE without a cache path, or an unwritable cache path.
            CustomOpError: PRE_COMPILE of a model with a custom op not marked hashable
                (named), or a custom op library error. With a cache and another type, such a
                model is compiled without the cache (warning ``executable not cached``).
            CompileError: the model cannot be compiled.
            DeviceUnavailableError / DeviceNotFoundError: ALWAYS and no device can be attached.
        """
        ct = self.connection_type
        cache = self._explicit_cache or get_configuration().cache_path()
        if ct is DeviceConnectionType.PRE_COMPILE and not cache:
            raise ConfigurationError(
                "DeviceConnectionType.PRE_COMPILE saves executables to the executable cache, and "
                "no cache path is set: set MODEL_RUNTIME_FLAGS='--executable_cache_path=DIR' or "
                "call model_runtime.configure(executable_cache_path=DIR)"
            )
        if cache:
            cache = check_cache_path(cache)
            # Seed 001: an unhashable custom op cannot be pre-compiled (refuse before doing any
            # work); with the other types it compiles and runs, only not through the cache.
            if ct is DeviceConnectionType.PRE_COMPILE:
                proto = _load_proto(self._model)
                if custom_ops.custom_op_nodes(proto):
                    custom_ops.check_cacheable(proto, "pre-compiled")
        device = None
        if ct is DeviceConnectionType.ALWAYS:
            device = await self._attach()
        try:
            await self._compile(cache)
            if ct is DeviceConnectionType.PRE_COMPILE:
                log.info(f"A pre-compiled program has been saved to {self.path}")
            if device is not None:
                await self._start_runner(device)
        except BaseException:
            if device is not None and self._runner is None:
                device.detach()
            raise

    async def _attach(self) -> AttachedDevice:
        self._manager = self._manager or DeviceManager()
        opts = self._options
        if opts.target == "ipu-model":
            device = self._manager.create_ipu_model_device(1, opts.ipu_version, opts.tiles_per_ipu)
        else:
            device = await self._manager.get_device(1, None, self._wait, kind=opts.target)
        desc = device.spec.describe()  # "device 0 (cpu, 1 thread)"
        log.info(f"{desc[:1].upper()}{desc[1:]} attached to model {self.name!r}")
        return device

    async def _compile(self, cache: str | None) -> None:
        options = replace(self._options, executable_cache_path=cache)
        model = self._model
        hit = False
        uncached = False  # a cache is set but the model cannot use it
        out: Path | None = None
        if cache:
            source = await anyio.to_thread.run_sync(load_source, model, options.model_name)
            # as compile_model computes it: custom-op models are keyed by their libraries too
            usable = custom_ops.cacheability(source.proto)
            uncached = not usable.cacheable
            if usable.cacheable:
                key = cache_key(source.sha256, options, usable.fingerprint)
                hit = ExecutableCache(Path(cache)).lookup(key) is not None
        if not cache or uncached:
            # compile_model compiles an unhashable custom op model without the cache (and warns
            # "executable not cached" with the reason), so it needs a file of its own.
            self._tmp = tempfile.TemporaryDirectory(prefix="model-runtime-program-")
            out = Path(self._tmp.name) / "program.mrx"
        path = await anyio.to_thread.run_sync(lambda: compile_model(model, out, options))
        self.path = path
        self.executable = await anyio.to_thread.run_sync(Executable.load, path)
        if hit:
            log.info(f"Found model {self.name!r} in the executable cache", path=str(path))
        elif uncached:
            log.info(f"Compiled model {self.name!r} (not cached)", path=str(path))
        else:
            log.info(f"Compiled model {self.name!r}", path=str(path))

    async def _start_runner(self, device: AttachedDevice) -> None:
        assert self.executable is not None and self._manager is not None
        runner = ModelRunner(
            self.executable,
            self._runner_config or ModelRunnerConfig(),
            device_manager=_HeldDeviceManager(self._manager, device),
        )
        try:
            await runner.start()
        except BaseException:
            device.detach()
            raise
        self._runner = runner

    async def run(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Execute the program on ``inputs`` (ON_DEMAND attaches at the first call).

        Raises:
            CompilationOnlyError: the connection type is NEVER.
            RunnerStoppedError: not started, or closed.
            InputValidationError: the inputs do not fit the model.
            DeviceUnavailableError: ON_DEMAND and no device can be attached.
            RuntimeFailure: the device failed.
        """
        ct = self.connection_type
        if ct is DeviceConnectionType.NEVER:
            raise CompilationOnlyError(
                f"model {self.name!r} cannot be executed: the runtime is configured for "
                "compilation only (DeviceConnectionType.NEVER). Use ALWAYS or ON_DEMAND to run it"
            )
        if self.executable is None:
            raise RunnerStoppedError("the program is not started: use `async with` or start()")
        if ct is DeviceConnectionType.PRE_COMPILE:
            return self._zeros(inputs)
        if self._runner is None:
            async with self._start_lock:
                if self._runner is None:
                    await self._start_runner(await self._attach())
        assert self._runner is not None
        arrays = {k: np.asarray(v) for k, v in inputs.items()}
        return await self._runner.execute(arrays)

    def _zeros(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        assert self.executable is not None
        meta = self.executable.metadata
        first = meta.user_inputs[0]
        given = inputs.get(first.name)
        if given is None:
            raise InputValidationError(f"model {self.name!r}: input {first.name!r} is missing")
        bd = first.batch_dim
        scale = 1
        if bd is not None and np.ndim(given) > bd and first.shape[bd]:
            scale = max(1, int(np.shape(given)[bd]) // first.shape[bd])
        out = {}
        for a in meta.user_outputs:
            shape = list(a.shape)
            if a.batch_dim is not None and a.batch_dim < len(shape):
                shape[a.batch_dim] *= scale
            out[a.name] = np.zeros(shape, dtype=a.dtype)
        return out

    async def close(self) -> None:
        """Stop the runner, detach the device, remove temporary files. Idempotent."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.close()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


async def compile_and_run(
    model: ModelLike,
    inputs: Mapping[str, Any],
    options: CompileOptions | None = None,
    *,
    connection_type: DeviceConnectionType | str | None = None,
    executable_cache_path: str | os.PathLike[str] | None = None,
) -> dict[str, np.ndarray]:
    """Compile ``model`` and run it once on ``inputs`` per the connection type.

    Raises:
        As :meth:`OnnxProgram.start` and :meth:`OnnxProgram.run`.
    """
    async with OnnxProgram(
        model,
        options,
        connection_type=connection_type,
        executable_cache_path=executable_cache_path,
    ) as program:
        return await program.run(inputs)

"""Starting one version of a model for the daemon's repository: compile, build and start its
runner, put a stateful model behind its sequence batcher, and check the executable against the
model's settings (see :mod:`model_runtime.server.repository.repository`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import anyio
from google.protobuf.message import Message

from actors.device.wait import DeviceWaitConfig
from model_runtime.errors import ConfigurationError, InvalidExecutableError, ModelRuntimeError
from model_runtime.io import DataDesc
from model_runtime.runner_config import ModelRunnerConfig
from model_runtime.sequences import SequenceConfig, SequenceRunner, SequenceTable
from model_runtime.server.repository.entries import ModelEntry
from model_runtime.server.serving import RunnerFactory, RunnerLike
from model_runtime.server.tensors.datatypes import datatype_of
from model_runtime.server.tensors.request import TensorSpec
from model_runtime.server.triton.layout import model_batch
from model_runtime.server.triton.served import executable_batch_sizes, serve_model
from model_runtime.server.triton.settings import ModelSettings

__all__ = ["StartedVersion", "start_version"]

#: How often a reload waiting for a free device tries again (seconds).
_DEVICE_RETRY = 0.05


def _batch_of(descs: Sequence[DataDesc], axis: int) -> int | None:
    """The batch an executable runs (its first input's size on the batch axis)."""
    for d in descs:
        if d.batched and 0 <= axis < len(d.shape):
            return int(d.shape[axis])
    return None


def _specs(descs: Sequence[DataDesc], axis: int) -> tuple[TensorSpec, ...]:
    out = []
    for d in descs:
        shape = list(d.shape)
        if d.batched and 0 <= axis < len(shape):  # no batch axis: the whole shape
            shape[axis] = -1
        try:
            datatype = datatype_of(d.dtype)
        except ValueError as exc:
            raise InvalidExecutableError(f"tensor {d.name!r}: {exc}") from None
        batched = d.batched and 0 <= axis < len(shape)
        out.append(TensorSpec(d.name, datatype, tuple(shape), batched=batched))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class StartedVersion:
    """A started runner and what the HTTP layer reads about it."""

    runner: RunnerLike
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    served: Message
    #: A stateful model's live sequences (None: stateless).
    sequences: SequenceTable | None = None


async def start_version(
    entry: ModelEntry,
    source: Path,
    settings: ModelSettings,
    *,
    defaults: ModelRunnerConfig,
    compile_source: Callable[..., Path] | None,
    factory: RunnerFactory,
    reload_device_wait: float | None,
    version: str = "1",
) -> StartedVersion:
    """Start version ``version`` of ``entry`` from ``source``: compile an ``.onnx`` source
    (``compile_source``, in a worker thread), build its runner (``factory``) with the model's
    ``settings`` over the server-wide ``defaults``, start it, put a stateful model behind its
    sequence batcher, and check the executable against the settings.

    ``reload_device_wait``: seconds to wait for devices when the version starts beside a
    serving one (a reload), None when none serves. The runner is closed again if anything
    after its start fails.

    Raises:
        ConfigurationError: the settings and the executable disagree (batch, controls).
        ModelRuntimeError: an ``.onnx`` source and no compiler.
    """
    path = source
    # The model's own settings first; the server-wide ones are the defaults.
    config = settings.runner_config(replace(defaults, replica_to_save_programs_outputs={}))
    axis = config.batching_dim if config.batching_dim is not None else 0
    if path.suffix == ".onnx":
        if compile_source is None:
            raise ModelRuntimeError(f"cannot compile {path}: no compiler configured")
        compile_source = compile_source
        # The configured batch, else (Triton layout) none for a model that cannot batch,
        # else the one the model fixes itself (a model fixed at 2 is not compiled for the
        # server's default 8), else the server's.
        batch = await anyio.to_thread.run_sync(model_batch, source, settings, axis)
        # ``optimization.graph.level``, passed only when the config sets one.
        level = settings.optimization_level
        extra = {} if level is None else {"optimization_level": level}
        path = await anyio.to_thread.run_sync(
            lambda: (
                compile_source(source, batch, **extra)
                if batch is not None or extra
                else compile_source(source)
            )
        )
    # A runner is a client of the runtime's tree: started here, closed by whichever task
    # unloads it. The repository hosts nothing but the readiness watchers.
    if reload_device_wait is not None and config.device_wait_config is None:
        # The serving version holds its devices until the swap; another reload's old
        # version frees its own as it retires: wait for that, boundedly.
        wait = DeviceWaitConfig.with_timeout(reload_device_wait, _DEVICE_RETRY)
        config = replace(config, device_wait_config=wait)
    runner = factory(path, config)
    await runner.start()
    try:
        table = None
        if settings.sequence is not None:
            serving = entry.version_entry(version)
            previous = serving.sequences if serving is not None else None
            stateful = _stateful(entry.name, runner, settings.sequence, config, previous)
            runner, table = stateful, stateful.table  # type: ignore[assignment]
        descs = runner.get_execute_inputs()
        inputs = _specs(descs, axis)
        outputs = _specs(runner.get_execute_outputs(), axis)
        runs = _batch_of(descs, axis)
        want = settings.batch_size
        where = settings.source or settings.origin
        if want == 0 and runs is not None:
            raise ConfigurationError(
                f"{where}: max_batch_size is 0 (no batch axis), but {source} runs batches of {runs}"
            )
        if want is not None and runs is not None and runs != want:
            raise ConfigurationError(
                f"{where}: the batch is {want}, but {source} runs batches of {runs}"
            )
        unbatched = runs is None and not any(d.batched for d in descs)
        batch = 0 if unbatched else runs or 1
        if settings.ragged is not None:  # served as batched; the ragged batcher forms batches
            inputs, outputs = settings.ragged.model_specs(inputs, outputs, where)
            batch = settings.ragged.max_batch_size
        served = serve_model(
            entry.name,
            settings,
            config,
            batch,
            inputs,
            outputs,
            batch_sizes=executable_batch_sizes(runner),
        )
    except BaseException:
        with anyio.CancelScope(shield=True):
            await runner.close()
        raise
    if settings.ragged is not None:
        runner = settings.ragged.wrap(runner)
    if served.boundary is not None:  # reshapes, narrowed dims: requests cross it
        runner = served.boundary.wrap(runner)
    return StartedVersion(runner, served.inputs, served.outputs, served.config, table)


def _stateful(
    name: str,
    runner: RunnerLike,
    sequence: SequenceConfig,
    config: ModelRunnerConfig,
    serving: SequenceTable | None,
) -> SequenceRunner:
    """``runner`` of a stateful model behind its sequence batcher, going on with the live
    sequences of the version it replaces (``serving``) when the sequence settings are the same.

    Raises:
        ConfigurationError: a control or state tensor the model does not have.
    """
    if sequence.strategy == "direct":  # one slot per batch row per instance
        sequence = replace(sequence, slots=sequence.slots * config.replication_factor)
    table = serving if serving is not None and serving.config == sequence else sequence
    stateful = SequenceRunner(runner, table, name)
    stateful.check()
    return stateful

"""What a loaded model serves, in Triton's terms: its settings checked against the executable
the runner started (tensors, batch axis, preferred batch sizes), the tensors clients see and
the ``ModelConfig`` the config endpoint answers (:func:`serve_model`).

The config is completed from the model as Triton's onnxruntime backend completes it: tensors
the config does not list are the model's, ``max_batch_size`` is the batch the executable runs
when the config leaves it out, and every setting in effect (batch timeout, queue, replicas)
is written in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from model_runtime.errors import ConfigurationError
from model_runtime.runner_config import ModelRunnerConfig
from model_runtime.server.tensors.request import TensorSpec
from model_runtime.server.triton import model_config_pb2 as pb
from model_runtime.server.triton.boundary import Boundary
from model_runtime.server.triton.config import BACKEND, PLATFORM
from model_runtime.server.triton.settings import ModelSettings
from model_runtime.server.triton.tensors import Completed, complete, match

__all__ = ["ServedModel", "build_config", "check_tensors", "executable_batch_sizes", "serve_model"]


@dataclass(frozen=True, slots=True)
class ServedModel:
    """A loaded model as clients see it: its ``inputs`` and ``outputs``, its ``config``, and
    the ``boundary`` its runner is wrapped in (None: requests reach the runner as they are)."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    config: pb.ModelConfig
    boundary: Boundary | None


def _where(settings: ModelSettings) -> object:
    return settings.source or settings.origin or "model config"


def check_tensors(
    settings: ModelSettings,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    *,
    batched: bool | None = None,
) -> None:
    """Check the config's ``input`` / ``output`` against the model's (``batched``: the model
    has a batch axis, left out of ``dims``; None: as the config's ``max_batch_size`` says).

    Raises:
        ConfigurationError: a tensor the model lacks, or another datatype or shape (see
            :func:`~.tensors.match`).
    """
    if batched is None:
        batched = settings.config.max_batch_size > 0
    match(settings.config, _where(settings), inputs, outputs, batched)


def _complete(
    settings: ModelSettings,
    batch_size: int,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
) -> Completed:
    return complete(
        settings.config,
        inputs,
        outputs,
        batch_size > 0,
        scalars=settings.triton,
        labels=settings.labels,
    )


def build_config(
    name: str,
    settings: ModelSettings,
    runner: ModelRunnerConfig,
    batch_size: int,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    *,
    completed: Completed | None = None,
) -> pb.ModelConfig:
    """The ``ModelConfig`` of what is served: the file's settings completed with the ones in
    effect (batch, batch timeout, queue, replicas) and the model's tensors where the file
    lists none (``completed``: those tensors, already worked out). ``batch_size`` 0: the
    model has no batch axis (``max_batch_size: 0``, full shapes, no dynamic batcher).

    Raises:
        nothing: the tensors are checked by :func:`check_tensors`.
    """
    if completed is None:
        completed = _complete(settings, batch_size, inputs, outputs)
    config = pb.ModelConfig()
    config.CopyFrom(settings.config)
    config.name, config.platform, config.backend = name, PLATFORM, BACKEND
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    batched = batch_size > 0  # 0: a model without a batch axis (max_batch_size 0)
    config.max_batch_size = (settings.max_batch_size or batch_size) if batched else 0
    del config.input[:], config.output[:]
    config.input.extend(completed.config_inputs)
    config.output.extend(completed.config_outputs)
    del config.instance_group[:]
    config.instance_group.add(
        name=name, kind=pb.ModelInstanceGroup.KIND_CPU, count=runner.replication_factor
    )
    if not batched:  # each request runs alone: no dynamic batcher (Triton refuses one)
        config.ClearField("dynamic_batching")
        return config
    db = config.dynamic_batching
    if not db.preferred_batch_size and batch_size != config.max_batch_size:
        db.preferred_batch_size.append(batch_size)
    db.max_queue_delay_microseconds = max(1, round(runner.timeout * 1e6))
    if runner.max_queue_size is not None:
        db.default_queue_policy.max_queue_size = runner.max_queue_size
    return config


def executable_batch_sizes(runner: object) -> tuple[int, ...] | None:
    """The batch sizes a started runner's executable runs (its buckets, or every size for a
    dynamic one: ``run_sizes``; the largest last); None when the runner does not say (a
    test's stand-in)."""
    executable = getattr(runner, "executable", None)
    sizes = getattr(getattr(executable, "metadata", None), "run_sizes", None)
    return tuple(int(n) for n in sizes) if sizes else None


def serve_model(
    name: str,
    settings: ModelSettings,
    runner: ModelRunnerConfig,
    batch_size: int,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    *,
    batch_sizes: Sequence[int] | None = None,
) -> ServedModel:
    """Check ``settings`` against an executable that runs batches of ``batch_size`` (0: no
    batch axis; ``batch_sizes``: every batch size it runs, when known) with ``inputs`` and
    ``outputs`` (the model's, batch axis -1), and say what is served.

    Raises:
        ConfigurationError: a tensor that does not match (see :func:`check_tensors`), a batch
            axis the config and the model disagree on, dynamic batching without one, or a
            preferred batch size the executable does not run; naming the field.
    """
    where = _where(settings)
    batched = batch_size > 0
    config = settings.config
    if not batched and config.max_batch_size > 0:
        raise ConfigurationError(
            f"{where}: max_batch_size: {config.max_batch_size}, but the model has no batch axis"
        )
    if not batched and config.HasField("dynamic_batching"):
        raise ConfigurationError(
            f"{where}: dynamic_batching: the model has no batch axis (its first dimensions "
            "are not all variable), so its requests cannot be batched; drop dynamic_batching"
        )
    if batched and batch_sizes and len(settings.preferred_batch_sizes) > 1:
        for size in settings.preferred_batch_sizes:
            if size not in batch_sizes:
                raise ConfigurationError(
                    f"{where}: dynamic_batching.preferred_batch_size: {size} is not a batch "
                    f"size the model runs (it runs {list(batch_sizes)}: its program does not "
                    "run smaller batches, or its buckets are these)"
                )
    match(config, where, inputs, outputs, batched)
    completed = _complete(settings, batch_size, inputs, outputs)
    served = build_config(name, settings, runner, batch_size, inputs, outputs, completed=completed)
    return ServedModel(completed.inputs, completed.outputs, served, completed.boundary)

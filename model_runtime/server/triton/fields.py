"""The fields of Triton's ``ModelConfig`` beyond batching, versions and tensors: what each
does here (:func:`check_fields`, called by :func:`.config.settings_of`).

Each field is one of three things:

- **honoured**: ``optimization.graph.level`` is the level the ``.onnx`` is compiled at
  (onnxruntime backend's meaning: -1 basic, 2 none; 0 and 1 our default);
  ``model_warmup`` is checked here and run at load, before the model is ready
  (:mod:`model_runtime.server.repository.warmup`); ``response_cache`` (used when the server
  has a cache, ``--cache-config``: :mod:`model_runtime.server.inference.cache`; refused for a
  decoupled or stateful model, as Triton refuses it); ``metric_tags`` (labels of the model's
  metrics, each key a Prometheus label name); ``model_metrics`` (the buckets of
  ``nv_inference_first_response_histogram_ms``, Triton's one family that takes them:
  :func:`histogram_buckets`);
- **accepted, changing nothing here**, with the reason, which the load logs once
  (:attr:`Fields.notes`): settings that only concern GPUs or TensorRT (``optimization.cuda``,
  ``gpu_execution_accelerator``, pinned memory, ``cc_model_filenames``, an instance group's
  ``profile`` and ``secondary_devices``), an instance group's ``rate_limiter`` (Triton applies
  it only under ``--rate-limit``, which we do not have) and ``host_policy``, and onnxruntime
  ``parameters`` whose setting is the device's or the server's here (thread counts, execution
  mode, the memory arena);
- **refused**: a :class:`~model_runtime.errors.ConfigurationError` naming the source and the
  field, saying why (another metric family, shape tensors, custom op libraries, repository
  agents, passive instances, a CPU accelerator, an unknown onnxruntime parameter). Ragged
  batching (``allow_ragged_batch``, ``batch_input``) is :mod:`.ragged`'s.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from model_runtime.errors import ConfigurationError
from model_runtime.server.triton import model_config_pb2 as pb

__all__ = ["ORT_PARAMETERS", "Fields", "check_complete", "check_fields", "histogram_buckets"]

#: The one metric family whose buckets a model's ``model_metrics`` may set (Triton's).
FIRST_RESPONSE = "nv_inference_first_response_histogram_ms"

_LABEL = re.compile(r"^[A-Za-z0-9_]+$")

_GPU = "only concerns GPUs, and this server runs on CPUs"

#: onnxruntime backend parameters (``parameters { key: ... }``) and why each changes nothing
#: here; the ``int`` ones must be integers >= 0.
ORT_PARAMETERS: Mapping[str, str] = {
    "intra_op_thread_count": "a device's intra-op threads are the device's own "
    "(--devices cpu:NxT), the same for every model on it",
    "inter_op_thread_count": "a device runs one program at a time, sequentially: no "
    "inter-op threads",
    "execution_mode": "a device runs one program at a time, sequentially",
    "enable_mem_arena": "the CPU memory arena is the server's setting (MODEL_RUNTIME_ORT_ARENA)",
    "enable_mem_pattern": "memory patterns are onnxruntime's default here",
    "memory.enable_memory_arena_shrinkage": "the CPU memory arena is the server's setting "
    "(MODEL_RUNTIME_ORT_ARENA)",
    "session.use_device_allocator_for_initializers": "weights are the session's own copy",
    "cudnn_conv_algo_search": _GPU,
    "gpu_mem_limit": _GPU,
    "arena_extend_strategy": _GPU,
    "do_copy_in_default_stream": _GPU,
}
_INT_PARAMETERS = ("intra_op_thread_count", "inter_op_thread_count", "gpu_mem_limit")

#: Triton's onnxruntime graph levels -> our compile's optimisation level (None: our default).
_GRAPH_LEVELS: Mapping[int, str | None] = {-1: "basic", 0: None, 1: None, 2: "disable"}


@dataclass(frozen=True, slots=True)
class Fields:
    """What :func:`check_fields` found: ``optimization_level``, the compile's level (None: the
    default); ``notes``, one line per field accepted without effect, saying why."""

    optimization_level: str | None = None
    notes: tuple[str, ...] = ()


def _fail(where: Path | str, field: str, why: str) -> ConfigurationError:
    return ConfigurationError(f"{where}: {field}: {why}")


def check_fields(
    config: pb.ModelConfig, where: Path | str, *, python: bool, stateful: bool
) -> Fields:
    """Check the fields this module covers (module docstring) for a model whose config came
    from ``where``; ``python``: a python model (it reads its own ``parameters``);
    ``stateful``: it has ``sequence_batching``.

    Raises:
        ConfigurationError: a field we refuse, naming ``where`` and the field.
    """
    notes: list[str] = []
    if not python:
        _ort_parameters(config, where, notes)
    level = _optimization(config, where, notes, python=python)
    _instance_groups(config, where, notes)
    _tensors(config, where)
    if config.response_cache.enable:
        _response_cache(config, where, stateful=stateful)
    for key in sorted(config.metric_tags):
        if not _LABEL.match(key):
            raise _fail(
                where, f"metric_tags[{key!r}]", "a tag's key must be a label name ([A-Za-z0-9_])"
            )
    _model_metrics(config, where)
    if config.model_operations.op_library_filename:
        raise _fail(
            where,
            "model_operations.op_library_filename",
            "custom op libraries load only from the server's allow-list (model_runtime."
            "custom_ops), not from a model's config",
        )
    if config.model_repository_agents.agents:
        raise _fail(where, "model_repository_agents", "repository agents are not supported")
    if config.cc_model_filenames:
        notes.append(f"cc_model_filenames: {_GPU}")
    if config.runtime and config.runtime not in _runtimes(python):
        raise _fail(
            where,
            "runtime",
            f"{config.runtime!r} is not this backend's runtime (leave it out, or "
            f"{' or '.join(repr(r) for r in _runtimes(python))})",
        )
    _warmup(config, where, stateful=stateful)
    return Fields(level, tuple(notes))


def _response_cache(config: pb.ModelConfig, where: Path | str, *, stateful: bool) -> None:
    """Triton's rule: the response cache is for the default and dynamic batchers only."""
    name = config.name or str(where)
    if config.model_transaction_policy.decoupled:
        raise _fail(
            where,
            "response_cache.enable",
            f"Response Cache does not currently support model {name} with 'decoupled' "
            "transaction policy. Please disable the response cache.",
        )
    if stateful:
        raise _fail(
            where,
            "response_cache.enable",
            f"Response Cache does not currently support model {name} with sequence batching "
            "scheduler. Please disable the response cache.",
        )


def _model_metrics(config: pb.ModelConfig, where: Path | str) -> None:
    """Triton's checks of ``model_metrics``, in its words, and ours: the family is one that
    takes buckets, and they increase."""
    for i, control in enumerate(config.model_metrics.metric_control):
        at = f"model_metrics.metric_control[{i}]"
        if not control.HasField("metric_identifier"):
            raise _fail(where, at, "metric control must specify 'metric_identifier'")
        family = control.metric_identifier.family
        if not family:
            raise _fail(where, at, "metric identifier must specify non-empty 'family'")
        if not control.HasField("histogram_options"):
            raise _fail(where, at, "metric control must specify 'histogram_options'")
        buckets = list(control.histogram_options.buckets)
        if not buckets:
            raise _fail(where, at, "histogram options must specify non-empty 'buckets'")
        if family != FIRST_RESPONSE:
            raise _fail(where, at, f"{family!r}: only {FIRST_RESPONSE} takes custom buckets")
        if any(b >= c for b, c in itertools.pairwise(buckets)):
            raise _fail(where, at, f"buckets {buckets} must increase")


def histogram_buckets(config: pb.ModelConfig) -> tuple[float, ...] | None:
    """The buckets (ms) a checked config gives the first-response histogram (None: Triton's
    defaults)."""
    for control in config.model_metrics.metric_control:
        if control.metric_identifier.family == FIRST_RESPONSE:
            return tuple(control.histogram_options.buckets)
    return None


def _runtimes(python: bool) -> tuple[str, ...]:
    return ("model.py",) if python else ("libtriton_onnxruntime.so",)


def _ort_parameters(config: pb.ModelConfig, where: Path | str, notes: list[str]) -> None:
    for key in sorted(config.parameters):
        at = f"parameters[{key!r}]"
        if key not in ORT_PARAMETERS:
            known = ", ".join(sorted(ORT_PARAMETERS))
            raise _fail(where, at, f"not an onnxruntime parameter we know (known: {known})")
        value = config.parameters[key].string_value.strip()
        if key in _INT_PARAMETERS and not (value.isdigit()):
            raise _fail(where, at, f"{value!r} is not an integer >= 0")
        if key == "execution_mode" and value not in ("0", "1"):
            raise _fail(where, at, f"{value!r}: 0 (sequential) or 1 (parallel)")
        if key in ("execution_mode", "inter_op_thread_count") and value in ("0", "1"):
            continue  # sequential, as here
        notes.append(f"{at} = {value!r}: {ORT_PARAMETERS[key]}")


def _optimization(
    config: pb.ModelConfig, where: Path | str, notes: list[str], *, python: bool
) -> str | None:
    if not config.HasField("optimization"):
        return None
    opt = config.optimization
    level: str | None = None
    if opt.HasField("graph"):
        if opt.graph.level not in _GRAPH_LEVELS:
            raise _fail(where, "optimization.graph.level", "-1 (basic), 0, 1 or 2 (none)")
        if python:
            notes.append("optimization.graph: a python model has no graph to optimise")
        else:
            level = _GRAPH_LEVELS[opt.graph.level]
    if opt.HasField("cuda"):
        notes.append(f"optimization.cuda: {_GPU}")
    accelerators = opt.execution_accelerators
    if accelerators.gpu_execution_accelerator:
        notes.append(f"optimization.execution_accelerators.gpu_execution_accelerator: {_GPU}")
    for i, acc in enumerate(accelerators.cpu_execution_accelerator):
        raise _fail(
            where,
            f"optimization.execution_accelerators.cpu_execution_accelerator[{i}]",
            f"{acc.name!r} is not available: models run on onnxruntime's CPU provider",
        )
    for name in ("input_pinned_memory", "output_pinned_memory"):
        if opt.HasField(name):
            notes.append(f"optimization.{name}: {_GPU}")
    if opt.gather_kernel_buffer_threshold:
        notes.append(f"optimization.gather_kernel_buffer_threshold: {_GPU}")
    if opt.priority != pb.ModelOptimizationPolicy.PRIORITY_DEFAULT:
        notes.append("optimization.priority: a backend thread priority, not set here")
    if opt.eager_batching:
        notes.append(
            "optimization.eager_batching: the next batch is always prepared while one runs"
        )
    return level


def _instance_groups(config: pb.ModelConfig, where: Path | str, notes: list[str]) -> None:
    for i, group in enumerate(config.instance_group):
        at = f"instance_group[{i}]"
        if group.passive:
            raise _fail(where, f"{at}.passive", "passive instances are not supported")
        if group.HasField("rate_limiter"):
            notes.append(
                f"{at}.rate_limiter: Triton applies it only under --rate-limit, which this "
                "server does not have"
            )
        if group.host_policy:
            notes.append(f"{at}.host_policy: host policies (NUMA placement) are not applied")
        if group.profile or group.secondary_devices:
            notes.append(f"{at}.profile/secondary_devices: {_GPU}")


def _tensors(config: pb.ModelConfig, where: Path | str) -> None:
    for kind, tensors in (("input", config.input), ("output", config.output)):
        for i, t in enumerate(tensors):
            at = f"{kind}[{i}]"
            if t.is_shape_tensor:
                raise _fail(where, f"{at}.is_shape_tensor", "shape tensors are TensorRT's")
            if t.is_non_linear_format_io:
                raise _fail(
                    where, f"{at}.is_non_linear_format_io", "non-linear formats are TensorRT's"
                )


def _warmup(config: pb.ModelConfig, where: Path | str, *, stateful: bool) -> None:
    mbs = config.max_batch_size
    for i, sample in enumerate(config.model_warmup):
        at = f"model_warmup[{i}]"
        if stateful:
            raise _fail(
                where, at, "warm-up of a stateful model (sequence_batching) is not supported"
            )
        if config.model_transaction_policy.decoupled:
            raise _fail(where, at, "warm-up of a decoupled model is not supported")
        if not sample.name:
            raise _fail(where, f"{at}.name", "give the sample a name")
        if mbs > 0 and not 1 <= sample.batch_size <= mbs:
            raise _fail(where, f"{at}.batch_size", f"must be in 1..max_batch_size ({mbs})")
        if mbs == 0 and sample.batch_size > 1:
            raise _fail(where, f"{at}.batch_size", "must be 1 for a model without batching")
        if not sample.inputs:
            raise _fail(where, f"{at}.inputs", "give the sample's inputs")
        for name, tensor in sorted(sample.inputs.items()):
            ti = f"{at}.inputs[{name!r}]"
            if tensor.data_type == pb.TYPE_INVALID:
                raise _fail(where, f"{ti}.data_type", "give the input's data type")
            if any(d < 0 for d in tensor.dims):
                raise _fail(where, f"{ti}.dims", "give every dimension (no -1)")
            kind = tensor.WhichOneof("input_data_type")
            if kind is None:
                raise _fail(where, ti, "give zero_data, random_data or input_data_file")
            if kind == "input_data_file":
                path = Path(tensor.input_data_file)
                if path.is_absolute() or ".." in path.parts:
                    raise _fail(
                        where,
                        f"{ti}.input_data_file",
                        "must name a file in the model directory's warmup folder",
                    )


def check_complete(config: pb.ModelConfig, where: Path | str) -> None:
    """With auto-complete off (Triton's ``--disable-auto-complete-config``), a model directory's
    config must describe the model itself: its inputs and outputs (``max_batch_size`` not given
    is 0, as in Triton).

    Raises:
        ConfigurationError: the config lacks them, naming ``where`` and what is missing.
    """
    missing = [name for name in ("input", "output") if not getattr(config, name)]
    if missing:
        raise _fail(
            where,
            " and ".join(missing),
            "not given, and auto-complete is off (--disable-auto-complete-config): the config "
            "must describe the model",
        )

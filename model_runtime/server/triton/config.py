"""Per-model settings in Triton's terms: ``config.pbtxt`` (and our per-model TOML) in, the
runner's settings and the served ``ModelConfig`` out.

Both files carry one schema, Triton's ``ModelConfig`` (:mod:`.model_config_pb2`): a Triton
model directory's ``config.pbtxt`` is read with protobuf's text format, a flat model's
``NAME.toml`` (beside ``NAME.onnx`` / ``NAME.mrx``) with the same field names as TOML tables.
A field the schema lacks, or a value we do not serve (``KIND_GPU``, dynamic batching with
``max_batch_size: 0``, a reshape...), is a :class:`~model_runtime.errors.ConfigurationError`
that names the file and the field: that model fails to load, the others serve.

What maps to what (:func:`settings_of`):

- ``max_batch_size`` -> the batch the ``.onnx`` is compiled for (an ``.mrx`` must match it);
  ``max_batch_size: 0`` with the ``input`` tensors listed (their full shapes, as Triton reads
  them) -> a model without a batch axis: compiled with batch size 0, each request one run at
  the model's own shape (without listed inputs, 0 is "not given": the model's own or the
  server's batch, as Triton's auto-complete would find it);
  ``dynamic_batching.preferred_batch_size`` (one size) -> that batch instead: a batch is
  dispatched when it holds that many rows, larger requests are split over batches.
- ``dynamic_batching.max_queue_delay_microseconds`` -> the batch timeout (0: at once).
- ``dynamic_batching.priority_levels`` / ``default_priority_level`` -> the request priority map.
- ``default_queue_policy.max_queue_size`` -> the queue bound (it replaces the latency budget);
  ``default_timeout_microseconds`` -> the default deadline of a request.
- ``instance_group { count, kind: KIND_CPU }`` -> replicas (groups add up).
- ``version_policy`` -> which version directories are served (Triton's default: the latest).
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from google.protobuf import json_format, text_format
from google.protobuf.descriptor import FieldDescriptor

from model_runtime.errors import ConfigurationError, ModelUnavailableError
from model_runtime.runner_config import ModelRunnerConfig
from model_runtime.server.parameters import execute_priority
from model_runtime.server.triton import model_config_pb2 as pb

if TYPE_CHECKING:
    from model_runtime.server.codec import TensorSpec
    from model_runtime.server.repository import ModelEntry

__all__ = [
    "BACKEND",
    "CONFIG_FILE",
    "DEFAULT_SETTINGS",
    "OVERRIDE",
    "PLATFORM",
    "ModelSettings",
    "VersionPolicy",
    "build_config",
    "check_tensors",
    "config_json",
    "parse_override",
    "parse_pbtxt",
    "parse_toml",
    "served_config",
    "settings_of",
]

CONFIG_FILE = "config.pbtxt"
#: Where a load's configuration override comes from, as errors name it.
OVERRIDE = "load parameter 'config'"
PLATFORM = "onnxruntime_onnx"
BACKEND = "onnxruntime"
_PLATFORMS = ("", PLATFORM)
_BACKENDS = ("", BACKEND)
_KINDS = (pb.ModelInstanceGroup.KIND_AUTO, pb.ModelInstanceGroup.KIND_CPU)
# Our protocol datatypes (model_runtime.server.datatypes) -> Triton's config enum.
_DATATYPES = {
    "BOOL": pb.TYPE_BOOL,
    "UINT8": pb.TYPE_UINT8,
    "UINT16": pb.TYPE_UINT16,
    "UINT32": pb.TYPE_UINT32,
    "UINT64": pb.TYPE_UINT64,
    "INT8": pb.TYPE_INT8,
    "INT16": pb.TYPE_INT16,
    "INT32": pb.TYPE_INT32,
    "INT64": pb.TYPE_INT64,
    "FP16": pb.TYPE_FP16,
    "FP32": pb.TYPE_FP32,
    "FP64": pb.TYPE_FP64,
    "BYTES": pb.TYPE_STRING,
    "BF16": pb.TYPE_BF16,
}


@dataclass(frozen=True, slots=True)
class VersionPolicy:
    """Which versions are served: the ``latest`` N, ``all``, or ``specific`` ones."""

    kind: str = "latest"
    num_versions: int = 1
    versions: tuple[int, ...] = ()

    def select(self, available: Iterable[int]) -> list[int]:
        """The versions to serve among ``available``, highest first."""
        found = sorted(set(available), reverse=True)
        if self.kind == "all":
            return found
        if self.kind == "specific":
            return [v for v in found if v in self.versions]
        return found[: self.num_versions]


@dataclass(frozen=True, slots=True)
class ModelSettings:
    """One model's settings, each None where the server-wide default applies.

    ``batch_size``: the batch the executable is built for; ``max_batch_size``: the largest
    request (Triton's), reported in the config; ``timeout``: batch timeout (seconds);
    ``request_timeout``: a request's default deadline (seconds); ``config``: the parsed file
    (an empty ``ModelConfig`` when the model has none); ``source``: that file; ``origin``:
    where the settings came from when not from a file (a load's ``config`` override).
    """

    config: pb.ModelConfig
    source: Path | None = None
    origin: str | None = None
    batch_size: int | None = None
    max_batch_size: int | None = None
    replicas: int | None = None
    timeout: float | None = None
    max_queue_size: int | None = None
    request_timeout: float | None = None
    priority_levels: int | None = None
    default_priority_level: int | None = None
    version_policy: VersionPolicy = VersionPolicy()

    def deadline(self, server: float | None, requested: float | None) -> float | None:
        """A request's timeout (seconds): its own, else the model's default, within the
        server's ``server`` limit (None: none)."""
        timeout = requested if requested is not None else self.request_timeout
        if timeout is None:
            return server
        return timeout if server is None else min(server, timeout)

    def priority(self, level: int, levels: int | None, default_level: int | None) -> int:
        """A request's protocol ``priority`` as ``execute(priority=...)``: the model's priority
        levels, else the server's (``levels`` / ``default_level``).

        Raises:
            ProtocolError: ``level`` is past the levels.
        """
        if self.priority_levels is not None:
            levels, default_level = self.priority_levels, self.default_priority_level
        return execute_priority(level, levels=levels, default_level=default_level)

    def runner_config(self, base: ModelRunnerConfig) -> ModelRunnerConfig:
        """``base`` (the server-wide runner settings) with this model's settings over it.

        Raises:
            ConfigurationError: the combination is invalid.
        """
        config = base
        if self.replicas is not None:
            config = replace(config, replication_factor=self.replicas)
        if self.timeout is not None:
            config = replace(config, timeout=self.timeout)
        if self.max_queue_size is not None:
            # Triton's queue policy bounds the queue instead of the latency budget.
            config = replace(config, max_queue_size=self.max_queue_size, latency_budget=None)
        config.validate()
        return config


#: The settings of a model without its own (every server-wide default applies).
DEFAULT_SETTINGS = ModelSettings(pb.ModelConfig())


def _fail(source: Path | str, field: str, why: str) -> ConfigurationError:
    return ConfigurationError(f"{source}: {field}: {why}")


def parse_pbtxt(path: Path, name: str) -> ModelSettings:
    """Read a Triton ``config.pbtxt`` (protobuf text format) for the model ``name``.

    Raises:
        ConfigurationError: unreadable, not valid text format, an unknown field, or a
            value we do not serve; the message names the file and the field.
    """
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"{path}: cannot read: {exc}") from exc
    config = pb.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise ConfigurationError(f"{path}:{exc}") from exc
    if config.name and config.name != name:
        raise _fail(path, "name", f"{config.name!r} is not the model's directory name {name!r}")
    return settings_of(config, path)


def parse_toml(path: Path) -> ModelSettings:
    """Read a flat model's TOML: Triton's ``ModelConfig`` fields, as TOML keys and tables.

    Raises:
        ConfigurationError: unreadable, not TOML, an unknown field, or a value we do not serve.
    """
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigurationError(f"{path}: {exc}") from exc
    config = pb.ModelConfig()
    try:
        json_format.ParseDict(doc, config)
    except json_format.ParseError as exc:
        raise ConfigurationError(f"{path}: {exc}") from exc
    if config.name:
        raise _fail(path, "name", "the model's name is its file's name; leave it out")
    return settings_of(config, path)


def parse_override(text: str, name: str) -> ModelSettings:
    """Read a load's configuration override (Triton's ``load_model(name, config=...)``: a
    ``ModelConfig`` in protobuf's JSON mapping) for the model ``name``. It replaces the
    model's ``config.pbtxt`` / TOML for that load, with the same checks.

    Raises:
        ConfigurationError: not a ``ModelConfig`` in JSON, another model's name, or a value
            we do not serve; the message names the override and the field.
    """
    config = pb.ModelConfig()
    try:
        json_format.Parse(text, config)
    except json_format.ParseError as exc:
        raise ConfigurationError(f"{OVERRIDE}: not a ModelConfig in JSON: {exc}") from exc
    if config.name and config.name != name:
        raise _fail(OVERRIDE, "name", f"{config.name!r} is not the model's name {name!r}")
    return settings_of(config, origin=OVERRIDE)


def settings_of(
    config: pb.ModelConfig, source: Path | None = None, *, origin: str | None = None
) -> ModelSettings:
    """Check ``config`` for what we serve and map it onto :class:`ModelSettings`.

    Raises:
        ConfigurationError: a value we do not serve, naming ``source`` (or ``origin``) and the
            field.
    """
    where = source or origin or "model config"
    if config.platform not in _PLATFORMS:
        raise _fail(where, "platform", f"{config.platform!r} is not served (only {PLATFORM!r})")
    if config.backend not in _BACKENDS:
        raise _fail(where, "backend", f"{config.backend!r} is not served (only {BACKEND!r})")
    if config.default_model_filename and Path(config.default_model_filename).suffix not in (
        ".onnx",
        ".mrx",
    ):
        raise _fail(where, "default_model_filename", "must name an .onnx or .mrx file")
    if config.parameters:
        raise _fail(
            where, "parameters", f"no parameters are supported: {sorted(config.parameters)}"
        )
    if config.max_batch_size < 0:
        raise _fail(where, "max_batch_size", "must be >= 0")
    if config.HasField("dynamic_batching") and config.max_batch_size == 0:
        raise _fail(
            where,
            "max_batch_size",
            "0 (a model without a batch dimension) cannot have dynamic_batching: give the "
            "largest batch, or drop dynamic_batching",
        )
    _check_tensors(config, where)
    batch = config.max_batch_size or None
    if config.max_batch_size == 0 and config.input:
        batch = 0  # no batch axis: the listed inputs are the model's whole shapes
    fields: dict[str, Any] = {}
    if config.HasField("dynamic_batching"):
        fields = _dynamic_batching(config.dynamic_batching, where, config.max_batch_size)
        batch = fields.pop("batch_size", None) or batch
    return ModelSettings(
        config=config,
        source=source,
        origin=origin,
        batch_size=batch,
        max_batch_size=config.max_batch_size or None,
        replicas=_replicas(config.instance_group, where),
        version_policy=_version_policy(config, where),
        **fields,
    )


def _check_tensors(config: pb.ModelConfig, where: Path | str) -> None:
    for kind, tensors in (("input", config.input), ("output", config.output)):
        for i, t in enumerate(tensors):
            at = f"{kind}[{i}]"
            if not t.name:
                raise _fail(where, f"{at}.name", "missing")
            if t.HasField("reshape"):
                raise _fail(where, f"{at}.reshape", "reshapes are not supported")
            if kind == "input" and t.optional:
                raise _fail(where, f"{at}.optional", "optional inputs are not supported")
            if kind == "output" and t.label_filename:
                raise _fail(where, f"{at}.label_filename", "labels are not supported")
            if t.data_type == pb.TYPE_INVALID:
                raise _fail(where, f"{at}.data_type", "missing")


def _dynamic_batching(db: pb.ModelDynamicBatching, where: Path | str, mbs: int) -> dict[str, Any]:
    out: dict[str, Any] = {"timeout": max(db.max_queue_delay_microseconds, 1) / 1e6}
    preferred = list(db.preferred_batch_size)
    if len(preferred) > 1:
        raise _fail(
            where,
            "dynamic_batching.preferred_batch_size",
            f"one size is supported (the batch the executable runs), got {preferred}",
        )
    if preferred:
        if not 0 < preferred[0] <= mbs:
            raise _fail(
                where,
                "dynamic_batching.preferred_batch_size",
                f"{preferred[0]} must be in 1..max_batch_size ({mbs})",
            )
        out["batch_size"] = preferred[0]
    if db.priority_levels:
        if not 1 <= db.default_priority_level <= db.priority_levels:
            raise _fail(
                where,
                "dynamic_batching.default_priority_level",
                f"must be in 1..priority_levels ({db.priority_levels})",
            )
        out["priority_levels"] = db.priority_levels
        out["default_priority_level"] = db.default_priority_level
    elif db.default_priority_level:
        raise _fail(where, "dynamic_batching.default_priority_level", "needs priority_levels")
    if db.priority_queue_policy:
        raise _fail(
            where, "dynamic_batching.priority_queue_policy", "per-priority queues are not supported"
        )
    if db.HasField("default_queue_policy"):
        policy = db.default_queue_policy
        at = "dynamic_batching.default_queue_policy"
        if policy.timeout_action != pb.ModelQueuePolicy.REJECT:
            raise _fail(where, f"{at}.timeout_action", "only REJECT is supported")
        if policy.max_queue_size:
            out["max_queue_size"] = policy.max_queue_size
        if policy.default_timeout_microseconds:
            out["request_timeout"] = policy.default_timeout_microseconds / 1e6
    return out


def _replicas(groups: Sequence[pb.ModelInstanceGroup], where: Path | str) -> int | None:
    if not groups:
        return None
    total = 0
    for i, group in enumerate(groups):
        at = f"instance_group[{i}]"
        if group.kind not in _KINDS:
            kind = pb.ModelInstanceGroup.Kind.Name(group.kind)
            raise _fail(where, f"{at}.kind", f"{kind} is not served (KIND_CPU or KIND_AUTO)")
        if group.gpus:
            raise _fail(where, f"{at}.gpus", "there are no GPUs to place instances on")
        if group.count < 0:
            raise _fail(where, f"{at}.count", "must be >= 0")
        total += group.count or 1  # Triton's default count is 1
    return total


def _version_policy(config: pb.ModelConfig, where: Path | str) -> VersionPolicy:
    if not config.HasField("version_policy"):
        return VersionPolicy()
    policy = config.version_policy
    match policy.WhichOneof("policy_choice"):
        case "all":
            return VersionPolicy("all")
        case "specific":
            versions = tuple(policy.specific.versions)
            if not versions or min(versions) < 1:
                raise _fail(where, "version_policy.specific.versions", "give versions >= 1")
            return VersionPolicy("specific", versions=versions)
        case _:
            return VersionPolicy("latest", num_versions=max(1, policy.latest.num_versions))


def check_tensors(
    settings: ModelSettings, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]
) -> None:
    """Check the config's ``input`` / ``output`` against the model's (batch axis left out
    when ``max_batch_size`` > 0; -1 matches any size).

    Raises:
        ConfigurationError: a tensor the model lacks, or another datatype or shape.
    """
    where = settings.source or settings.origin or "model config"
    batched = settings.config.max_batch_size > 0
    for kind, declared, actual in (
        ("input", settings.config.input, inputs),
        ("output", settings.config.output, outputs),
    ):
        by_name = {s.name: s for s in actual}
        for i, t in enumerate(declared):
            spec = by_name.get(t.name)
            at = f"{kind}[{i}]"
            if spec is None:
                raise _fail(where, f"{at}.name", f"the model has no {kind} {t.name!r}")
            if _DATATYPES.get(spec.datatype) != t.data_type:
                want = pb.DataType.Name(t.data_type)
                raise _fail(where, f"{at}.data_type", f"{want}, but the model has {spec.datatype}")
            shape = list(spec.shape[1:] if batched else spec.shape)
            dims = list(t.dims)
            if len(dims) != len(shape) or any(
                d != s and -1 not in (d, s) for d, s in zip(dims, shape, strict=True)
            ):
                raise _fail(where, f"{at}.dims", f"{dims}, but the model has {shape}")


def _tensor(cls: Any, spec: TensorSpec, batched: bool) -> Any:
    shape = spec.shape[1:] if batched else spec.shape
    return cls(name=spec.name, data_type=_DATATYPES.get(spec.datatype, 0), dims=list(shape))


def build_config(
    name: str,
    settings: ModelSettings,
    runner: ModelRunnerConfig,
    batch_size: int,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
) -> pb.ModelConfig:
    """The ``ModelConfig`` of what is served: the file's settings completed with the ones in
    effect (batch, batch timeout, queue, replicas) and the model's tensors. ``batch_size``
    0: the model has no batch axis (``max_batch_size: 0``, full shapes, no dynamic batcher)."""
    config = pb.ModelConfig()
    config.CopyFrom(settings.config)
    config.name, config.platform, config.backend = name, PLATFORM, BACKEND
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    batched = batch_size > 0  # 0: a model without a batch axis (max_batch_size 0)
    config.max_batch_size = (settings.max_batch_size or batch_size) if batched else 0
    del config.input[:], config.output[:]
    config.input.extend(_tensor(pb.ModelInput, s, batched) for s in inputs)
    config.output.extend(_tensor(pb.ModelOutput, s, batched) for s in outputs)
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


def config_json(config: pb.ModelConfig) -> dict[str, Any]:
    """``config`` as Triton's HTTP endpoint writes it: proto field names, every field, and
    64-bit integers as JSON numbers (protobuf's JSON mapping writes them as strings)."""
    doc = json_format.MessageToDict(
        config, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    _numbers(config.DESCRIPTOR, doc)
    return doc  # type: ignore[no-any-return]


_INT64 = {
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED64,
    FieldDescriptor.TYPE_SFIXED64,
}


def _numbers(descriptor: Any, doc: dict[str, Any]) -> None:
    """Turn the 64-bit integer fields of ``doc`` (a message of ``descriptor``) into ints."""
    for field in descriptor.fields:
        value = doc.get(field.name)
        if value is None:
            continue
        kind = field.message_type
        if kind is not None and kind.GetOptions().map_entry:
            item = kind.fields_by_name["value"]
            for key, v in value.items():
                if item.message_type is not None:
                    _numbers(item.message_type, v)
                elif item.type in _INT64:
                    value[key] = int(v)
        elif kind is not None:
            for v in value if field.is_repeated else [value]:
                _numbers(kind, v)
        elif field.type in _INT64:
            doc[field.name] = [int(v) for v in value] if field.is_repeated else int(value)


def served_config(entry: ModelEntry) -> pb.ModelConfig:
    """The ``ModelConfig`` of what ``entry`` (a model version the repository resolved, so an
    unknown model or version was already a ``ModelNotFoundError``, 404) serves.

    Raises:
        ModelUnavailableError: the model is not loaded (503).
    """
    served = entry.served
    if served is None or entry.runner is None:
        raise ModelUnavailableError(f"model {entry.name!r} is not loaded")
    return served  # type: ignore[no-any-return]

"""Per-model settings in Triton's terms: ``config.pbtxt`` (and our per-model TOML) in,
:class:`~.settings.ModelSettings` out (the served ``ModelConfig`` is built by :mod:`.served`).

Both files carry one schema, Triton's ``ModelConfig`` (:mod:`.model_config_pb2`): a Triton
model directory's ``config.pbtxt`` is read with protobuf's text format, a flat model's
``NAME.toml`` (beside ``NAME.onnx`` / ``NAME.mrx``) with the same field names as TOML tables.
A field the schema lacks, or a value we do not serve (``KIND_GPU``, dynamic batching with
``max_batch_size: 0``, an optional input of a batched model...), is a
:class:`~model_runtime.errors.ConfigurationError` that names the file and the field: that model
fails to load, the others serve. The tensors (``dims``, ``reshape``, ``optional``,
``label_filename``) are checked by :mod:`.tensors`.

What maps to what (:func:`settings_of`):

- ``max_batch_size`` -> the batch the ``.onnx`` is compiled for (an ``.mrx`` must match it).
  Given as 0 -> a model without a batch axis: compiled with batch size 0, each request one
  run at the model's own shape, ``dims`` its full shapes. Not given -> 0 when the config lists
  both inputs and outputs (Triton completes nothing then); else the model decides, as Triton's
  auto-complete for ONNX does in a Triton layout (batched when every input's and output's
  first dimension is variable) and as the model's own batch (or the server's) in the flat one
  (see :func:`~.layout.model_batch`). Whether it was given is read from the file itself: the
  schema's ``max_batch_size`` (proto3) cannot tell 0 from absent.
- ``dynamic_batching.preferred_batch_size``: one size -> that batch instead (a batch is
  dispatched when it holds that many rows, larger requests are split over batches); several
  -> the executable is compiled for ``max_batch_size`` and each size must be a batch size it
  runs (its batch-size buckets), checked at load.
- ``dynamic_batching.max_queue_delay_microseconds`` -> the batch timeout (0: at once).
- ``dynamic_batching.priority_levels`` / ``default_priority_level`` -> the request priority map.
- ``default_queue_policy`` / ``priority_queue_policy`` -> the queue policy per priority level
  (:mod:`model_runtime.queue_policy`: timeouts, REJECT or DELAY, ``max_queue_size``); without
  priority levels ``max_queue_size`` is the model's queue bound. A bound replaces the latency
  budget.
- ``instance_group { count, kind: KIND_CPU }`` -> replicas (groups add up).
- ``version_policy`` -> which version directories are served (Triton's default: the latest).
- ``sequence_batching`` -> a stateful model (:mod:`.sequence`, :mod:`model_runtime.sequences`).
- every other field (``optimization``, ``parameters``, ``model_warmup``, ``response_cache``...)
  -> :mod:`.fields`: honoured, accepted with a logged reason, or refused.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from google.protobuf import json_format, text_format
from google.protobuf.descriptor import FieldDescriptor

from model_runtime.errors import ConfigurationError, ModelUnavailableError
from model_runtime.server.triton import model_config_pb2 as pb
from model_runtime.server.triton.batching import dynamic_batching
from model_runtime.server.triton.ensemble import ENSEMBLE_PLATFORM, ensemble_config
from model_runtime.server.triton.fields import check_fields
from model_runtime.server.triton.ragged import ragged_spec
from model_runtime.server.triton.sequence import sequence_config
from model_runtime.server.triton.settings import ModelSettings, VersionPolicy
from model_runtime.server.triton.tensors import check_declared

__all__ = [
    "BACKEND",
    "CONFIG_FILE",
    "OVERRIDE",
    "PLATFORM",
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
#: Triton's python backend: ``NAME/VERSION/model.py`` run in instance processes.
PYTHON_BACKEND = "python"
_PLATFORMS = ("", PLATFORM, ENSEMBLE_PLATFORM)
_BACKENDS = ("", BACKEND, PYTHON_BACKEND)
_KINDS = (pb.ModelInstanceGroup.KIND_AUTO, pb.ModelInstanceGroup.KIND_CPU)


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
    given = "max_batch_size" in _top_fields(text)
    return settings_of(config, path, max_batch_size_given=given, name=name)


def _top_fields(text: str) -> set[str]:
    """The fields a (valid) text-format message sets at its top level."""
    tokens = text_format.Tokenizer(text.splitlines())
    names: set[str] = set()
    depth, last = 0, ""
    while not tokens.AtEnd():
        token = tokens.token
        if token in ("{", "<", "["):
            if depth == 0 and last:
                names.add(last)
            depth += 1
        elif token in ("}", ">", "]"):
            depth -= 1
        elif token == ":" and depth == 0 and last:
            names.add(last)
        last = token if depth == 0 and (token[:1].isalpha() or token[:1] == "_") else ""
        tokens.NextToken()
    return names


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
    return settings_of(config, path, max_batch_size_given="max_batch_size" in doc)


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
        doc = json.loads(text)
    except (json_format.ParseError, ValueError) as exc:
        raise ConfigurationError(f"{OVERRIDE}: not a ModelConfig in JSON: {exc}") from exc
    if config.name and config.name != name:
        raise _fail(OVERRIDE, "name", f"{config.name!r} is not the model's name {name!r}")
    given = isinstance(doc, dict) and bool({"max_batch_size", "maxBatchSize"} & set(doc))
    return settings_of(config, origin=OVERRIDE, max_batch_size_given=given, name=name)


def settings_of(
    config: pb.ModelConfig,
    source: Path | None = None,
    *,
    origin: str | None = None,
    max_batch_size_given: bool | None = None,
    name: str | None = None,
) -> ModelSettings:
    """Check ``config`` for what we serve and map it onto :class:`ModelSettings`.
    ``max_batch_size_given``: the file sets ``max_batch_size`` (None: when it is not 0);
    ``name``: the model's (for an ensemble's errors, in Triton's words).

    Raises:
        ConfigurationError: a value we do not serve, naming ``source`` (or ``origin``) and the
            field.
    """
    where = source or origin or "model config"
    if config.platform not in _PLATFORMS:
        raise _fail(where, "platform", f"{config.platform!r} is not served (only {PLATFORM!r})")
    if config.backend not in _BACKENDS:
        served = " or ".join(repr(b) for b in _BACKENDS[1:])
        raise _fail(where, "backend", f"{config.backend!r} is not served (only {served})")
    if config.HasField("ensemble_scheduling") or config.platform == ENSEMBLE_PLATFORM:
        return _ensemble_settings(config, source, origin, name or config.name or str(where))
    python = config.backend == PYTHON_BACKEND
    if python and config.platform:
        raise _fail(where, "platform", f"{config.platform!r} with backend 'python': leave it out")
    suffixes = (".py",) if python else (".onnx", ".mrx")
    if config.default_model_filename and Path(config.default_model_filename).suffix not in (
        suffixes
    ):
        raise _fail(where, "default_model_filename", f"must name a {' or '.join(suffixes)} file")
    decoupled = config.model_transaction_policy.decoupled
    if decoupled and not python:
        raise _fail(
            where, "model_transaction_policy.decoupled", "only python models may be decoupled"
        )
    mbs = config.max_batch_size
    if mbs < 0:
        raise _fail(where, "max_batch_size", "must be >= 0")
    given = mbs > 0 or bool(max_batch_size_given)
    batch: int | None = None  # the model decides (Triton's auto-complete, or ours)
    if mbs > 0:
        batch = mbs
    elif given or (config.input and config.output):
        batch = 0  # no batch axis: dims are the model's whole shapes
    if config.HasField("dynamic_batching") and batch == 0:
        raise _fail(
            where,
            "max_batch_size",
            "0 (a model without a batch dimension) cannot have dynamic_batching: give the "
            "largest batch, or drop dynamic_batching",
        )
    check_declared(config, where)
    extra = check_fields(
        config, where, python=python, stateful=config.HasField("sequence_batching")
    )
    fields: dict[str, Any] = {}
    if config.HasField("sequence_batching"):
        sb = config.sequence_batching
        fields["sequence"] = sequence_config(sb, where, mbs, 1)
        strategy = sb.direct if sb.WhichOneof("strategy_choice") != "oldest" else sb.oldest
        if strategy.max_queue_delay_microseconds:  # how long a batch of steps waits to fill
            fields["timeout"] = strategy.max_queue_delay_microseconds / 1e6
    if config.HasField("dynamic_batching"):
        fields = dynamic_batching(config.dynamic_batching, where, mbs)
        preferred = fields.get("preferred_batch_sizes", ())
        if len(preferred) == 1:
            batch = preferred[0]  # the one size is the batch run
    ragged = ragged_spec(config, where)
    if ragged is not None:
        batch = 0  # the model's own shapes: the ragged batcher concatenates the requests
        fields.pop("preferred_batch_sizes", None)
    return ModelSettings(
        ragged=ragged,
        config=config,
        source=source,
        origin=origin,
        python=python,
        decoupled=decoupled,
        optimization_level=extra.optimization_level,
        notes=extra.notes,
        batch_size=batch,
        max_batch_size=mbs or None,
        replicas=_replicas(config.instance_group, where, python=python),
        version_policy=_version_policy(config, where),
        **fields,
    )


def _ensemble_settings(
    config: pb.ModelConfig, source: Path | None, origin: str | None, name: str
) -> ModelSettings:
    """An ensemble's settings: its steps checked (:func:`~.ensemble.ensemble_config`), its
    inputs and outputs as any config's; nothing of its own runs, so no runner settings.

    Raises:
        ConfigurationError: a bad step, or a field an ensemble cannot have.
    """
    where = source or origin or "model config"
    if not config.HasField("ensemble_scheduling"):
        raise _fail(
            where,
            "ensemble_scheduling",
            f"ensemble scheduling must be set for ensemble '{name}' whose platform is "
            f"{ENSEMBLE_PLATFORM}",
        )
    if config.max_batch_size < 0:
        raise _fail(where, "max_batch_size", "must be >= 0")
    if config.backend:
        raise _fail(where, "backend", f"{config.backend!r} with platform 'ensemble': leave it out")
    ensemble = ensemble_config(config, name, where)
    check_declared(config, where)
    if not config.input or not config.output:
        raise _fail(where, "input", "an ensemble lists its inputs and outputs")
    return ModelSettings(
        config=config,
        source=source,
        origin=origin,
        ensemble=ensemble,
        batch_size=config.max_batch_size,
        max_batch_size=config.max_batch_size or None,
        version_policy=_version_policy(config, where),
    )


def _replicas(
    groups: Sequence[pb.ModelInstanceGroup], where: Path | str, *, python: bool = False
) -> int | None:
    """The instances ``groups`` ask for; a python model may also say ``KIND_MODEL`` (its
    ``model.py`` places itself: here, on the CPU)."""
    if not groups:
        return None
    total = 0
    for i, group in enumerate(groups):
        at = f"instance_group[{i}]"
        if group.kind not in _KINDS and not (
            python and group.kind == pb.ModelInstanceGroup.KIND_MODEL
        ):
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


class _Served(Protocol):
    """What :func:`served_config` reads of a repository's model entry."""

    name: str
    served: Any
    runner: Any


def served_config(entry: _Served) -> pb.ModelConfig:
    """The ``ModelConfig`` of what ``entry`` (a model version the repository resolved, so an
    unknown model or version was already a ``ModelNotFoundError``, 404) serves.

    Raises:
        ModelUnavailableError: the model is not loaded (503).
    """
    served = entry.served
    if served is None or entry.runner is None:
        raise ModelUnavailableError(f"model {entry.name!r} is not loaded")
    return served  # type: ignore[no-any-return]

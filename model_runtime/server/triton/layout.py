"""Where a model's files and settings are: our flat layout and Triton's repository layout.

Flat: ``NAME.mrx`` or ``NAME.onnx``, with an optional ``NAME.toml`` beside it (Triton's
``ModelConfig`` fields as TOML, see :func:`~.config.parse_toml`); one version, ``1``.

Triton: a directory ``NAME/`` with ``config.pbtxt`` (optional, as Triton's for ONNX models)
and version directories ``NAME/<N>/model.mrx`` or ``NAME/<N>/model.onnx`` (a python model's,
``backend: "python"``: ``NAME/<N>/model.py``; or the config's ``default_model_filename``); the
config's ``version_policy`` picks the versions served.

An output's ``label_filename`` names a file beside the config (the model's directory; a flat
model's: the directory of its file), one class label per line, read once when the model is
planned and at most :data:`MAX_LABELS_BYTES` long.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from model_runtime.errors import ConfigurationError
from model_runtime.server.triton import model_config_pb2 as pb
from model_runtime.server.triton.config import CONFIG_FILE, parse_pbtxt, parse_toml, settings_of
from model_runtime.server.triton.settings import ModelSettings

__all__ = [
    "MAX_LABELS_BYTES",
    "MODEL_FILES",
    "PYTHON_MODEL_FILES",
    "ModelPlan",
    "fingerprint",
    "is_model_dir",
    "model_batch",
    "onnx_batchable",
    "onnx_fixed_batch",
    "plan_model",
    "read_labels",
    "settings_file",
]

#: The file names a Triton version directory is searched for, in order.
MODEL_FILES = ("model.mrx", "model.onnx")
#: ... and a python model's (``backend: "python"``).
PYTHON_MODEL_FILES = ("model.py",)
#: A labels file longer than this is refused (ImageNet's 1000 labels take ~30 KB).
MAX_LABELS_BYTES = 16 * 1024 * 1024
Stat = tuple[int, int, int] | None


@dataclass(frozen=True, slots=True)
class ModelPlan:
    """What to load for a model: its settings and the file of each version served
    (highest version first)."""

    settings: ModelSettings
    files: dict[str, Path]


def is_model_dir(path: Path) -> bool:
    """True when ``path`` is a Triton model directory: a ``config.pbtxt`` or a numeric
    version directory inside."""
    if not path.is_dir():
        return False
    if (path / CONFIG_FILE).is_file():
        return True
    return any(p.name.isdigit() and p.is_dir() for p in path.iterdir())


def _python_only(source: Path) -> bool:
    """``source``'s version directories hold a ``model.py`` and no other model file."""
    versions = [p for p in source.iterdir() if p.name.isdigit() and p.is_dir()]
    has = {n for v in versions for n in (*PYTHON_MODEL_FILES, *MODEL_FILES) if (v / n).is_file()}
    return bool(has) and has <= set(PYTHON_MODEL_FILES)


def settings_file(model_file: Path) -> Path:
    """A flat model's optional TOML: beside the model file, with its stem."""
    return model_file.with_suffix(".toml")


def plan_model(name: str, source: Path, override: ModelSettings | None = None) -> ModelPlan:
    """The settings and version files of the model ``name`` at ``source`` (a model file or a
    Triton model directory); ``override`` (a load's configuration override) replaces the
    model's own ``config.pbtxt`` or TOML, which is then not read.

    Raises:
        ConfigurationError: a bad ``config.pbtxt`` or TOML, or no version to serve.
    """
    if not source.is_dir():
        toml = settings_file(source)
        if override is not None:
            settings = override
        else:
            settings = parse_toml(toml) if toml.is_file() else ModelSettings(pb.ModelConfig())
        settings = replace(settings, labels=read_labels(settings, source.parent))
        return ModelPlan(settings, {"1": source})
    config = source / CONFIG_FILE
    if override is not None:
        settings = override
    elif config.is_file():
        settings = parse_pbtxt(config, name)
    elif _python_only(source):  # Triton's rule: a model.py and no config is a python model
        python = pb.ModelConfig(name=name, backend="python")
        settings = replace(settings_of(python, origin=f"{source} (no config.pbtxt)"), source=config)
    else:
        settings = ModelSettings(pb.ModelConfig(), source=config)
    settings = replace(settings, triton=True, labels=read_labels(settings, source))
    found = [int(p.name) for p in source.iterdir() if p.name.isdigit() and p.is_dir()]
    chosen = settings.version_policy.select(v for v in found if v > 0)
    if not chosen:
        policy = settings.version_policy
        raise ConfigurationError(
            f"{source}: no version to serve (version_policy {policy.kind}, version "
            f"directories {sorted(found)})"
        )
    if settings.config.default_model_filename:
        names: tuple[str, ...] = (settings.config.default_model_filename,)
    else:
        names = PYTHON_MODEL_FILES if settings.python else MODEL_FILES
    files = {}
    for version in chosen:
        vdir = source / str(version)
        if settings.ensemble is not None:  # an ensemble runs other models: no file of its own
            files[str(version)] = vdir
            continue
        path = next((vdir / n for n in names if (vdir / n).is_file()), None)
        if path is None:
            raise ConfigurationError(f"{vdir}: no model file ({' or '.join(names)})")
        files[str(version)] = path
    return ModelPlan(settings, files)


def _stat(path: Path) -> Stat:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


def fingerprint(source: Path) -> tuple[object, ...] | None:
    """What tells one state of a model's files from the next (None: the model is gone): the
    model file and its TOML, or a Triton directory's config and version files."""
    if not source.is_dir():
        stat = _stat(source)
        return None if stat is None else (stat, _stat(settings_file(source)))
    try:
        versions = sorted(p for p in source.iterdir() if p.name.isdigit() and p.is_dir())
        files = [(str(f), _stat(f)) for v in versions for f in sorted(v.iterdir())]
    except OSError:
        return None
    return (_stat(source / CONFIG_FILE), *files)


def onnx_fixed_batch(path: Path, axis: int = 0) -> int | None:
    """The batch an ``.onnx`` model's first input fixes (None: dynamic, 1, or not ONNX):
    such a model is compiled for its own batch, whatever the server-wide batch size."""
    if path.suffix != ".onnx":
        return None
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # the compiler reports a broken file with its own words
        return None
    weights = {t.name for t in model.graph.initializer}
    for value in model.graph.input:
        if value.name in weights:
            continue
        dims = value.type.tensor_type.shape.dim
        if len(dims) > axis and dims[axis].HasField("dim_value") and dims[axis].dim_value > 1:
            return int(dims[axis].dim_value)
        return None
    return None


def read_labels(settings: ModelSettings, directory: Path) -> dict[str, tuple[str, ...]]:
    """Each output's class labels, from its ``label_filename`` in ``directory``: one label
    per line, UTF-8.

    Raises:
        ConfigurationError: a labels file that is missing, unreadable, not UTF-8, outside
            ``directory`` or longer than :data:`MAX_LABELS_BYTES`; naming the field.
    """
    where = settings.source or settings.origin or "model config"
    labels: dict[str, tuple[str, ...]] = {}
    for i, output in enumerate(settings.config.output):
        if not output.label_filename:
            continue
        at = f"{where}: output[{i}].label_filename"
        path = directory / output.label_filename
        try:
            if directory.resolve() not in path.resolve().parents:
                raise ConfigurationError(f"{at}: {path} is outside {directory}")
            with open(path, "rb") as f:
                data = f.read(MAX_LABELS_BYTES + 1)
        except OSError as exc:
            raise ConfigurationError(f"{at}: cannot read {path}: {exc}") from exc
        if len(data) > MAX_LABELS_BYTES:
            raise ConfigurationError(f"{at}: {path} is over {MAX_LABELS_BYTES} bytes")
        try:
            labels[output.name] = tuple(data.decode("utf-8").splitlines())
        except UnicodeDecodeError as exc:
            raise ConfigurationError(f"{at}: {path} is not UTF-8: {exc}") from exc
    return labels


def _first_dim_variable(value: Any) -> bool:
    tensor = value.type.tensor_type if value.type.HasField("tensor_type") else None
    if tensor is None or not tensor.HasField("shape") or not tensor.shape.dim:
        return False
    return not tensor.shape.dim[0].HasField("dim_value")


def onnx_batchable(path: Path) -> bool | None:
    """Whether an ``.onnx`` model can have a batch axis, as Triton decides for ONNX: every
    input's and output's first dimension is variable (None: not ONNX, or unreadable)."""
    if path.suffix != ".onnx":
        return None
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # the compiler reports a broken file with its own words
        return None
    graph = model.graph
    if any(not o.type.tensor_type.HasField("shape") for o in graph.output):
        try:  # outputs without a declared shape: what inference finds, as onnxruntime reports
            graph = onnx.shape_inference.infer_shapes(model).graph
        except Exception:
            pass
    weights = {t.name for t in graph.initializer}
    values = [v for v in graph.input if v.name not in weights] + list(graph.output)
    return bool(values) and all(_first_dim_variable(v) for v in values)


def model_batch(path: Path, settings: ModelSettings, axis: int = 0) -> int | None:
    """The batch to compile the ``.onnx`` at ``path`` for: the settings' batch, else (in a
    Triton layout) 0 when the model cannot have a batch axis (:func:`onnx_batchable`), else
    the batch the model fixes itself (:func:`onnx_fixed_batch`); None: the server's."""
    if settings.batch_size is not None:
        return settings.batch_size
    if settings.triton and onnx_batchable(path) is False:
        return 0
    return onnx_fixed_batch(path, axis)

"""Starting one version of a python model (``backend: "python"``): its config completed by the
model's own ``auto_complete_config``, checked as any ``config.pbtxt`` is, and its instances
started (:class:`~model_runtime.python_backend.runner.PythonModelRunner`), with the hooks
through which the model reaches the daemon (BLS calls, the model loading API), by the Python
its ``EXECUTION_ENV_PATH`` parameter names (:mod:`~model_runtime.python_backend.environment`)
or the daemon's own."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from google.protobuf import json_format

from model_runtime.errors import ConfigurationError
from model_runtime.python_backend.autocomplete import auto_complete_config
from model_runtime.python_backend.environment import ENV_PARAMETER, interpreter
from model_runtime.python_backend.messages import ControlHook, InferHook
from model_runtime.python_backend.runner import PythonModelRunner, RunnerSettings
from model_runtime.server.repository.entries import ModelEntry
from model_runtime.server.repository.versions import StartedVersion
from model_runtime.server.tensors.request import TensorSpec
from model_runtime.server.triton import model_config_pb2 as pb
from model_runtime.server.triton.config import config_json, settings_of
from model_runtime.server.triton.settings import ModelSettings

__all__ = ["PythonHooks", "start_python_version"]


@dataclass(slots=True)
class PythonHooks:
    """How python models reach the daemon: ``infer`` runs their BLS calls (through the data
    plane), ``control`` the model loading API. None: refused with a text that says so."""

    infer: InferHook | None = None
    control: ControlHook | None = None


def _specs(tensors: Any, batched: bool) -> tuple[TensorSpec, ...]:
    out = []
    for t in tensors:
        datatype = pb.DataType.Name(t.data_type).removeprefix("TYPE_")
        datatype = "BYTES" if datatype == "STRING" else datatype
        shape = ((-1,) if batched else ()) + tuple(int(d) for d in t.dims)
        optional = bool(getattr(t, "optional", False))
        out.append(TensorSpec(t.name, datatype, shape, batched=batched, optional=optional))
    return tuple(out)


async def start_python_version(
    entry: ModelEntry,
    source: Path,
    settings: ModelSettings,
    *,
    hooks: PythonHooks,
    version: str = "1",
    auto_complete: bool = True,
    env_cache: Path | None = None,
) -> StartedVersion:
    """Start version ``version`` of the python model ``entry`` from its ``model.py`` at
    ``source`` (``NAME/VERSION/model.py``): complete the config (its ``auto_complete_config``,
    not called when ``auto_complete`` is off, as Triton's ``--disable-auto-complete-config``),
    check it, start every instance. An archived ``EXECUTION_ENV_PATH`` is unpacked into
    ``env_cache``. The runner is closed again if anything after its start fails.

    Raises:
        ConfigurationError: the completed config is not one we serve (the field named).
        ModelLoadError: ``model.py`` did not import or ``initialize`` failed (its text); the
            ``EXECUTION_ENV_PATH`` environment is missing, has no Python or no numpy.
    """
    model_dir = source.parent.parent
    where = settings.source or settings.origin or model_dir / "config.pbtxt"
    given = config_json(settings.config)
    given["name"] = entry.name
    python = sys.executable
    env = settings.config.parameters.get(ENV_PARAMETER)
    if env is not None and env.string_value:
        python = await anyio.to_thread.run_sync(
            interpreter, entry.name, env.string_value, model_dir, env_cache
        )
    completed = given
    if auto_complete:
        completed = await auto_complete_config(model_dir, int(version), given, python=python)
    config = pb.ModelConfig()
    try:
        json_format.ParseDict(completed, config)
    except json_format.ParseError as exc:
        raise ConfigurationError(f"{where}: auto_complete_config made {exc}") from None
    config.name, config.backend = entry.name, "python"
    for group in config.instance_group:
        group.count = group.count or 1  # Triton's default: one instance per group
    if not config.instance_group:
        config.instance_group.add(count=1, kind=pb.ModelInstanceGroup.KIND_CPU)
    checked = settings_of(config, settings.source, origin=settings.origin)
    if not config.input or not config.output:
        raise ConfigurationError(
            f"{where}: a python model lists its inputs and outputs (in config.pbtxt, or by "
            "its auto_complete_config)"
        )
    if checked.sequence is not None:
        raise ConfigurationError(f"{where}: sequence_batching is not served for python models")
    runner = PythonModelRunner(
        config_json(config),
        model_dir,
        int(version),
        settings=RunnerSettings(python=python),
        infer_hook=hooks.infer,
        control_hook=hooks.control,
    )
    await runner.start()
    try:
        batched = config.max_batch_size > 0
        inputs, outputs = _specs(config.input, batched), _specs(config.output, batched)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await runner.close()
        raise
    return StartedVersion(runner, inputs, outputs, config)

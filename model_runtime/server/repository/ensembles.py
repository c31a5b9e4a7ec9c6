"""Starting one version of an ensemble (``platform: "ensemble"``): its composing models loaded
first (Triton loads an ensemble's dependencies with it), its steps checked against their
served configs (:func:`~model_runtime.server.triton.ensemble.check_against`, and Triton's
rule on decoupled steps: :func:`~model_runtime.server.triton.ensemble.check_decoupled_flow`),
and its :class:`~model_runtime.server.ensemble.EnsembleRunner` built over the step caller the
data plane supplies."""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from model_runtime.errors import ConfigurationError, ModelRuntimeError
from model_runtime.server.ensemble import Composing, EnsembleRunner, StepCaller
from model_runtime.server.repository.entries import ModelEntry, ModelState
from model_runtime.server.repository.versions import StartedVersion
from model_runtime.server.tensors.request import TensorSpec
from model_runtime.server.triton import model_config_pb2 as pb
from model_runtime.server.triton.ensemble import (
    EnsembleStep,
    check_against,
    check_decoupled_flow,
)
from model_runtime.server.triton.settings import ModelSettings

__all__ = ["composing_not_ready", "ensemble_users", "start_ensemble_version"]

#: The ensembles whose load is under way in this task, outermost first: a composing model
#: that is one of them is a circle of ensembles (it would wait for its own lock).
_LOADING: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar(
    "ensembles_loading", default=()
)


def _specs(tensors: Any, batched: bool) -> tuple[TensorSpec, ...]:
    out = []
    for t in tensors:
        datatype = pb.DataType.Name(t.data_type).removeprefix("TYPE_")
        datatype = "BYTES" if datatype == "STRING" else datatype
        shape = ((-1,) if batched else ()) + tuple(int(d) for d in t.dims)
        out.append(
            TensorSpec(
                t.name, datatype, shape, batched=batched, optional=getattr(t, "optional", False)
            )
        )
    return tuple(out)


def _version_of(entry: ModelEntry, step: EnsembleStep) -> ModelEntry | None:
    return entry if step.version < 0 else entry.version_entry(str(step.version))


def composing_not_ready(entry: ModelEntry | None, model: str, version: int) -> str | None:
    """Why version ``version`` (-1: latest) of the composing ``model`` (its ``entry``, None:
    unknown) cannot take a step now, or None."""
    if entry is None:
        return f"model '{model}' is not in the repository"
    served = entry if version < 0 else entry.version_entry(str(version))
    if served is None:
        return f"version {version} of model '{model}' is not served"
    if served.is_ready:
        return None
    reason = f": {served.reason}" if served.reason else ""
    return f"model '{model}' is {served.state.value}{reason}"


async def start_ensemble_version(
    entry: ModelEntry,
    settings: ModelSettings,
    *,
    load: Callable[[str], Awaitable[ModelEntry]],
    call: StepCaller | None,
    composing: Composing,
) -> StartedVersion:
    """Start the ensemble ``entry`` with ``settings``: each composing model loaded by ``load``
    (which leaves a loaded one as it is), the steps checked against what they serve, and the
    runner built over ``call``.

    Raises:
        ConfigurationError: a composing model failed to load, is a circle of ensembles, lacks
            the version a step names, its tensors do not fit the steps, or a step takes
            tensors from two decoupled steps (Triton's words).
        ModelRuntimeError: no step caller (the repository is not served by a data plane).
    """
    ensemble = settings.ensemble
    assert ensemble is not None
    if call is None:
        raise ModelRuntimeError(f"ensemble '{entry.name}' needs a data plane to run its steps")
    chain = _LOADING.get()
    loaded: dict[str, ModelEntry] = {}
    token = _LOADING.set((*chain, entry.name))
    try:
        for model in ensemble.models:
            if model in chain or model == entry.name:
                circle = " -> ".join([*chain, entry.name, model])
                raise ConfigurationError(f"circular dependency between ensembles: {circle}")
            try:
                loaded[model] = await load(model)
            except ModelRuntimeError as exc:
                raise ConfigurationError(
                    f"in ensemble {entry.name}, composing model '{model}' failed to load: {exc}"
                ) from exc
    finally:
        _LOADING.reset(token)

    def served(step: EnsembleStep) -> pb.ModelConfig:
        version = _version_of(loaded[step.model], step)
        if version is None or version.served is None or version.state is not ModelState.READY:
            raise ConfigurationError(
                f"in ensemble {entry.name}, step {step.index}: version {step.version} of model "
                f"'{step.model}' is not served"
            )
        config: pb.ModelConfig = version.served  # type: ignore[assignment]
        return config

    check_against(ensemble, settings.config, served)
    config = pb.ModelConfig()
    config.CopyFrom(settings.config)
    config.name = entry.name
    decoupled = frozenset(
        s.index for s in ensemble.steps if served(s).model_transaction_policy.decoupled
    )
    check_decoupled_flow(ensemble, decoupled)
    config.model_transaction_policy.decoupled = bool(decoupled)
    batched = config.max_batch_size > 0
    reshapes = {
        t.name: (tuple(t.dims), tuple(t.reshape.shape))
        for t in (*config.input, *config.output)
        if t.HasField("reshape")
    }
    runner = EnsembleRunner(ensemble, call, composing, reshapes, batched, decoupled)
    inputs, outputs = _specs(config.input, batched), _specs(config.output, batched)
    return StartedVersion(runner, inputs, outputs, config)  # type: ignore[arg-type]


def ensemble_users(entries: Iterable[ModelEntry], model: str) -> list[str]:
    """The loaded ensembles among ``entries`` that run ``model`` (Triton's
    ``unload_dependents`` unloads a composing model only when none is left)."""
    return [
        e.name
        for e in entries
        if e.runner is not None and e.settings is not None and e.settings.ensemble
        if model in e.settings.ensemble.models
    ]

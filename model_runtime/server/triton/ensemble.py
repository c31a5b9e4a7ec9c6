"""An ensemble's configuration (``platform: "ensemble"``, ``ensemble_scheduling { step [...] }``):
its steps read from the ``ModelConfig`` and checked on their own, as Triton checks them when it
reads the config (every step names a model and maps inputs and outputs, each ensemble input is
used, each ensemble output written by some step, no tensor written twice, no step waits on
itself), in Triton's words. The checks against the composing models' own configs (their
tensors, datatypes and shapes) are :func:`check_against`'s, and those of the flow from their
decoupled steps :func:`check_decoupled_flow`'s, made once those models are loaded; running the
steps is :mod:`model_runtime.server.ensemble`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from model_runtime.errors import ConfigurationError
from model_runtime.server.triton import model_config_pb2 as pb

__all__ = [
    "ENSEMBLE_PLATFORM",
    "EnsembleConfig",
    "EnsembleStep",
    "check_against",
    "check_decoupled_flow",
    "ensemble_config",
]

ENSEMBLE_PLATFORM = "ensemble"


@dataclass(frozen=True, slots=True)
class EnsembleStep:
    """One step: the model it runs (``version`` -1: the latest served), which ensemble tensor
    feeds each of the model's inputs (``inputs``: model input -> ensemble tensor) and which
    ensemble tensor each of its outputs becomes (``outputs``: model output -> ensemble tensor)."""

    index: int
    model: str
    version: int
    inputs: Mapping[str, str]
    outputs: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class EnsembleConfig:
    """An ensemble's steps, in the config's order, and its own inputs and outputs."""

    name: str
    steps: tuple[EnsembleStep, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    @property
    def models(self) -> list[str]:
        """The composing models, each once, in the order the steps name them."""
        return list(dict.fromkeys(s.model for s in self.steps))


def _fail(where: Path | str, why: str) -> ConfigurationError:
    return ConfigurationError(f"{where}: ensemble_scheduling: {why}")


def ensemble_config(config: pb.ModelConfig, name: str, where: Path | str) -> EnsembleConfig:
    """The steps of ``config`` (an ensemble named ``name``, read from ``where``), checked on
    their own as Triton's ``ValidateEnsembleSchedulingConfig`` does, in its words.

    Raises:
        ConfigurationError: the config asks for what Triton refuses (named in its text).
    """
    if config.platform != ENSEMBLE_PLATFORM:
        raise _fail(
            where,
            f"ensemble scheduling cannot be set for model '{name}' whose platform is not "
            f"{ENSEMBLE_PLATFORM}",
        )
    refused = (
        (bool(config.instance_group), "instance group should not be specified for ensemble"),
        (config.HasField("optimization"), "optimization should not be specified for ensemble"),
        (bool(config.model_warmup), "model_warmup can not be specified for ensemble"),
    )
    for given, text in refused:
        if given:
            raise _fail(where, f"{text} '{name}'")
    if not config.ensemble_scheduling.step:
        raise _fail(where, f"must specify 'step' for ensemble '{name}'")
    steps = []
    written: dict[str, int] = {}
    for i, step in enumerate(config.ensemble_scheduling.step):
        for field in ("model_name", "input_map", "output_map"):
            if not getattr(step, field):
                raise _fail(where, f"must specify '{field}' in step {i} of ensemble '{name}'")
        if step.model_name == name:
            raise _fail(where, f"ensemble '{name}' step {i} runs the ensemble itself (a cycle)")
        for tensor in step.output_map.values():
            if tensor in written:
                raise _fail(
                    where,
                    f"ensemble tensor '{tensor}' can appear in an output map only once for "
                    f"ensemble '{name}' step {i}",
                )
            written[tensor] = i
        steps.append(
            EnsembleStep(
                i,
                step.model_name,
                int(step.model_version),
                dict(step.input_map),
                dict(step.output_map),
            )
        )
    inputs = tuple(t.name for t in config.input)
    outputs = tuple(t.name for t in config.output)
    read = {t for s in steps for t in s.inputs.values()}
    for tensor in inputs:
        if tensor not in read and tensor not in written:
            raise _fail(where, f"ensemble input '{tensor}' for ensemble {name}' is not used")
    _check_flow(name, where, steps, inputs, outputs, read, written)
    return EnsembleConfig(name, tuple(steps), inputs, outputs)


def _check_flow(
    name: str,
    where: Path | str,
    steps: list[EnsembleStep],
    inputs: tuple[str, ...],
    outputs: tuple[str, ...],
    read: set[str],
    written: Mapping[str, int],
) -> None:
    """Every step can run (its inputs come from the ensemble's inputs or earlier steps: a
    cycle never can), every output is written, and no tensor is left unread."""
    ready = set(inputs)
    pending = list(steps)
    progress = True
    while pending and progress:
        progress = False
        for step in list(pending):
            if all(t in ready for t in step.inputs.values()):
                ready.update(step.outputs.values())
                pending.remove(step)
                progress = True
    for tensor in outputs:
        if tensor not in read and tensor not in written:
            raise _fail(where, f"ensemble output '{tensor}' for ensemble {name}' is not used")
        if tensor not in ready:
            raise _fail(where, f"output '{tensor}' for ensemble '{name}' is not written")
    for step in pending:
        missing = sorted(t for t in step.inputs.values() if t not in ready)
        raise _fail(
            where,
            f"ensemble tensor '{missing[0]}' is unused in ensemble '{name}' (step {step.index} "
            f"of model '{step.model}' waits on it, and it is never written: a cycle, or a "
            "tensor no step writes)",
        )
    for tensor in sorted((read | set(written)) - set(outputs)):
        if tensor not in read:
            raise _fail(where, f"ensemble tensor '{tensor}' is unused in ensemble '{name}'")


#: A composing model's config: its inputs and outputs (name -> (datatype, full dims, optional))
Tensors = Mapping[str, tuple[int, tuple[int, ...], bool]]


def _tensors(tensors: object, batching: bool) -> dict[str, tuple[int, tuple[int, ...], bool]]:
    out = {}
    for t in tensors:  # type: ignore[attr-defined]
        dims = tuple(t.reshape.shape) if t.HasField("reshape") else tuple(t.dims)
        full = ((-1,) if batching else ()) + dims
        out[t.name] = (int(t.data_type), full, bool(getattr(t, "optional", False)))
    return out


def _same_shape(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return len(a) == len(b) and all(x == y or -1 in (x, y) for x, y in zip(a, b, strict=True))


def check_against(
    ensemble: EnsembleConfig,
    config: pb.ModelConfig,
    composing: Callable[[EnsembleStep], pb.ModelConfig],
) -> None:
    """Check ``ensemble`` (whose config is ``config``) against its composing models' configs
    (``composing(step)``, as served), as Triton's ``ValidateEnsembleConfig`` does: each step
    maps every required input of its model once and only names tensors its model has, the
    batch fits, and every ensemble tensor has one datatype and one shape wherever it is used.

    Raises:
        ConfigurationError: what Triton refuses, in its words.
    """
    name = ensemble.name
    batching = config.max_batch_size > 0
    seen: dict[str, tuple[int, tuple[int, ...], str]] = {}
    for tensor, (dtype, dims, _) in {
        **_tensors(config.input, batching),
        **_tensors(config.output, batching),
    }.items():
        seen[tensor] = (dtype, dims, name)

    def agree(tensor: str, dtype: int, dims: tuple[int, ...], model: str) -> None:
        known = seen.get(tensor)
        if known is None:
            seen[tensor] = (dtype, dims, model)
            return
        at = f"in ensemble {name}, ensemble tensor {tensor}: "
        if known[0] != dtype:
            raise ConfigurationError(
                f"{at}inconsistent data type: {pb.DataType.Name(known[0])} is inferred from "
                f"model {known[2]} while {pb.DataType.Name(dtype)} is inferred from model {model}"
            )
        if not _same_shape(known[1], dims) and not _same_shape(known[1][1:], dims[1:]):
            raise ConfigurationError(
                f"{at}inconsistent shape: {list(known[1])} is inferred from model {known[2]} "
                f"while {list(dims)} is inferred from model {model}"
            )

    for step in ensemble.steps:
        model_config = composing(step)
        model = step.model
        mbs = model_config.max_batch_size
        if mbs != 0 and mbs < config.max_batch_size:
            raise ConfigurationError(
                f"ensemble {name} allows maximum batch size {config.max_batch_size}, but it "
                f"contains model {model} which only allows maximum batch size to be {mbs}"
            )
        step_batching = mbs > 0
        ins = _tensors(model_config.input, step_batching)
        outs = _tensors(model_config.output, step_batching)
        for model_input, tensor in step.inputs.items():
            if model_input not in ins:
                raise ConfigurationError(
                    f"in ensemble {name}, ensemble tensor {tensor} is mapping to non-existing "
                    f"input {model_input} in model {model}"
                )
            dtype, dims, _ = ins[model_input]
            agree(tensor, dtype, dims, model)
        for model_input, (_, _, optional) in ins.items():
            if model_input not in step.inputs and not optional:
                raise ConfigurationError(
                    f"in ensemble {name}, input {model_input} in model {model} is not mapped "
                    "to any ensemble tensors"
                )
        for model_output, tensor in step.outputs.items():
            if model_output not in outs:
                raise ConfigurationError(
                    f"in ensemble {name}, ensemble tensor {tensor} is mapped from non-existing "
                    f"output {model_output} in model {model}"
                )
            dtype, dims, _ = outs[model_output]
            agree(tensor, dtype, dims, model)


def check_decoupled_flow(ensemble: EnsembleConfig, decoupled: frozenset[int]) -> None:
    """Refuse what Triton's ``ValidateEnsembleConfig`` refuses of an ensemble whose steps
    ``decoupled`` (indices) are decoupled: each tensor comes from the responses of one
    decoupled step at most (the nearest one upstream; none for the ensemble's inputs), and a
    step, like the ensemble's outputs, takes all its tensors from the same one (the responses
    of two streams, or of a stream and the request, have no pairing).

    Raises:
        ConfigurationError: a step, or the outputs, would mix them (Triton's words, the step
            and the decoupled steps named).
    """
    name = ensemble.name
    origin: dict[str, EnsembleStep | None] = {t: None for t in ensemble.inputs}

    def mixed(tensors: Mapping[str, str]) -> str | None:
        """Where each of ``tensors`` comes from, when not all from the same place."""
        known = sorted({t for t in tensors.values() if t in origin})
        if len({id(origin[t]) for t in known}) < 2:
            return None
        return ", ".join(f"'{t}' from {_source(origin[t])}" for t in known)

    pending = list(ensemble.steps)
    progress = True
    while pending and progress:
        progress = False
        for step in list(pending):
            if not all(t in origin for t in step.inputs.values()):
                continue
            pending.remove(step)
            progress = True
            why = mixed(step.inputs)
            if why is not None:
                raise ConfigurationError(
                    f"in ensemble {name}, step {step.index} of model '{step.model}' receives "
                    f"inputs originated from different decoupled models: {why}"
                )
            ups = [origin[t] for t in step.inputs.values()]
            up = step if step.index in decoupled else (ups[0] if ups else None)
            for tensor in step.outputs.values():
                origin[tensor] = up
    why = mixed({t: t for t in ensemble.outputs})
    if why is not None:
        raise ConfigurationError(
            f"in ensemble {name}, the ensemble's outputs are originated from different "
            f"decoupled models: {why}"
        )


def _source(step: EnsembleStep | None) -> str:
    return "the ensemble's inputs" if step is None else f"step {step.index} (model '{step.model}')"

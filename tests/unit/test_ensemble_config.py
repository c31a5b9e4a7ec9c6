"""An ensemble's config is checked as Triton checks it, in Triton's words: on its own when it is
read (steps, maps, every input used, every output written, no cycle), and against its composing
models' configs once they are loaded (their tensors, datatypes and shapes)."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import text_format

from model_runtime.errors import ConfigurationError
from model_runtime.server.triton import model_config_pb2 as pb
from model_runtime.server.triton.config import settings_of
from model_runtime.server.triton.ensemble import (
    EnsembleConfig,
    EnsembleStep,
    check_against,
    check_decoupled_flow,
)

IO = """
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def step(model: str, ins: dict[str, str], outs: dict[str, str], version: int = -1) -> str:
    maps = "".join(f'input_map {{ key: "{k}" value: "{v}" }} ' for k, v in ins.items())
    maps += "".join(f'output_map {{ key: "{k}" value: "{v}" }} ' for k, v in outs.items())
    return f'{{ model_name: "{model}" model_version: {version} {maps}}}'


def ensemble(*steps: str, extra: str = "", io: str = IO) -> pb.ModelConfig:
    text = (
        f'platform: "ensemble" {io} {extra} ensemble_scheduling {{ step [ {", ".join(steps)} ] }}'
    )
    config = pb.ModelConfig()
    text_format.Parse(text, config)
    return config


CHAIN = (step("a", {"x": "IN"}, {"y": "T"}), step("b", {"x": "T"}, {"y": "OUT"}))


def test_a_chain_of_steps_is_read() -> None:
    settings = settings_of(ensemble(*CHAIN), name="e")
    assert settings.ensemble is not None
    assert [s.model for s in settings.ensemble.steps] == ["a", "b"]
    assert settings.ensemble.models == ["a", "b"]
    assert settings.ensemble.steps[1].inputs == {"x": "T"}
    assert settings.batch_size == 8


@pytest.mark.parametrize(
    ("config", "text"),
    [
        (
            ensemble(step("a", {"x": "IN"}, {"y": "T"}), step("b", {"x": "T"}, {"y": "T"})),
            "ensemble tensor 'T' can appear in an output map only once for ensemble 'e' step 1",
        ),
        (
            ensemble(step("a", {"x": "IN"}, {"y": "T"})),
            "ensemble output 'OUT' for ensemble e' is not used",
        ),
        (
            ensemble(step("a", {"x": "IN", "w": "OUT"}, {"y": "T"})),
            "output 'OUT' for ensemble 'e' is not written",
        ),
        (
            ensemble(step("a", {"x": "IN"}, {"y": "OUT"}), step("b", {"x": "U"}, {"y": "U2"})),
            "ensemble tensor 'U' is unused in ensemble 'e'",
        ),
        (
            ensemble(
                step("a", {"x": "T2"}, {"y": "T"}),
                step("b", {"x": "T"}, {"y": "T2"}),
                step("c", {"x": "IN"}, {"y": "OUT"}),
            ),
            "is unused in ensemble 'e'",  # a cycle: T and T2 wait on each other
        ),
        (
            ensemble(step("a", {"x": "T"}, {"y": "OUT"})),
            "ensemble input 'IN' for ensemble e' is not used",
        ),
        (ensemble(step("", {"x": "IN"}, {"y": "OUT"})), "must specify 'model_name' in step 0"),
        (ensemble(step("a", {}, {"y": "OUT"})), "must specify 'input_map' in step 0"),
        (ensemble(step("a", {"x": "IN"}, {})), "must specify 'output_map' in step 0"),
        (ensemble(step("e", {"x": "IN"}, {"y": "OUT"})), "runs the ensemble itself"),
        (
            ensemble(*CHAIN, extra="instance_group [ { count: 1 } ]"),
            "instance group should not be specified for ensemble 'e'",
        ),
        (
            ensemble(*CHAIN, extra="model_warmup [ { name: 'w' } ]"),
            "model_warmup can not be specified for ensemble 'e'",
        ),
    ],
)
def test_a_bad_ensemble_is_refused_in_tritons_words(config: pb.ModelConfig, text: str) -> None:
    with pytest.raises(ConfigurationError, match="ensemble_scheduling") as info:
        settings_of(config, name="e")
    assert text in str(info.value)


def test_the_platform_and_the_scheduling_go_together() -> None:
    config = ensemble(*CHAIN)
    config.platform = "onnxruntime_onnx"
    with pytest.raises(ConfigurationError, match="whose platform is not ensemble"):
        settings_of(config, name="e")
    bare = pb.ModelConfig(platform="ensemble")
    with pytest.raises(ConfigurationError, match="ensemble scheduling must be set for ensemble"):
        settings_of(bare, name="e")


def model(text: str) -> pb.ModelConfig:
    config = pb.ModelConfig()
    text_format.Parse(text, config)
    return config


FP32_4 = model(
    "max_batch_size: 8 input [ { name: 'x' data_type: TYPE_FP32 dims: [ 4 ] } ] "
    "output [ { name: 'y' data_type: TYPE_FP32 dims: [ 4 ] } ]"
)


def check(config: pb.ModelConfig, models: dict[str, pb.ModelConfig]) -> None:
    settings = settings_of(config, name="e")
    assert settings.ensemble is not None

    def composing(s: EnsembleStep) -> pb.ModelConfig:
        return models[s.model]

    check_against(settings.ensemble, config, composing)


def test_composing_models_that_fit_pass() -> None:
    check(ensemble(*CHAIN), {"a": FP32_4, "b": FP32_4})


@pytest.mark.parametrize(
    ("b", "text"),
    [
        (
            model(
                "max_batch_size: 8 input [ { name: 'x' data_type: TYPE_INT32 dims: [ 4 ] } ] "
                "output [ { name: 'y' data_type: TYPE_FP32 dims: [ 4 ] } ]"
            ),
            "in ensemble e, ensemble tensor T: inconsistent data type: TYPE_FP32 is inferred "
            "from model a while TYPE_INT32 is inferred from model b",
        ),
        (
            model(
                "max_batch_size: 8 input [ { name: 'x' data_type: TYPE_FP32 dims: [ 5 ] } ] "
                "output [ { name: 'y' data_type: TYPE_FP32 dims: [ 4 ] } ]"
            ),
            "inconsistent shape: [-1, 4] is inferred from model a while [-1, 5] is inferred "
            "from model b",
        ),
        (
            model(
                "max_batch_size: 8 input [ { name: 'z' data_type: TYPE_FP32 dims: [ 4 ] } ] "
                "output [ { name: 'y' data_type: TYPE_FP32 dims: [ 4 ] } ]"
            ),
            "ensemble tensor T is mapping to non-existing input x in model b",
        ),
        (
            model(
                "max_batch_size: 8 input [ { name: 'x' data_type: TYPE_FP32 dims: [ 4 ] }, "
                "{ name: 'w' data_type: TYPE_FP32 dims: [ 4 ] } ] "
                "output [ { name: 'y' data_type: TYPE_FP32 dims: [ 4 ] } ]"
            ),
            "input w in model b is not mapped to any ensemble tensors",
        ),
        (
            model(
                "max_batch_size: 8 input [ { name: 'x' data_type: TYPE_FP32 dims: [ 4 ] } ] "
                "output [ { name: 'z' data_type: TYPE_FP32 dims: [ 4 ] } ]"
            ),
            "ensemble tensor OUT is mapped from non-existing output y in model b",
        ),
        (
            model(
                "max_batch_size: 2 input [ { name: 'x' data_type: TYPE_FP32 dims: [ 4 ] } ] "
                "output [ { name: 'y' data_type: TYPE_FP32 dims: [ 4 ] } ]"
            ),
            "ensemble e allows maximum batch size 8, but it contains model b which only allows "
            "maximum batch size to be 2",
        ),
    ],
)
def test_composing_models_that_do_not_fit_are_refused(b: pb.ModelConfig, text: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        check(ensemble(*CHAIN), {"a": FP32_4, "b": b})
    assert text in str(info.value)


def test_a_model_without_a_batch_axis_fits_by_its_full_shape() -> None:
    full = model(
        "max_batch_size: 0 input [ { name: 'x' data_type: TYPE_FP32 dims: [ -1, 4 ] } ] "
        "output [ { name: 'y' data_type: TYPE_FP32 dims: [ -1, 4 ] } ]"
    )
    check(ensemble(*CHAIN), {"a": FP32_4, "b": full})


def test_an_optional_input_may_be_left_unmapped() -> None:
    optional = model(
        "max_batch_size: 8 input [ { name: 'x' data_type: TYPE_FP32 dims: [ 4 ] }, "
        "{ name: 'w' data_type: TYPE_FP32 dims: [ 4 ] optional: true } ] "
        "output [ { name: 'y' data_type: TYPE_FP32 dims: [ 4 ] } ]"
    )
    check(ensemble(*CHAIN), {"a": FP32_4, "b": optional})


def flow(*steps: tuple[str, dict[str, str], dict[str, str]], outputs: tuple[str, ...]) -> Any:
    """An ensemble over IN of ``steps`` (model, inputs, outputs), in order."""
    made = tuple(EnsembleStep(i, m, -1, ins, outs) for i, (m, ins, outs) in enumerate(steps))
    return EnsembleConfig("e", made, ("IN",), outputs)


#: stream (decoupled) -> post, and a decoupled step after it: one decoupled step upstream of each
DECOUPLED_CHAIN = flow(
    ("stream", {"x": "IN"}, {"y": "A"}),
    ("post", {"x": "A"}, {"y": "B"}),
    ("again", {"x": "B"}, {"y": "C", "z": "D"}),
    ("last", {"x": "C", "z": "D"}, {"y": "OUT"}),
    outputs=("OUT",),
)


def test_a_chain_of_decoupled_steps_passes() -> None:
    check_decoupled_flow(DECOUPLED_CHAIN, frozenset({0, 2}))
    check_decoupled_flow(DECOUPLED_CHAIN, frozenset({0}))
    check_decoupled_flow(DECOUPLED_CHAIN, frozenset())


@pytest.mark.parametrize(
    ("config", "decoupled", "text"),
    [
        (
            flow(
                ("one", {"x": "IN"}, {"y": "A"}),
                ("two", {"x": "IN"}, {"y": "B"}),
                ("join", {"a": "A", "b": "B"}, {"y": "OUT"}),
                outputs=("OUT",),
            ),
            {0, 1},
            "in ensemble e, step 2 of model 'join' receives inputs originated from different "
            "decoupled models: 'A' from step 0 (model 'one'), 'B' from step 1 (model 'two')",
        ),
        (
            flow(
                ("one", {"x": "IN"}, {"y": "A"}),
                ("join", {"a": "A", "b": "IN"}, {"y": "OUT"}),
                outputs=("OUT",),
            ),
            {0},
            "step 1 of model 'join' receives inputs originated from different decoupled "
            "models: 'A' from step 0 (model 'one'), 'IN' from the ensemble's inputs",
        ),
        (
            flow(
                ("one", {"x": "IN"}, {"y": "A"}),
                ("two", {"x": "IN"}, {"y": "B"}),
                outputs=("A", "B"),
            ),
            {1},
            "in ensemble e, the ensemble's outputs are originated from different decoupled "
            "models: 'A' from the ensemble's inputs, 'B' from step 1 (model 'two')",
        ),
    ],
)
def test_a_step_fed_from_two_decoupled_sources_is_refused(
    config: EnsembleConfig, decoupled: set[int], text: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        check_decoupled_flow(config, frozenset(decoupled))
    assert text in str(info.value)

"""Triton's ModelConfig: config.pbtxt and TOML parsing, what maps onto the runner, the JSON
shape of the config endpoint, and the layout of a Triton model directory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from model_runtime.errors import ConfigurationError
from model_runtime.queue_policy import LevelPolicy, QueuePolicy
from model_runtime.runner_config import ModelRunnerConfig
from model_runtime.server.tensors.request import TensorSpec
from model_runtime.server.triton import model_config_pb2 as pb
from model_runtime.server.triton.config import config_json, parse_pbtxt, parse_toml
from model_runtime.server.triton.layout import plan_model
from model_runtime.server.triton.served import build_config, check_tensors

pytestmark = pytest.mark.timeout(10)

FULL = """
name: "m"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching {
  max_queue_delay_microseconds: 250
  preferred_batch_size: [ 4 ]
  priority_levels: 3
  default_priority_level: 2
  default_queue_policy { max_queue_size: 16 default_timeout_microseconds: 20000 }
}
instance_group [ { count: 2 kind: KIND_CPU }, { kind: KIND_AUTO } ]
version_policy: { specific { versions: [ 1, 3 ] } }
"""


def write(tmp_path: Path, text: str, name: str = "config.pbtxt") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_full_config_maps_onto_the_runner(tmp_path: Path) -> None:
    s = parse_pbtxt(write(tmp_path, FULL), "m")
    assert (s.max_batch_size, s.batch_size) == (8, 4)  # the preferred size is the batch run
    assert s.replicas == 3  # groups add up; a group's count defaults to 1
    assert s.timeout == pytest.approx(250e-6)
    assert (s.priority_levels, s.default_priority_level) == (3, 2)
    assert s.queue_policy == QueuePolicy(LevelPolicy(default_timeout=0.02, max_queue_size=16))
    assert s.version_policy.select([1, 2, 3, 4]) == [3, 1]
    base = ModelRunnerConfig(timeout=0.002, latency_budget=1.0, replication_factor=1)
    runner = s.runner_config(base)
    assert (runner.replication_factor, runner.timeout) == (3, pytest.approx(250e-6))
    # priority levels: the policy bounds each level's queue, instead of the latency budget
    assert (runner.max_queue_size, runner.latency_budget) == (None, None)
    assert runner.queue_policy == s.queue_policy
    # the level's timeout bounds the wait (the request's own does not count: no override),
    # the server's limit the whole request
    assert s.deadline(60.0, None) == (60.0, pytest.approx(0.02), False)
    assert s.deadline(60.0, 0.001) == (60.0, pytest.approx(0.02), False)
    one_level = parse_pbtxt(write(tmp_path, FULL.replace("priority_levels: 3", "")
                                  .replace("default_priority_level: 2", "")), "m")  # fmt: skip
    assert one_level.runner_config(base).max_queue_size == 16  # one level: the model's bound


def test_each_priority_level_takes_its_own_queue_policy(tmp_path: Path) -> None:
    """Triton's priority_queue_policy: a level's own policy (keyed by Triton's level), the
    default policy for the others; DELAY and the override rule per level."""
    text = (
        "max_batch_size: 4 dynamic_batching { priority_levels: 3 default_priority_level: 2 "
        "default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 300000 } "
        "priority_queue_policy { key: 1 value { allow_timeout_override: true "
        "default_timeout_microseconds: 100000 max_queue_size: 2 } } }"
    )
    s = parse_pbtxt(write(tmp_path, text), "m")
    top, default, low = (s.priority(level, None, None) for level in (1, 2, 3))
    assert top > default == 0 > low
    assert s.deadline(None, 0.05, top) == (None, 0.05, False)  # shorter: its own holds
    assert s.deadline(None, 5.0, top) == (None, pytest.approx(0.1), False)  # never longer
    assert s.deadline(None, 0.05, default) == (None, pytest.approx(0.3), True)
    assert s.deadline(None, None, low) == (None, pytest.approx(0.3), True)
    assert s.priority(7, None, None) == default  # past the levels: the default (Triton's)
    assert s.queue_policy is not None and s.queue_policy.of(top).max_queue_size == 2


def test_a_stateful_models_steps_are_not_refused_for_time(tmp_path: Path) -> None:
    """The server's latency budget refuses a request whose queue would take too long; a step
    of a sequence is never refused so (it would break the client's session mid-sequence)."""
    s = parse_pbtxt(write(tmp_path, "max_batch_size: 4 sequence_batching { }"), "m")
    base = ModelRunnerConfig(timeout=0.002, latency_budget=1.0)
    assert s.runner_config(base).latency_budget is None


def test_without_settings_the_server_defaults_stay(tmp_path: Path) -> None:
    s = parse_pbtxt(write(tmp_path, ""), "m")
    base = ModelRunnerConfig(timeout=0.002, latency_budget=1.0, replication_factor=2)
    assert s.runner_config(base) == base
    assert s.version_policy.select([1, 2, 3]) == [3]  # Triton's default: the latest one


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("sequence_batching { }", "sequence_batching: needs max_batch_size >= 1"),
        ("max_batch_size: 2 sequence_batching { iterative_sequence: true }", "iterative"),
        (
            "max_batch_size: 2 sequence_batching { control_input [ { name: 'S' control [ "
            "{ kind: CONTROL_SEQUENCE_START } ] } ] }",
            "control_input[0].control[0]: give one of int32_false_true",
        ),
        (
            "max_batch_size: 2 sequence_batching { state [ { input_name: 'a' output_name: 'b' "
            "data_type: TYPE_FP32 dims: [ -1 ] } ] }",
            "state[0].dims",
        ),
        ("max_batch_size: 2 bogus: 1", "bogus"),
        ("instance_group [ { kind: KIND_GPU } ]", "instance_group[0].kind"),
        ("instance_group [ { gpus: [0] } ]", "instance_group[0].gpus"),
        ("max_batch_size: 0 dynamic_batching { }", "max_batch_size"),
        ("max_batch_size: 2 platform: 'tensorrt_plan'", "platform"),
        ("max_batch_size: 4 dynamic_batching { preferred_batch_size: [2, 5] }", "5 must be"),
        ("input [ { name: 'x' data_type: TYPE_FP32 dims: [ 0 ] } ]", "input[0].dims"),
        ("input [ { name: 'x' data_type: TYPE_FP32 dims: [ 2 ] }, { name: 'x' } ]", "twice"),
        (
            "input [ { name: 'x' data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 3 ] } } ]",
            "input[0].reshape",
        ),
        (
            "max_batch_size: 2 input [ { name: 'x' data_type: TYPE_FP32 optional: true } ]",
            "input[0].optional",
        ),
        (
            "output [ { name: 'y' data_type: TYPE_FP32 label_filename: '../labels.txt' } ]",
            "output[0].label_filename",
        ),
        (
            "max_batch_size: 4 dynamic_batching { priority_queue_policy { key: 1 value {} } }",
            "priority_queue_policy: level 1 is not one of the priority levels (1..0)",
        ),
        (
            "max_batch_size: 4 dynamic_batching { priority_levels: 2 default_priority_level: 1 "
            "priority_queue_policy { key: 3 value {} } }",
            "priority_queue_policy: level 3",
        ),
        ("max_batch_size: 2 parameters { key: 'k' value { string_value: 'v' } }", "parameters"),
        (
            "parameters { key: 'intra_op_thread_count' value { string_value: 'four' } }",
            "parameters['intra_op_thread_count']: 'four' is not an integer",
        ),
        ("ensemble_scheduling { }", "ensemble_scheduling"),
        (
            "sequence_batching { } response_cache { enable: true }",
            "Response Cache does not currently support model",
        ),
        (
            "backend: 'python' model_transaction_policy { decoupled: true } "
            "response_cache { enable: true }",
            "with 'decoupled' transaction policy",
        ),
        ("metric_tags { key: 'team-a' value: 'a' }", "metric_tags['team-a']"),
        # Triton's qa/L0_model_config/model_metrics/invalid_config, with its texts.
        (
            "model_metrics { metric_control [ { histogram_options { buckets: [ 1 ] } } ] }",
            "metric control must specify 'metric_identifier'",
        ),
        (
            "model_metrics { metric_control [ { metric_identifier { family: '' } "
            "histogram_options { buckets: [ 1 ] } } ] }",
            "metric identifier must specify non-empty 'family'",
        ),
        (
            "model_metrics { metric_control [ { metric_identifier { family: "
            "'nv_inference_first_response_histogram_ms' } } ] }",
            "metric control must specify 'histogram_options'",
        ),
        (
            "model_metrics { metric_control [ { metric_identifier { family: "
            "'nv_inference_first_response_histogram_ms' } "
            "histogram_options { buckets: [ ] } } ] }",
            "histogram options must specify non-empty 'buckets'",
        ),
        (
            "model_metrics { metric_control [ { metric_identifier { family: "
            "'nv_inference_first_response_histogram_ms' } "
            "histogram_options { buckets: [ 4, 2 ] } } ] }",
            "must increase",
        ),
        (
            "model_metrics { metric_control [ { metric_identifier { family: 'nv_x' } "
            "histogram_options { buckets: [ 1 ] } } ] }",
            "only nv_inference_first_response_histogram_ms takes",
        ),
        # Ragged batching's own checks (model_runtime.server.triton.ragged).
        (
            "max_batch_size: 2 input [ { name: 'x' data_type: TYPE_FP32 dims: [ -1 ] } ] "
            "batch_input [ { target_name: 'n' source_input: 'x' } ]",
            "batch_input[0].data_type",
        ),
        (
            "max_batch_size: 2 input [ { name: 'x' data_type: TYPE_FP32 dims: [ -1 ] } ] "
            "batch_input [ { target_name: 'n' data_type: TYPE_INT32 source_input: 'y' } ]",
            "batch_input[0].source_input",
        ),
        (
            "max_batch_size: 2 input [ { name: 'x' data_type: TYPE_FP32 dims: [ -1 ] } ] "
            "batch_input [ { target_name: 'x' data_type: TYPE_INT32 source_input: 'x' } ]",
            "'x' is a request input",
        ),
        (
            "input [ { name: 'x' data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ] "
            "output [ { name: 'y' data_type: TYPE_FP32 dims: [ 1 ] } ]",
            "ragged batching needs max_batch_size > 0",
        ),
        (
            "max_batch_size: 2 input [ { name: 'x' data_type: TYPE_FP32 dims: [ -1 ] } ] "
            "batch_output [ { target_name: 'y' source_input: 'x' } ]",
            "batch_output",
        ),
        (
            "input [ { name: 'x' data_type: TYPE_INT32 dims: [ 2 ] is_shape_tensor: true } ]",
            "input[0].is_shape_tensor",
        ),
        ("instance_group [ { passive: true } ]", "instance_group[0].passive"),
        (
            "optimization { execution_accelerators { cpu_execution_accelerator [ "
            "{ name: 'openvino' } ] } }",
            "cpu_execution_accelerator[0]: 'openvino' is not available",
        ),
        ("optimization { graph { level: 7 } }", "optimization.graph.level"),
        ("model_operations { op_library_filename: [ 'libx.so' ] }", "op_library_filename"),
        ("model_repository_agents { agents [ { name: 'checksum' } ] }", "repository agents"),
        ("runtime: 'libtriton_pytorch.so'", "runtime"),
        (
            "max_batch_size: 2 model_warmup [ { name: 'w' batch_size: 3 inputs { key: 'x' "
            "value { data_type: TYPE_FP32 dims: [ 1 ] zero_data: true } } } ]",
            "model_warmup[0].batch_size: must be in 1..max_batch_size (2)",
        ),
        (
            "max_batch_size: 2 model_warmup [ { name: 'w' batch_size: 1 inputs { key: 'x' "
            "value { data_type: TYPE_FP32 dims: [ 1 ] } } } ]",
            "give zero_data, random_data or input_data_file",
        ),
        (
            "max_batch_size: 2 model_warmup [ { name: 'w' batch_size: 1 inputs { key: 'x' "
            "value { data_type: TYPE_FP32 dims: [ 1 ] input_data_file: '../x' } } } ]",
            "input_data_file",
        ),
        ('name: "other"', "name"),
    ],
)
def test_an_unknown_or_unsupported_field_is_an_error_naming_file_and_field(
    tmp_path: Path, text: str, field: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigurationError) as info:
        parse_pbtxt(path, "m")
    assert str(path) in str(info.value)
    assert field in str(info.value)


def test_settings_that_only_concern_gpus_are_accepted_and_said_not_to_apply(
    tmp_path: Path,
) -> None:
    text = """
    max_batch_size: 2
    optimization {
      graph { level: -1 }
      cuda { graphs: true }
      execution_accelerators { gpu_execution_accelerator [ { name: "tensorrt" } ] }
    }
    instance_group [ { count: 1 kind: KIND_CPU host_policy: "numa0"
                       rate_limiter { resources [ { name: "R" count: 1 } ] } } ]
    parameters { key: "intra_op_thread_count" value { string_value: "4" } }
    parameters { key: "execution_mode" value { string_value: "0" } }
    cc_model_filenames { key: "7.5" value: "model.onnx" }
    response_cache { enable: false }
    runtime: "libtriton_onnxruntime.so"
    """
    s = parse_pbtxt(write(tmp_path, text), "m")
    assert s.optimization_level == "basic"
    said = "\n".join(s.notes)
    for field in (
        "optimization.cuda",
        "gpu_execution_accelerator",
        "instance_group[0].rate_limiter",
        "instance_group[0].host_policy",
        "parameters['intra_op_thread_count'] = '4'",
        "cc_model_filenames",
    ):
        assert field in said
    assert "execution_mode" not in said  # sequential, as here: nothing to say
    assert len(s.notes) == 6


def test_the_toml_carries_the_same_fields(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "max_batch_size = 4\n[dynamic_batching]\nmax_queue_delay_microseconds = 900\n"
        "[[instance_group]]\ncount = 2\nkind = 'KIND_CPU'\n",
        "m.toml",
    )
    s = parse_toml(path)
    assert (s.batch_size, s.replicas, s.timeout) == (4, 2, pytest.approx(900e-6))
    bad = write(
        tmp_path, "max_batch_size = 4\n[sequence_batching]\niterative_sequence = true\n", "bad.toml"
    )
    with pytest.raises(ConfigurationError, match=r"sequence_batching\.iterative_sequence"):
        parse_toml(bad)


def test_sequence_batching_is_read(tmp_path: Path) -> None:
    text = (
        "max_batch_size: 4 instance_group [ { count: 2 } ] sequence_batching { "
        "max_sequence_idle_microseconds: 2500000 direct { max_queue_delay_microseconds: 300 } "
        "control_input [ { name: 'S' control [ { kind: CONTROL_SEQUENCE_START "
        "int32_false_true: [ 0, 1 ] } ] }, { name: 'C' control [ { kind: "
        "CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] } ] "
        "state [ { input_name: 'si' output_name: 'so' data_type: TYPE_FP32 dims: [ 2, 3 ] } ] }"
    )
    s = parse_pbtxt(write(tmp_path, text), "m")
    seq = s.sequence
    assert seq is not None and s.timeout == pytest.approx(300e-6)
    assert (seq.max_idle, seq.slots, seq.strategy) == (2.5, 4, "direct")  # x instances at load
    assert [(c.kind.value, c.name, c.dtype.kind) for c in seq.controls] == [
        ("START", "S", "i"),
        ("CORRID", "C", "O"),
    ]
    (state,) = seq.states
    assert (state.input, state.output, state.dims, state.dtype) == ("si", "so", (2, 3), np.float32)
    assert seq.hidden_inputs == {"S", "C", "si"} and seq.hidden_outputs == {"so"}
    oldest = parse_pbtxt(
        write(
            tmp_path,
            "max_batch_size: 4 sequence_batching { oldest { max_candidate_sequences: 9 } }",
        ),
        "m",
    )
    assert oldest.sequence is not None and oldest.sequence.slots == 9


def test_tensors_are_checked_against_the_model(tmp_path: Path) -> None:
    s = parse_pbtxt(write(tmp_path, FULL), "m")
    x, y = TensorSpec("x", "FP32", (-1, 4)), TensorSpec("y", "FP32", (-1, 4))
    check_tensors(s, [x], [y])
    with pytest.raises(ConfigurationError, match=r"input\[0\].dims"):
        check_tensors(s, [TensorSpec("x", "FP32", (-1, 5))], [y])
    with pytest.raises(ConfigurationError, match=r"input\[0\].data_type"):
        check_tensors(s, [TensorSpec("x", "INT64", (-1, 4))], [y])
    with pytest.raises(ConfigurationError, match=r"output\[0\].name"):
        check_tensors(s, [x], [TensorSpec("z", "FP32", (-1, 4))])
    # Outputs match exactly, as Triton compares them: a fixed config dim is not a variable one.
    with pytest.raises(ConfigurationError, match=r"output\[0\].dims.*'y' has \[-1\]"):
        check_tensors(s, [x], [TensorSpec("y", "FP32", (-1, -1))])
    # A config that lists inputs lists every one the model has.
    with pytest.raises(ConfigurationError, match=r"input\(s\) \['z'\] are not listed"):
        check_tensors(s, [x, TensorSpec("z", "FP32", (-1, 1))], [y])


def test_the_served_config_has_tritons_json_shape(tmp_path: Path) -> None:
    s = parse_pbtxt(write(tmp_path, FULL), "m")
    runner = s.runner_config(ModelRunnerConfig(timeout=0.002))
    x, y = TensorSpec("x", "FP32", (-1, 4)), TensorSpec("y", "FP32", (-1, 4))
    doc = config_json(build_config("m", s, runner, 4, [x], [y]))
    assert doc["name"] == "m"
    assert (doc["platform"], doc["backend"], doc["max_batch_size"]) == (
        "onnxruntime_onnx",
        "onnxruntime",
        8,
    )
    assert doc["input"] == [
        {
            "name": "x",
            "data_type": "TYPE_FP32",
            "format": "FORMAT_NONE",
            "dims": [4],
            "is_shape_tensor": False,
            "allow_ragged_batch": False,
            "optional": False,
            "is_non_linear_format_io": False,
        }
    ]
    assert doc["output"][0]["dims"] == [4]
    assert doc["output"][0]["label_filename"] == ""
    db = doc["dynamic_batching"]
    # 64-bit fields are JSON numbers, as Triton writes them (protobuf would write strings)
    assert db["max_queue_delay_microseconds"] == 250
    assert db["default_queue_policy"]["default_timeout_microseconds"] == 20000
    assert db["preferred_batch_size"] == [4]
    assert doc["instance_group"] == [
        {
            "name": "m",
            "kind": "KIND_CPU",
            "count": 3,
            "gpus": [],
            "profile": [],
            "passive": False,
            "secondary_devices": [],
            "host_policy": "",
        }
    ]
    assert doc["version_policy"] == {"specific": {"versions": [1, 3]}}


def test_a_triton_directory_serves_the_versions_its_policy_picks(tmp_path: Path) -> None:
    model = tmp_path / "m"
    for v, name in [(1, "model.onnx"), (2, "model.mrx"), (3, "model.onnx")]:
        (model / str(v)).mkdir(parents=True)
        (model / str(v) / name).write_bytes(b"")
    (model / "config.pbtxt").write_text("version_policy { latest { num_versions: 2 } }")
    plan = plan_model("m", model)
    assert plan.files == {"3": model / "3" / "model.onnx", "2": model / "2" / "model.mrx"}
    (model / "config.pbtxt").write_text("version_policy { specific { versions: [7] } }")
    with pytest.raises(ConfigurationError, match="no version to serve"):
        plan_model("m", model)


def test_our_messages_and_tritonclients_live_in_one_process() -> None:
    grpc = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    ours = pb.ModelConfig(name="m", max_batch_size=4)
    ours.dynamic_batching.max_queue_delay_microseconds = 100
    theirs = grpc.ModelConfig.FromString(ours.SerializeToString())  # the same wire format
    assert (theirs.name, theirs.max_batch_size) == ("m", 4)
    assert theirs.dynamic_batching.max_queue_delay_microseconds == 100

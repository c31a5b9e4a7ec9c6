"""Triton configs with ``optimization``, onnxruntime ``parameters`` and ``model_warmup``, as
Triton's users post them, loaded by the real repository with real runners: the warm-up runs on
every instance before the model serves, a failing warm-up fails the load naming the sample, and
``optimization.graph.level`` is the level the model is compiled at."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from model_runtime.compiler import CompileOptions, compile_model
from model_runtime.errors import ModelLoadError
from model_runtime.executable import Executable
from model_runtime.runner_config import ModelRunnerConfig
from model_runtime.server.repository.entries import ModelEntry
from model_runtime.server.repository.repository import ModelRepository
from model_runtime.server.serving import innermost

pytestmark = [pytest.mark.timeout(120)]

# A config as Triton's users post them for ONNX models on onnxruntime: the `optimization` block
# (TensorRT accelerator, FP16, workspace size) and a `model_warmup` list as in
# triton-inference-server/server#4293 ("ONNX with TensorRT Optimization (ORT-TRT) Warmup"),
# the warm-up sample's form as in #1795, with CUDA graphs, pinned memory and onnxruntime's
# thread parameters (its backend's README) added.
POSTED = """
name: "m"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
dynamic_batching { max_queue_delay_microseconds: 100 }
optimization {
  graph { level: 1 }
  execution_accelerators {
    gpu_execution_accelerator : [ {
      name : "tensorrt"
      parameters { key: "precision_mode" value: "FP16" }
      parameters { key: "max_workspace_size_bytes" value: "1073741824" }
    } ]
  }
  cuda { graphs: true }
  input_pinned_memory { enable: true }
  output_pinned_memory { enable: true }
}
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
parameters { key: "inter_op_thread_count" value: { string_value: "1" } }
parameters { key: "execution_mode" value: { string_value: "0" } }
model_warmup [
  {
    name: "zeros"
    batch_size: 4
    inputs { key: "x" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } }
    count: 2
  },
  {
    name: "from_file"
    batch_size: 1
    inputs { key: "x" value: { data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "x.bin" } }
  }
]
"""


def _add_one(path: Path) -> None:
    """y = x + 1, FLOAT [batch, 4]."""
    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "one"], ["y"])],
        "add_one",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [one],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(path))


def _model_dir(root: Path, config: str) -> Path:
    directory = root / "repo" / "m"
    _add_one(directory / "1" / "model.onnx")
    (directory / "config.pbtxt").write_text(config)
    (directory / "warmup").mkdir()
    (directory / "warmup" / "x.bin").write_bytes(np.arange(4, dtype="<f4").tobytes())
    return directory


class Compiler:
    """The daemon's compile step (``serve._compiler``), remembering what it wrote."""

    def __init__(self, cache: Path) -> None:
        self.cache = str(cache)
        self.paths: list[Path] = []

    def __call__(
        self, path: Path, batch_size: int | None = None, optimization_level: str | None = None
    ) -> Path:
        options = CompileOptions(batch_size=batch_size or 8, executable_cache_path=self.cache)
        if optimization_level is not None:
            options = CompileOptions(
                batch_size=batch_size or 8,
                executable_cache_path=self.cache,
                optimization_level=optimization_level,
            )
        out = compile_model(path, options=options)
        self.paths.append(out)
        return out


def _runs(entry: ModelEntry) -> list[int]:
    runner: Any = innermost(entry.runner)
    return [state.runs for state in runner.replica_states()]


async def _load(root: Path, compiler: Compiler, seen: list[list[int]]) -> ModelRepository:
    repo = ModelRepository(
        ModelRunnerConfig(batching_dim=0), directory=root / "repo", compile_source=compiler
    )
    # What the runners had run when the model started to serve.
    repo.on_install = lambda entry: seen.append(_runs(entry))
    return repo


def test_a_posted_config_loads_and_warms_up_every_instance_before_it_serves(
    tmp_path: Path,
) -> None:
    _model_dir(tmp_path, POSTED)
    compiler = Compiler(tmp_path / "cache")
    seen: list[list[int]] = []

    async def main() -> None:
        repo = await _load(tmp_path, compiler, seen)
        async with repo:
            repo.scan()
            entry = await repo.load("m")
            assert entry.runner is not None
            out = await entry.runner.execute({"x": np.ones((1, 4), np.float32)})
            np.testing.assert_array_equal(out["y"], np.full((1, 4), 2, np.float32))
            await repo.close_all()

    anyio.run(main)
    # "zeros" twice and "from_file" once, on each of the two instances, before serving.
    assert seen == [[3, 3]]


def test_graph_level_is_the_level_the_model_is_compiled_at(tmp_path: Path) -> None:
    _model_dir(tmp_path, POSTED.replace("level: 1", "level: -1"))
    compiler = Compiler(tmp_path / "cache")

    async def main() -> None:
        async with await _load(tmp_path, compiler, []) as repo:
            repo.scan()
            await repo.load("m")
            await repo.close_all()

    anyio.run(main)
    (path,) = compiler.paths
    executable = Executable.load(path)
    assert executable.metadata.options["optimization_level"] == "basic"


@pytest.mark.parametrize(
    ("change", "said"),
    [
        # the sample's shape is not the model's: its run fails
        ("dims: [ 4 ] zero_data", "model_warmup[0] 'zeros': the warm-up request failed"),
        # the data file is not there
        ('input_data_file: "x.bin"', "model_warmup[1] 'from_file'"),
    ],
)
def test_a_failing_warm_up_fails_the_load_naming_the_sample(
    tmp_path: Path, change: str, said: str
) -> None:
    broken = {
        "dims: [ 4 ] zero_data": "dims: [ 5 ] zero_data",
        'input_data_file: "x.bin"': 'input_data_file: "gone.bin"',
    }[change]
    _model_dir(tmp_path, POSTED.replace(change, broken))
    compiler = Compiler(tmp_path / "cache")
    seen: list[list[int]] = []

    async def main() -> None:
        async with await _load(tmp_path, compiler, seen) as repo:
            repo.scan()
            with pytest.raises(ModelLoadError) as info:
                await repo.load("m")
            assert said in str(info.value)
            entry = repo.get("m")
            assert entry.runner is None
            await repo.close_all()

    anyio.run(main)
    assert seen == []  # never served

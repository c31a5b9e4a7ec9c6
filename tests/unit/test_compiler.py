"""compile_model: ONNX in, executable out; re-batching, weights split, variables, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

# tests/models.py is shared by unit and integration tests; the repo root makes it importable.
from model_runtime.compiler import (
    CompileOptions,
    compile_executable,
    compile_model,
    run_reference,
)
from model_runtime.errors import CompileError, ModelRuntimeError
from model_runtime.executable import Executable
from model_runtime.executable.validate import WEIGHT_DATA_LOCATION, anchored_initializers
from tests.models import (
    make_add_double,
    make_batch_mixing,
    make_counter,
    make_dynamic_feature,
    make_fixed_batch_reshape,
    make_mlp,
    save,
)


def _ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return [np.asarray(v) for v in session.run(None, feeds)]


def _payload(exe: Executable) -> onnx.ModelProto:
    return onnx.load_model_from_string(exe.program_payload(exe.metadata.program_flow.main[0]))


@pytest.fixture(scope="module")
def mlp_exe() -> Executable:
    return compile_executable(make_mlp(), CompileOptions(batch_size=8))


def test_mlp_compiles_to_fixed_batch_and_matches_onnxruntime(mlp_exe: Executable) -> None:
    m = mlp_exe.metadata
    assert [(a.name, a.shape, a.batch_dim) for a in m.user_inputs] == [("x", (8, 784), 0)]
    assert [(a.name, a.shape, a.batch_dim) for a in m.user_outputs] == [("logits", (8, 10), 0)]
    x = np.random.default_rng(3).standard_normal((8, 784)).astype(np.float32)
    got = run_reference(mlp_exe, {"x": x})["logits"]
    (want,) = _ort(make_mlp(), {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_weights_stay_initializers_whose_bytes_are_the_executables_tensors(
    mlp_exe: Executable,
) -> None:
    weights = {a.name: a for a in mlp_exe.metadata.weights}
    assert {"w0", "w1", "w2"} <= set(weights)
    assert weights["w1"].shape == (512, 512) and weights["w1"].programs == (0,)
    assert all(a.has_data for a in weights.values())
    payload = _payload(mlp_exe)
    # Constants for onnxruntime (folding, prepacking), not graph inputs fed on every run...
    assert [i.name for i in payload.graph.input] == ["x"]
    inits = {t.name: t for t in payload.graph.initializer}
    assert set(inits) == set(weights)  # the MLP has no structural constants
    for name, t in inits.items():
        # ...whose bytes are the anchor's tensor: a stub at the sentinel, never a file.
        assert [(e.key, e.value) for e in t.external_data] == [("location", WEIGHT_DATA_LOCATION)]
        assert t.data_location == onnx.TensorProto.EXTERNAL and not t.raw_data
        assert tuple(t.dims) == weights[name].shape
    assert anchored_initializers(payload) == tuple(inits)
    # The payload is small: weights live in the executable's tensors, once.
    assert mlp_exe.tensor("__program__/main").nbytes < 10_000


def test_the_weight_initializers_are_bound_from_the_anchors(mlp_exe: Executable) -> None:
    # A session gets the weights from the executable's tensors; other tensors, other answer.
    payload = _payload(mlp_exe).SerializeToString()
    x = np.ones((8, 784), np.float32)

    def run(b2_shift: float) -> np.ndarray:
        values = {a.handle: np.array(mlp_exe.tensor(a.name)) for a in mlp_exe.metadata.weights}
        values["b2"] += b2_shift
        so = ort.SessionOptions()
        so.add_external_initializers(
            list(values), [ort.OrtValue.ortvalue_from_numpy(v) for v in values.values()]
        )
        session = ort.InferenceSession(payload, so, providers=["CPUExecutionProvider"])
        return np.asarray(session.run(None, {"x": x})[0])

    np.testing.assert_allclose(run(1.0), run(0.0) + 1.0, rtol=1e-5, atol=1e-5)


def test_metadata_records_options_and_program_flow(mlp_exe: Executable) -> None:
    m = mlp_exe.metadata
    assert m.options["optimization_level"] == "extended"
    assert m.options["opset"] == "13"
    assert m.options["rebatched_from"] == "dynamic"
    assert len(m.options["source_sha256"]) == 64
    assert (m.program_flow.load, m.program_flow.main, m.program_flow.save) == ((0,), (1,), (2,))
    assert m.target.device_kind == "cpu" and m.batch_size == 8


def test_two_outputs_and_a_weight() -> None:
    exe = compile_executable(make_add_double(), CompileOptions(batch_size=3))
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = run_reference(exe, {"x": x})
    np.testing.assert_array_equal(out["sum"], x + np.arange(1, 5, dtype=np.float32))
    np.testing.assert_array_equal(out["double"], 2 * x)


def test_variable_is_state_updated_by_each_run() -> None:
    options = CompileOptions(
        batch_size=2, variables=("count",), variable_updates={"count_next": "count"}
    )
    exe = compile_executable(make_counter(), options)
    m = exe.metadata
    (var,) = m.variables
    assert var.name == "count" and var.has_data and var.programs == (0, 1, 2)
    assert dict(m.output_to_variable) == {"count_next": "count"}
    assert m.anchor("count_next").batch_dim is None
    x = np.zeros((2, 4), np.float32)
    state = None
    for step in range(3):
        out = run_reference(exe, {"x": x}, state)
        np.testing.assert_array_equal(out["y"], np.full((2, 4), step, np.float32))
        state = {"count": out["count_next"]}


def test_fixed_batch_of_one_with_reshape_constant_is_rebatched() -> None:
    model = make_fixed_batch_reshape()
    exe = compile_executable(model, CompileOptions(batch_size=4))
    assert exe.metadata.options["rebatched_from"] == "fixed-1"
    assert exe.metadata.options["reshapes_rewritten"] == "1"
    x = np.random.default_rng(0).standard_normal((4, 3, 4, 4)).astype(np.float32)
    got = run_reference(exe, {"x": x})["y"]
    for row in range(4):
        (want,) = _ort(model, {"x": x[row : row + 1]})
        np.testing.assert_allclose(got[row : row + 1], want, rtol=1e-5, atol=1e-5)
    # The reshape's shape constant is structure: it stays inside the payload.
    assert "flat_shape" not in {a.name for a in exe.metadata.anchors}


def test_graph_that_mixes_rows_cannot_be_rebatched() -> None:
    with pytest.raises(CompileError, match=r"cannot be re-batched to 4.*row 0 of output 'y'"):
        compile_executable(make_batch_mixing(), CompileOptions(batch_size=4))
    # At its own batch size it compiles.
    compile_executable(make_batch_mixing(), CompileOptions(batch_size=1))


def test_dynamic_non_batch_dim_stays_dynamic_and_named() -> None:
    exe = compile_executable(make_dynamic_feature(), CompileOptions(batch_size=2))
    x = exe.metadata.anchor("x")
    assert x.shape == (2, -1) and x.dim_names == ("", "seq")
    assert exe.metadata.anchor("y").shape == (2, -1)
    assert exe.metadata.format_version == 3


def test_batch_fixed_at_another_size_is_refused() -> None:
    with pytest.raises(CompileError, match="batch dimension 0 fixed at 3"):
        compile_executable(make_add_double(batch=3), CompileOptions(batch_size=4))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (CompileOptions(batch_size=-1), "batch_size must be a positive integer"),
        (CompileOptions(batch_size=2, target="gpu"), "unknown target 'gpu'"),
        (CompileOptions(optimization_level="max"), "unknown optimization_level 'max'"),
        (CompileOptions(variables=("nope",)), "variable 'nope' is not an initializer"),
        (
            CompileOptions(variables=("bias",), variable_updates={"zzz": "bias"}),
            "output 'zzz', which is not a graph output",
        ),
        (
            CompileOptions(variables=("bias",), variable_updates={"sum": "bias"}),
            "cannot update variable 'bias'",
        ),
    ],
)
def test_bad_options_raise_compile_error_naming_model(
    options: CompileOptions, message: str
) -> None:
    with pytest.raises(CompileError, match=message) as info:
        compile_executable(make_add_double(), options)
    assert "add_double" in str(info.value)


def test_not_an_onnx_file(tmp_path: Path) -> None:
    bad = tmp_path / "notes.onnx"
    bad.write_text("these are not the weights you are looking for\n" * 10)
    with pytest.raises(CompileError, match=r"notes\.onnx.* is not an ONNX model"):
        compile_model(bad, tmp_path / "out.mrx", CompileOptions())


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(CompileError, match="cannot read model"):
        compile_model(tmp_path / "absent.onnx", tmp_path / "out.mrx")


def test_model_failing_checker(tmp_path: Path) -> None:
    model = make_add_double()
    model.graph.node[0].input[1] = "undefined_tensor"
    path = tmp_path / "broken.onnx"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(CompileError, match=r"fails onnx\.checker"):
        compile_model(path, tmp_path / "out.mrx")


def test_compile_model_writes_a_loadable_file(tmp_path: Path) -> None:
    src = save(make_add_double(), tmp_path / "ad.onnx")
    path = compile_model(src, options=CompileOptions(batch_size=2))
    assert path == tmp_path / "ad.mrx"
    exe = Executable.load(path)
    assert exe.metadata.model_name == "ad"
    out = run_reference(exe, {"x": np.ones((2, 4), np.float32)})
    np.testing.assert_array_equal(out["double"], np.full((2, 4), 2, np.float32))


def test_in_memory_model_needs_an_output_path() -> None:
    with pytest.raises(CompileError, match="give an output path"):
        compile_model(make_add_double())


def test_model_with_external_data(tmp_path: Path) -> None:
    onnx.save_model(
        make_mlp(),
        str(tmp_path / "mlp.onnx"),
        save_as_external_data=True,
        location="mlp.data",
        size_threshold=1024,
    )
    exe = Executable.load(compile_model(tmp_path / "mlp.onnx", options=CompileOptions()))
    x = np.ones((1, 784), np.float32)
    (want,) = _ort(make_mlp(), {"x": x})
    np.testing.assert_allclose(run_reference(exe, {"x": x})["logits"], want, rtol=1e-4)


@pytest.mark.parametrize("level", ["disable", "basic", "extended", "all"])
def test_every_optimization_level_gives_the_same_answer(level: str) -> None:
    exe = compile_executable(
        make_mlp(sizes=(16, 8, 4)), CompileOptions(batch_size=2, optimization_level=level)
    )
    assert exe.metadata.options["optimization_level"] == level
    # 'all' adds CPU-specific layouts: applied by the device at load, not baked into the file.
    assert exe.metadata.options["offline_optimization_level"] == (
        "extended" if level == "all" else level
    )
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(2, 16)
    (want,) = _ort(make_mlp(sizes=(16, 8, 4)), {"x": x})
    np.testing.assert_allclose(run_reference(exe, {"x": x})["logits"], want, rtol=1e-5)


def test_ipu_model_target_is_recorded() -> None:
    exe = compile_executable(
        make_add_double(), CompileOptions(target="ipu-model", ipu_version=21, tiles_per_ipu=4)
    )
    t = exe.metadata.target
    assert (t.device_kind, t.version, t.tiles_per_ipu) == ("ipu-model", 21, 4)


def test_old_opset_is_upgraded_for_onnxruntime() -> None:
    model = make_add_double(batch=2)  # the converter needs fixed dims to check broadcasts
    model.opset_import[0].version = 6
    # Opset 6 Add only broadcasts with the `broadcast` attribute.
    model.graph.node[0].attribute.append(onnx.helper.make_attribute("broadcast", 1))
    exe = compile_executable(model, CompileOptions(batch_size=2))
    assert exe.metadata.options["opset_converted_to"] == "7"
    out = run_reference(exe, {"x": np.zeros((2, 4), np.float32)})
    np.testing.assert_array_equal(out["sum"], np.tile(np.arange(1, 5, dtype=np.float32), (2, 1)))


def test_compile_error_is_a_model_runtime_error() -> None:
    assert issubclass(CompileError, ModelRuntimeError)


def test_expression_custom_op_is_lowered_recorded_and_runs() -> None:
    from model_runtime import custom_ops
    from model_runtime.custom_ops import expression

    node = custom_ops.codelet_expression_op(lambda x, y, z: x * x + y * z, "a", "b", "c")
    dims = [2, 7]
    graph = onnx.helper.make_graph(
        [node],
        "expr",
        [onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, dims) for n in "abc"],
        [onnx.helper.make_tensor_value_info(node.output[0], onnx.TensorProto.FLOAT, dims)],
    )
    model = onnx.helper.make_model(
        graph,
        opset_imports=[
            onnx.helper.make_opsetid("", 13),
            onnx.helper.make_opsetid(expression.LIBRARY, 1),
        ],
    )
    model.ir_version = 8
    exe = compile_executable(model, CompileOptions(batch_size=2))
    assert [r.library for r in exe.metadata.custom_ops] == [expression.LIBRARY]
    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal(dims).astype(np.float32) for _ in range(3))
    out = run_reference(exe, {"a": a, "b": b, "c": c})
    np.testing.assert_allclose(out[node.output[0]], a * a + b * c, rtol=1e-6)


def test_cache_key_names_the_program_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    # An executable cached by a compiler that fed weights as graph inputs still loads, but it
    # is compiled again instead of being served at the old speed.
    from model_runtime.compiler import cache

    key = cache.cache_key("a" * 64, CompileOptions())
    monkeypatch.setattr(cache, "LAYOUT", "weights-as-graph-inputs")
    assert cache.cache_key("a" * 64, CompileOptions()) != key


# -- batch-size buckets ---------------------------------------------------------------------


def test_a_batch_agnostic_program_gets_buckets_and_runs_each_size(mlp_exe: Executable) -> None:
    assert mlp_exe.metadata.batch_sizes == (1, 2, 4, 8)
    dims = _payload(mlp_exe).graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param == "batch" and dims[1].dim_value == 784  # anchors keep (8, 784)
    values = [np.array(mlp_exe.tensor(a.name)) for a in mlp_exe.metadata.weights]
    so = ort.SessionOptions()
    so.add_external_initializers(
        [a.handle for a in mlp_exe.metadata.weights],
        [ort.OrtValue.ortvalue_from_numpy(v) for v in values],
    )
    payload = _payload(mlp_exe).SerializeToString()
    session = ort.InferenceSession(payload, so, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(4).standard_normal((8, 784)).astype(np.float32)
    (full,) = session.run(None, {"x": x})
    (one,) = session.run(None, {"x": x[:1]})
    np.testing.assert_allclose(one, full[:1], rtol=1e-4, atol=1e-5)


def test_without_buckets_or_with_a_batch_the_model_fixed_there_is_one_size() -> None:
    off = compile_executable(make_mlp(), CompileOptions(batch_size=8, batch_buckets=False))
    assert off.metadata.batch_sizes == (8,) and "batch_sizes" not in off.metadata.options
    dims = _payload(off).graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_value == 8
    fixed = compile_executable(make_mlp(batch=4), CompileOptions(batch_size=4))
    assert fixed.metadata.batch_sizes == (4,)  # the source fixed its batch: kept as it is

"""The cpu and ipu-model backends: results equal onnxruntime's, variables live on the device,
reset/restore/frozen inputs, typed errors at the boundary, memory refusal of the ipu-model."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from device_fixtures import batch_of, mlp_exe, tiny_exe

from actors.device.backends import CpuBackend, IpuModelBackend, make_backend
from actors.device.backends.cpu import RunAborted
from actors.device.backends.ort_sessions import (
    ARENA_ENV,
    SPINNING_ENV,
    live_sessions,
    session_options,
)
from actors.device.inventory import DeviceSpec, ipu_model_spec
from model_runtime.compiler import CompileOptions, compile_executable, run_reference
from model_runtime.compiler.lower import weights_as_inputs
from model_runtime.errors import (
    ConfigurationError,
    DeviceMemoryError,
    DeviceStateError,
    InputValidationError,
)
from model_runtime.executable import Executable
from model_runtime.executable.validate import anchored_initializers
from tests.models import make_counter, make_mlp

CPU = DeviceSpec(0, "cpu", 1)


def test_outputs_equal_onnxruntime_on_the_plain_graph() -> None:
    exe = mlp_exe((16, 8, 4), batch=5)
    b = CpuBackend(CPU)
    b.load(exe, None)
    batch = batch_of(exe, 3)
    (out,) = b.run_main([batch])
    sess = ort.InferenceSession(exe.program_payload(1), providers=["CPUExecutionProvider"])
    feed = dict(batch) | {n: np.asarray(exe.tensor(n)) for n in ("w0", "b0", "w1", "b1")}
    (expected,) = sess.run(["y"], feed)
    np.testing.assert_array_equal(out["y"], expected)
    (again,) = b.run_main([batch])
    assert again["y"] is not out["y"] and not np.shares_memory(again["y"], out["y"])


def test_after_terminate_runs_are_refused_until_a_reset() -> None:
    exe = mlp_exe((16, 8, 4), batch=5)
    b = CpuBackend(CPU)
    b.load(exe, None)
    batch = batch_of(exe, 3)
    (before,) = b.run_main([batch])
    b.terminate()  # what a reset of a stuck run does first
    for _ in range(2):
        with pytest.raises(RunAborted, match="terminated"):
            b.run_main([batch])
    b.reset()
    (after,) = b.run_main([batch])
    np.testing.assert_array_equal(after["y"], before["y"])


def test_variables_persist_across_runs_save_and_reset() -> None:
    exe = tiny_exe(device_iterations=3)
    b = CpuBackend(CPU)
    b.load(exe, None)
    batches = [batch_of(exe, i) for i in range(3)]
    outs = b.run_main(batches)
    assert len(outs) == 3
    assert [float(o["counter_out"][0]) for o in outs] == [1.0, 2.0, 3.0]
    b.run_main(batches)
    saved = b.run_save()
    assert saved == {"counter": pytest.approx(np.array([6.0], np.float32))}
    saved["counter"][0] = 100  # a copy: the device does not change
    assert b.run_save()["counter"][0] == 6.0
    b.reset()
    assert b.run_save()["counter"][0] == 0.0
    b.restore_variables({"counter": np.array([41.0], np.float32)})
    assert b.run_main(batches)[0]["counter_out"][0] == 42.0
    with pytest.raises(InputValidationError, match="not a variable"):
        b.restore_variables({"W": np.zeros((4, 3), np.float32)})


def test_frozen_inputs_override_weights() -> None:
    exe = tiny_exe()
    b = CpuBackend(CPU)
    frozen = {"W": np.zeros((4, 3), np.float32), "b": np.full(3, 2.0, np.float32)}
    b.load(exe, frozen)
    frozen["b"][:] = 9  # the device took a copy
    (out,) = b.run_main([batch_of(exe)])
    np.testing.assert_array_equal(out["y"], np.full((2, 3), 2.0, np.float32))
    with pytest.raises(InputValidationError, match="names no anchor"):
        b.load(exe, {"nope": np.zeros(1, np.float32)})
    with pytest.raises(InputValidationError, match="expected float32"):
        b.load(exe, {"W": np.zeros((3, 3), np.float32)})


def test_bad_inputs_and_states_are_typed_errors() -> None:
    exe = tiny_exe(device_iterations=2)
    b = CpuBackend(CPU)
    with pytest.raises(DeviceStateError, match="no executable"):
        b.run_main([batch_of(exe)])
    b.load(exe, None)
    with pytest.raises(InputValidationError, match="1 batches given"):
        b.run_main([batch_of(exe)])
    with pytest.raises(InputValidationError, match="'x' missing"):
        b.run_main([{}, {}])
    with pytest.raises(InputValidationError, match=r"float64\[2, 4\]"):
        b.run_main([{"x": np.zeros((2, 4))}] * 2)
    b.unload()
    with pytest.raises(DeviceStateError):
        b.run_save()
    with pytest.raises(ConfigurationError):
        make_backend(DeviceSpec(0, "tpu"))


def test_small_ipu_model_refuses_a_big_mlp_and_a_big_one_accepts_it() -> None:
    exe = mlp_exe()  # 784-512-512-10: 2.6 MB of weights
    small = IpuModelBackend(ipu_model_spec(tiles_per_ipu=4))
    with pytest.raises(DeviceMemoryError) as info:
        small.load(exe, None)
    msg = str(info.value)
    assert "needs 3.03 MiB" in msg and "has 2.44 MiB" in msg and "4 tiles" in msg
    assert small.executable is None
    big = make_backend(ipu_model_spec())
    assert isinstance(big, IpuModelBackend)
    big.load(exe, None)
    (out,) = big.run_main([batch_of(exe)])
    cpu = CpuBackend(CPU)
    cpu.load(exe, None)
    np.testing.assert_array_equal(out["y"], cpu.run_main([batch_of(exe)])[0]["y"])
    assert big.memory_estimate["weights"] == sum(
        exe.tensor(n).nbytes for n in exe.tensor_names if not n.startswith("program/")
    )
    v1_small = IpuModelBackend(ipu_model_spec(ipu_version=1, tiles_per_ipu=4))
    with pytest.raises(DeviceMemoryError, match=r"1\.00 MiB"):
        v1_small.load(exe, None)
    IpuModelBackend(ipu_model_spec(tiles_per_ipu=4)).load(tiny_exe(), None)  # small fits small


# -- compiled executables: weights are session constants (issue 13) ----------------------------


@pytest.fixture(scope="module")
def compiled_mlp() -> Executable:
    return compile_executable(make_mlp(sizes=(16, 32, 8)), CompileOptions(batch_size=4))


def test_compiled_weights_are_bound_as_constants_and_match_the_reference(
    compiled_mlp: Executable,
) -> None:
    payload = onnx.load_model_from_string(compiled_mlp.program_payload(1))
    assert set(anchored_initializers(payload)) == {a.handle for a in compiled_mlp.metadata.weights}
    b = CpuBackend(CPU)
    b.load(compiled_mlp, None)
    x = batch_of(compiled_mlp, 5)
    (out,) = b.run_main([x])
    np.testing.assert_array_equal(out["logits"], run_reference(compiled_mlp, x)["logits"])
    # The older layout (weights fed as graph inputs) still loads and agrees.
    old = CpuBackend(CPU)
    old.load(weights_as_inputs(compiled_mlp), None)
    np.testing.assert_allclose(old.run_main([x])[0]["logits"], out["logits"], rtol=1e-5)
    b.reset()  # the load program again: constants stay
    np.testing.assert_array_equal(b.run_main([x])[0]["logits"], out["logits"])


def test_replicas_of_an_executable_share_one_session(compiled_mlp: Executable) -> None:
    """Issue 34: devices of one thread that run one executable run one onnxruntime session,
    built from the executable's own (read-only, private) tensors; a reset keeps it, both
    devices answer right after one is reset, and the last unload frees it."""
    a, b = CpuBackend(DeviceSpec(0, "cpu", 1)), CpuBackend(DeviceSpec(1, "cpu", 1))
    a.load(compiled_mlp, None)
    b.load(compiled_mlp, None)
    shared = a.ort_session
    assert shared is not None and shared.key is not None
    assert b.ort_session is shared
    assert a.memory()["session"] == 0 and b.memory()["session"] == 0  # the model's, not theirs
    assert shared.weights == {w.name for w in compiled_mlp.metadata.weights}
    x = batch_of(compiled_mlp, 4)
    want = run_reference(compiled_mlp, x)["logits"]
    a.reset()
    assert a.ort_session is shared
    for backend in (a, b):
        np.testing.assert_array_equal(backend.run_main([x])[0]["logits"], want)
    a.terminate()  # one device's abort is its own: the other runs on the shared session
    with pytest.raises(RunAborted):
        a.run_main([x])
    np.testing.assert_array_equal(b.run_main([x])[0]["logits"], want)
    for backend in (a, b):
        backend.unload()
    del shared
    gc.collect()
    assert not [
        s for s in live_sessions() if s.key and s.key.package_hash == compiled_mlp.package_hash
    ]


_OWNS = r"""
import gc, sys
import numpy as np
from actors.device.backends import CpuBackend
from actors.device.inventory import DeviceSpec
from model_runtime.compiler import CompileOptions, compile_executable
from model_runtime.executable import Executable
from tests.models import make_mlp

path = sys.argv[1]
# The weights (20 MiB) are views of the one buffer the file was read into; released, the
# buffer is unmapped, so a session still reading them would crash, and the heap is scribbled.
model = make_mlp(sizes=(1024, 1024, 4096, 10), seed=5)
compile_executable(model, CompileOptions(batch_size=4)).save(path)
exe = Executable.load(path)
backend = CpuBackend(DeviceSpec(0, "cpu", 1))
backend.load(exe, None)
x = {"x": np.random.default_rng(1).standard_normal((4, 1024)).astype(np.float32)}
want = backend.run_main([x])[0]["logits"].copy()
freed = exe.release(a.name for a in exe.metadata.weights)
assert freed > 20 * 2**20, freed
gc.collect()
junk = [np.full(a.shape, np.nan, a.dtype) for a in exe.metadata.weights for _ in range(4)]
got = backend.run_main([x])[0]["logits"]
np.testing.assert_array_equal(got, want)
print("OK")
"""


def test_onnxruntime_owns_the_weights_it_was_handed(tmp_path: Path) -> None:
    """A runner releases the executable's weights once a session holds them (issue 34): that
    is only safe while onnxruntime copies what ``add_external_initializers`` hands it. Freed
    (unmapped, or reused and overwritten) after the session is built, the weights must not
    change an answer; a child process, so a crash is this test failing, not pytest dying."""
    proc = subprocess.run(
        [sys.executable, "-c", _OWNS, str(tmp_path / "big.mrx")],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and proc.stdout.split() == ["OK"], (
        f"child exited {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    )


def test_a_session_is_not_shared_across_thread_pools_or_frozen_weights(
    compiled_mlp: Executable,
) -> None:
    """Two devices of two threads would compute with one pool of two if they shared; a frozen
    weight makes a session that device's own."""
    one = CpuBackend(DeviceSpec(0, "cpu", 1))
    one.load(compiled_mlp, None)
    pools = [CpuBackend(DeviceSpec(i, "cpu", 2)) for i in (1, 2)]
    for p in pools:
        p.load(compiled_mlp, None)
    weight = compiled_mlp.metadata.weights[0]
    frozen = CpuBackend(DeviceSpec(3, "cpu", 1))
    frozen.load(compiled_mlp, {weight.name: np.zeros(weight.shape, weight.dtype)})
    sessions = [b.ort_session for b in (one, *pools, frozen)]
    assert len({id(s) for s in sessions}) == 4
    for b in (*pools, frozen):
        assert b.ort_session is not None and b.ort_session.key is None
        assert b.memory()["session"] == b.ort_session.built_bytes


def test_a_bucketed_program_runs_its_batch_sizes_only(compiled_mlp: Executable) -> None:
    assert compiled_mlp.metadata.batch_sizes == (1, 2, 4)
    b = CpuBackend(CPU)
    b.load(compiled_mlp, None)
    x = batch_of(compiled_mlp, 5)
    (full,) = b.run_main([x])
    for n in (1, 2):
        (part,) = b.run_main([{"x": x["x"][:n]}])
        np.testing.assert_allclose(part["logits"], full["logits"][:n], rtol=1e-5, atol=1e-6)
    with pytest.raises(InputValidationError, match="expected float32"):
        b.run_main([{"x": x["x"][:3]}])  # not one of its batch sizes


def test_frozen_input_overrides_a_compiled_weight(compiled_mlp: Executable) -> None:
    x = batch_of(compiled_mlp, 1)
    plain = CpuBackend(CPU)
    plain.load(compiled_mlp, None)
    (base,) = plain.run_main([x])
    shifted = np.array(compiled_mlp.tensor("b1")) + 1.0
    b = CpuBackend(CPU)
    b.load(compiled_mlp, {"b1": shifted})
    shifted[:] = 100.0  # the device took a copy
    (out,) = b.run_main([x])
    np.testing.assert_allclose(out["logits"], base["logits"] + 1.0, rtol=1e-5, atol=1e-5)


def test_compiled_variables_still_load_alias_and_save() -> None:
    options = CompileOptions(
        batch_size=2,
        device_iterations=3,
        variables=("count",),
        variable_updates={"count_next": "count"},
    )
    exe = compile_executable(make_counter(), options)
    payload = onnx.load_model_from_string(exe.program_payload(1))
    assert anchored_initializers(payload) == ("one",)  # a weight next to the variable
    assert "count" in {i.name for i in payload.graph.input}
    b = CpuBackend(CPU)
    b.load(exe, None)
    x = np.zeros((2, 4), np.float32)
    outs = b.run_main([{"x": x}] * 3)
    assert [float(o["y"][0, 0]) for o in outs] == [0.0, 1.0, 2.0]
    assert b.run_save()["count"][0] == 3.0
    b.reset()
    assert b.run_save()["count"][0] == 0.0
    b.restore_variables({"count": np.array([10.0], np.float32)})
    assert float(b.run_main([{"x": x}] * 3)[0]["y"][0, 0]) == 10.0


def test_session_options_are_chosen_for_a_server(
    compiled_mlp: Executable, monkeypatch: pytest.MonkeyPatch
) -> None:
    spin = "session.intra_op.allow_spinning"
    opts = session_options(DeviceSpec(0, "cpu", 2), compiled_mlp, environ={})
    assert (opts.intra_op_num_threads, opts.inter_op_num_threads) == (2, 1)
    assert opts.execution_mode == ort.ExecutionMode.ORT_SEQUENTIAL
    assert opts.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    assert opts.get_session_config_entry(spin) == "0"  # off unless asked for
    assert not opts.enable_cpu_mem_arena  # off unless asked for (issue 34)
    on = session_options(CPU, compiled_mlp, environ={SPINNING_ENV: "1", ARENA_ENV: "1"})
    assert on.get_session_config_entry(spin) == "1"
    assert on.enable_cpu_mem_arena
    for env in (SPINNING_ENV, ARENA_ENV):
        with pytest.raises(ConfigurationError, match=env):
            session_options(CPU, compiled_mlp, environ={env: "fast"})
    # An executable compiled to stay lightly optimised stays so on the device.
    basic = compile_executable(
        make_mlp(sizes=(16, 8)), CompileOptions(batch_size=4, optimization_level="basic")
    )
    level = session_options(CPU, basic, environ={}).graph_optimization_level
    assert level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    # load reads the environment each time
    monkeypatch.setenv(SPINNING_ENV, "fast")
    with pytest.raises(ConfigurationError, match=SPINNING_ENV):
        CpuBackend(CPU).load(compiled_mlp, None)
    monkeypatch.setenv(SPINNING_ENV, "1")
    CpuBackend(CPU).load(compiled_mlp, None)


def test_ipu_model_counts_and_binds_compiled_weights(compiled_mlp: Executable) -> None:
    ipu = IpuModelBackend(ipu_model_spec())
    ipu.load(compiled_mlp, None)
    weights = sum(compiled_mlp.tensor(a.name).nbytes for a in compiled_mlp.metadata.weights)
    assert ipu.memory_estimate["weights"] == weights > 0
    assert ipu.memory_estimate["activations"] > 0
    cpu = CpuBackend(CPU)
    cpu.load(compiled_mlp, None)
    x = batch_of(compiled_mlp, 2)
    np.testing.assert_array_equal(ipu.run_main([x])[0]["logits"], cpu.run_main([x])[0]["logits"])

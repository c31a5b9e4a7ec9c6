"""The cpu and ipu-model backends: results equal onnxruntime's, variables live on the device,
reset/restore/frozen inputs, typed errors at the boundary, memory refusal of the ipu-model."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from device_fixtures import batch_of, mlp_exe, tiny_exe

from actors.device.backends import CpuBackend, IpuModelBackend, make_backend
from actors.device.inventory import DeviceSpec, ipu_model_spec
from model_runtime.errors import (
    ConfigurationError,
    DeviceMemoryError,
    DeviceStateError,
    InputValidationError,
)

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

"""An executable is data, never a file reference: the only external data a payload may hold is
its own weight anchors, at the fixed sentinel location; anything else is refused at load,
before onnxruntime (which would read the file relative to the working directory) sees it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from actors.device.backends import CpuBackend
from actors.device.inventory import DeviceSpec
from model_runtime.compiler.lower import weights_as_inputs
from model_runtime.errors import ApplicationRuntimeError, InvalidExecutableError
from model_runtime.executable import Executable, compute_package_hash
from model_runtime.executable.codec import metadata_to_json
from model_runtime.executable.container import METADATA_KEY
from model_runtime.executable.model import AnchorRole
from model_runtime.executable.safetensors_io import write_safetensors
from model_runtime.executable.testing import MAIN_PAYLOAD, tiny_metadata, tiny_onnx, tiny_tensors
from model_runtime.executable.validate import WEIGHT_DATA_LOCATION

Mutate = Callable[[onnx.ModelProto], None]


def _external(name: str, location: str, dims: tuple[int, ...] = (4, 3), **extra: str) -> Any:
    t = TensorProto()
    t.name = name
    t.data_type = TensorProto.FLOAT
    t.dims.extend(dims)
    t.data_location = TensorProto.EXTERNAL
    for key, value in {"location": location, **extra}.items():
        entry = t.external_data.add()
        entry.key, entry.value = key, value
    return t


def _payload(mutate: Mutate | None = None) -> onnx.ModelProto:
    """The tiny model with weight ``W`` an initializer at the sentinel (the compiler's layout)."""
    model = onnx.load_model_from_string(tiny_onnx(2))
    inputs = [vi for vi in model.graph.input if vi.name != "W"]
    del model.graph.input[:]
    model.graph.input.extend(inputs)
    model.graph.initializer.append(_external("W", WEIGHT_DATA_LOCATION))
    if mutate is not None:
        mutate(model)
    return model


def _parts(model: onnx.ModelProto) -> tuple[Any, dict[str, np.ndarray]]:
    meta = tiny_metadata(2)
    # W is uploaded by the load program only: the main program holds it as a constant.
    anchors = tuple(
        replace(a, programs=(0,)) if a.role is AnchorRole.WEIGHT and a.name == "W" else a
        for a in meta.anchors
    )
    tensors = tiny_tensors()
    tensors[MAIN_PAYLOAD] = np.frombuffer(model.SerializeToString(), np.uint8)
    return replace(meta, anchors=anchors), tensors


def _write(path: Path, model: onnx.ModelProto) -> Path:
    """Seal a file around ``model`` with a correct hash, bypassing :meth:`Executable.build`
    (which validates): what a hostile or broken writer could hand us."""
    meta, tensors = _parts(model)
    sealed = replace(meta, package_hash=compute_package_hash(meta, tensors))
    write_safetensors(path, tensors, {METADATA_KEY: metadata_to_json(sealed, include_hash=True)})
    return path


def _set_initializer(t: Any) -> Mutate:
    """Replace the initializer ``W`` with ``t``."""

    def mutate(model: onnx.ModelProto) -> None:
        kept = [i for i in model.graph.initializer if i.name != "W"]
        del model.graph.initializer[:]
        model.graph.initializer.extend([*kept, t])

    return mutate


def _x() -> dict[str, np.ndarray]:
    return {"x": np.arange(8, dtype=np.float32).reshape(2, 4)}


def test_a_weight_at_the_sentinel_loads_and_runs_from_the_executables_tensor(
    tmp_path: Path,
) -> None:
    exe = Executable.load(_write(tmp_path / "ok.mrx", _payload()))
    b = CpuBackend(DeviceSpec(0, "cpu", 1))
    b.load(exe, None)
    (out,) = b.run_main([_x()])
    t = tiny_tensors()
    np.testing.assert_allclose(out["y"], _x()["x"] @ t["W"] + t["b"], rtol=1e-6)
    # The same program with W as a graph input (the layout of older executables) agrees.
    old = CpuBackend(DeviceSpec(0, "cpu", 1))
    old.load(weights_as_inputs(exe), None)
    np.testing.assert_array_equal(old.run_main([_x()])[0]["y"], out["y"])


def test_payload_reading_a_file_is_refused_before_onnxruntime_sees_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "secret.bin").write_bytes(np.full((4, 3), 7.0, np.float32).tobytes())

    payload = _payload(_set_initializer(_external("W", "secret.bin")))
    # Why it matters: handed this payload, onnxruntime reads the file from the working dir.
    so = ort.SessionOptions()
    so.log_severity_level = 4
    session = ort.InferenceSession(payload.SerializeToString(), so)
    feed = {"x": np.ones((2, 4), np.float32), "b": np.zeros(3, np.float32)}
    (y, _) = session.run(None, {**feed, "counter": np.zeros(1, np.float32)})
    np.testing.assert_array_equal(y, np.full((2, 3), 28.0, np.float32))  # 4 x 7, read from disk

    path = _write(tmp_path / "secret.mrx", payload)
    for kw in ({}, {"check_package_hash": False}):
        with pytest.raises(InvalidExecutableError, match=r"'W' references external data") as info:
            Executable.load(path, **kw)
        assert "secret.bin" in str(info.value) and "data only" in str(info.value)
        assert str(path) in str(info.value)
    with pytest.raises(InvalidExecutableError, match=r"secret\.bin"):
        Executable.build(*_parts(payload))


def _constant_node_from_file(model: onnx.ModelProto) -> None:
    node = helper.make_node("Constant", [], ["k"], value=_external("k", "k.bin", (3,)))
    model.graph.node.append(node)
    model.graph.node.append(helper.make_node("Add", ["y", "k"], ["y2"]))


def _subgraph_initializer_from_file(model: onnx.ModelProto) -> None:
    branch = helper.make_graph(
        [helper.make_node("Identity", ["v"], ["out"])],
        "branch",
        [],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [3])],
        initializer=[_external("v", "v.bin", (3,))],
    )
    cond = numpy_helper.from_array(np.array(True), "cond")
    model.graph.initializer.append(cond)
    model.graph.node.append(
        helper.make_node("If", ["cond"], ["z"], then_branch=branch, else_branch=branch)
    )


def _sentinel_with_data(model: onnx.ModelProto) -> None:
    (w,) = [t for t in model.graph.initializer if t.name == "W"]
    w.raw_data = np.zeros((4, 3), np.float32).tobytes()


def _sentinel_also_input(model: onnx.ModelProto) -> None:
    model.graph.input.append(helper.make_tensor_value_info("W", TensorProto.FLOAT, [4, 3]))


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (_set_initializer(_external("W", "/etc/passwd")), r"'/etc/passwd'\); an executable"),
        (_set_initializer(_external("W", "*/_ORT_MEM_ADDR_/*", offset="4096")), "_ORT_MEM_ADDR_"),
        (
            _set_initializer(_external("W", WEIGHT_DATA_LOCATION, offset="16", length="48")),
            "data only",
        ),
        (_set_initializer(_external("W", WEIGHT_DATA_LOCATION, (3, 4))), r"as float32\[3, 4\]"),
        (_constant_node_from_file, "'k' references external data .*'k.bin'"),
        (_subgraph_initializer_from_file, "'v' references external data .*'v.bin'"),
        (_sentinel_with_data, "holds data of its own"),
        (_sentinel_also_input, "is also a graph input"),
    ],
    ids=[
        "absolute-path",
        "memory-address",
        "sentinel-with-offset",
        "sentinel-wrong-shape",
        "constant-node",
        "subgraph",
        "sentinel-with-data",
        "sentinel-and-input",
    ],
)
def test_external_data_other_than_own_weights_is_invalid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mutate: Mutate, match: str
) -> None:
    # The files exist, so neither the ONNX checker nor onnxruntime would object on their own.
    monkeypatch.chdir(tmp_path)
    for name in ("k.bin", "v.bin"):
        (tmp_path / name).write_bytes(np.ones(3, np.float32).tobytes())
    with pytest.raises(InvalidExecutableError, match=match):
        Executable.load(_write(tmp_path / "bad.mrx", _payload(mutate)))


def test_sentinel_naming_no_weight_is_refused_at_load_and_by_the_device(tmp_path: Path) -> None:
    def extra(model: onnx.ModelProto) -> None:
        model.graph.initializer.append(_external("ghost", WEIGHT_DATA_LOCATION, (3,)))
        model.graph.node.append(helper.make_node("Add", ["y", "ghost"], ["y2"]))

    payload = _payload(extra)
    with pytest.raises(InvalidExecutableError, match="no weight anchor with data has handle"):
        Executable.load(_write(tmp_path / "ghost.mrx", payload))
    # An executable assembled around validation: the device never lets onnxruntime look.
    meta, tensors = _parts(payload)
    with pytest.raises(ApplicationRuntimeError, match="'ghost' names no weight"):
        CpuBackend(DeviceSpec(0, "cpu", 1)).load(Executable(meta, tensors), None)

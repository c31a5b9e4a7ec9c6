"""String constants (ONNX STRING initializers): the compiler stores each as a ``bytes`` weight
whose data is an ``uint64`` offsets and an ``uint8`` bytes tensor, nothing of it in the payload;
loading checks both tensors; devices put the strings back into the graph and answer as
onnxruntime does on the source model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from actors.device.backends import CpuBackend
from actors.device.inventory import DeviceSpec
from model_runtime.compiler import CompileOptions, compile_executable, run_reference
from model_runtime.compiler.lower import weights_as_inputs
from model_runtime.errors import InputValidationError, InvalidExecutableError
from model_runtime.executable import Executable, compute_package_hash, summarize
from model_runtime.executable.model import Anchor, AnchorRole, AnchorType, TensorInfo
from model_runtime.executable.strings import pack_strings, string_tensor_names, unpack_strings
from model_runtime.executable.validate import WEIGHT_DATA_LOCATION
from tests.models import make_mlp

CPU = DeviceSpec(0, "cpu", 1)
LABELS = [b"cat", "caf\u00e9".encode(), b"", b"a longer label, with spaces"]
OFFSETS, BYTES = string_tensor_names("labels")
Tensors = dict[str, np.ndarray]


def make_labeller() -> onnx.ModelProto:
    """``label = labels[index]`` (a STRING initializer) and ``is_empty = label == ""`` (a STRING
    ``Constant`` node): ``index`` INT64 [N] in, ``label`` STRING and ``is_empty`` BOOL [N] out."""
    labels = helper.make_tensor("labels", TensorProto.STRING, [len(LABELS)], LABELS)
    empty = helper.make_tensor("empty_value", TensorProto.STRING, [], [b""])
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["labels", "index"], ["label"]),
            helper.make_node("Constant", [], ["empty"], value=empty),
            helper.make_node("Equal", ["label", "empty"], ["is_empty"]),
        ],
        "labeller",
        [helper.make_tensor_value_info("index", TensorProto.INT64, ["N"])],
        [
            helper.make_tensor_value_info("label", TensorProto.STRING, ["N"]),
            helper.make_tensor_value_info("is_empty", TensorProto.BOOL, ["N"]),
        ],
        [labels],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    return model


@pytest.fixture(scope="module")
def exe() -> Executable:
    return compile_executable(make_labeller(), CompileOptions(batch_size=4))


def _payload(exe: Executable) -> onnx.ModelProto:
    return onnx.load_model_from_string(exe.program_payload(exe.metadata.program_flow.main[0]))


def _source(index: np.ndarray) -> list[Any]:
    session = ort.InferenceSession(
        make_labeller().SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return [v.tolist() for v in session.run(["label", "is_empty"], {"index": index})]


def _on_device(
    exe: Executable, index: np.ndarray, frozen: Tensors | None = None, name: str = "index"
) -> Tensors:
    backend = CpuBackend(CPU)
    backend.load(exe, frozen)
    (out,) = backend.run_main([{name: index}])
    return out


def test_a_string_constant_is_an_offsets_and_a_bytes_tensor(exe: Executable) -> None:
    m = exe.metadata
    strings = {a.name: a for a in m.weights if a.dtype.kind == "O"}
    # The Constant node became an initializer when optimised: both are string constants.
    assert set(strings) == {"labels", "empty"}
    labels = strings["labels"]
    assert (labels.shape, labels.has_data, labels.type) == ((4,), True, AnchorType.INPUT)
    assert strings["empty"].shape == ()
    offsets, data = exe.tensor(OFFSETS), exe.tensor(BYTES)
    assert offsets.dtype == np.uint64 and offsets.tolist() == [0, 3, 8, 8, 35]
    assert data.dtype == np.uint8 and data.tobytes() == b"".join(LABELS)
    assert exe.anchor_data("labels").tolist() == LABELS
    sizes = {a["name"]: a["size_bytes"] for a in summarize(exe)["anchors"]}
    assert sizes["labels"] == 5 * 8 + 35  # what inspect shows: its offsets and bytes
    assert m.format_version == 2  # a runtime reading only version 1 refuses it by its version


def test_the_payload_holds_no_string_data(exe: Executable) -> None:
    payload = _payload(exe)
    stubs = {t.name: t for t in payload.graph.initializer if t.data_type == TensorProto.STRING}
    assert set(stubs) == {"labels", "empty"}
    for t in stubs.values():
        assert not t.string_data
        assert [(e.key, e.value) for e in t.external_data] == [("location", WEIGHT_DATA_LOCATION)]
    assert "café".encode() not in exe.program_payload(1)
    assert b"a longer label" not in exe.program_payload(1)


def test_it_answers_as_onnxruntime_on_the_source_model(exe: Executable, tmp_path: Path) -> None:
    index = np.array([3, 0, 2, 1], np.int64)
    labels, empty = _source(index)
    loaded = Executable.load(exe.save(tmp_path / "labels.mrx"))
    for e in (exe, loaded):
        out = _on_device(e, index)
        assert out["label"].tolist() == [s.encode() for s in labels]
        assert out["is_empty"].tolist() == empty == [False, False, True, False]
        # The reference runner speaks onnxruntime's str, as the source model does.
        ref = run_reference(e, {"index": index})
        assert ref["label"].tolist() == labels and ref["is_empty"].tolist() == empty


def test_a_scikit_learn_classifier_with_its_classes_as_a_string_constant() -> None:
    from skl2onnx import to_onnx
    from sklearn.datasets import load_iris
    from sklearn.neighbors import KNeighborsClassifier

    x, y = load_iris(return_X_y=True)
    x = x.astype(np.float32)
    species = np.array(["setosa", "versicolor", "virginica"])[y]
    clf = KNeighborsClassifier().fit(x, species)
    model = to_onnx(clf, x[:1], options={"zipmap": False}, target_opset=17)
    assert any(t.data_type == TensorProto.STRING for t in model.graph.initializer)
    exe = compile_executable(model, CompileOptions(batch_size=5))
    (classes,) = [a for a in exe.metadata.weights if a.dtype.kind == "O"]
    assert exe.anchor_data(classes.name).tolist() == [b"setosa", b"versicolor", b"virginica"]
    rows = x[[0, 60, 120, 1, 75]]
    out = _on_device(exe, rows, name="X")
    assert [v.decode() for v in out["label"]] == clf.predict(rows).tolist()


def test_a_frozen_string_constant_replaces_the_stored_one(exe: Executable) -> None:
    other = np.array([b"w", b"x", b"y", b"z"], dtype=object)
    out = _on_device(exe, np.array([3, 0, 2, 1], np.int64), {"labels": other})
    assert out["label"].tolist() == [b"z", b"w", b"y", b"x"]
    with pytest.raises(InputValidationError, match="bytes or str"):
        _on_device(exe, np.zeros(4, np.int64), {"labels": np.array([1, 2, 3, 4], dtype=object)})


def test_weights_as_inputs_puts_the_strings_back_in_the_payload(exe: Executable) -> None:
    old = weights_as_inputs(exe)  # the layout compilers wrote before: format 1, strings inline
    assert old.metadata.format_version == 1
    assert not [a for a in old.metadata.weights if a.dtype.kind == "O"]
    assert not [n for n in old.tensor_names if n.startswith("__strings__/")]
    inline = {t.name: list(t.string_data) for t in _payload(old).graph.initializer}
    assert inline["labels"] == LABELS
    index = np.array([1, 2, 3, 0], np.int64)
    assert _on_device(old, index)["label"].tolist() == [LABELS[i] for i in index]


def test_models_without_strings_are_still_written_as_format_version_1() -> None:
    exe = compile_executable(make_mlp(), CompileOptions(batch_size=2))
    assert exe.metadata.format_version == 1


@pytest.mark.parametrize(
    "values",
    [[], [b""], [b"\xff\x00", "é"], [b"x" * 1000, b"", b"y"]],
    ids=["none", "one-empty", "not-utf8-and-str", "big"],
)
def test_pack_and_unpack_round_trip(values: list[Any]) -> None:
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    offsets, data = pack_strings(arr)
    assert offsets.dtype == np.uint64 and data.dtype == np.uint8 and len(offsets) == len(arr) + 1
    want = [v.encode() if isinstance(v, str) else v for v in values]
    assert unpack_strings(offsets, data, arr.shape).tolist() == want


# -- refused on load -----------------------------------------------------------------------


def _sealed(path: Path, exe: Executable, *, tensors: Tensors | None = None, **meta: Any) -> Path:
    """``exe`` with changed tensors or metadata fields, under a valid package hash (so what
    refuses it is validation, not the hash)."""
    t = {n: exe.tensor(n) for n in exe.tensor_names} if tensors is None else tensors
    m = replace(exe.metadata, package_hash="", **meta)
    m = replace(m, package_hash=compute_package_hash(m, t))
    return Executable(m, t).save(path)


def _with(**changes: np.ndarray | None) -> Callable[[Executable], Tensors]:
    def change(exe: Executable) -> Tensors:
        t = {n: exe.tensor(n) for n in exe.tensor_names}
        for key, value in changes.items():
            name = {"offsets": OFFSETS, "data": BYTES}[key]
            if value is None:
                del t[name]
            else:
                t[name] = value
        return t

    return change


_U8 = np.frombuffer(b"".join(LABELS), np.uint8)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (_with(offsets=np.array([0, 8, 3, 8, 35], np.uint64)), "offsets decrease at element 1"),
        (_with(offsets=np.array([0, 3, 8, 8, 34], np.uint64)), "end at 34, its bytes hold 35"),
        (_with(offsets=np.array([0, 3, 8, 8, 35, 35], np.uint64)), r"needs offsets uint64\[5\]"),
        (_with(offsets=np.array([0, 3, 8, 35], np.uint64)), r"needs offsets uint64\[5\]"),
        (_with(offsets=np.array([0, 3, 8, 8, 35], np.int64)), r"is int64\[5\]"),
        (_with(offsets=np.array([1, 3, 8, 8, 35], np.uint64)), "offsets start at 1, not 0"),
        (_with(data=_U8.view(np.int8)), "not 1-d uint8"),
        (_with(data=_U8.reshape(5, 7)), "not 1-d uint8"),
        (_with(offsets=None), "tensor '__strings__/labels/offsets' is missing"),
        (_with(data=None), "tensor '__strings__/labels/bytes' is missing"),
    ],
    ids=[
        "decreasing", "wrong-end", "too-long", "too-short", "wrong-dtype", "start",
        "bytes-dtype", "bytes-2d", "no-offsets", "no-bytes",
    ],
)  # fmt: skip
def test_corrupt_string_tensors_are_refused_naming_the_anchor(
    exe: Executable, tmp_path: Path, change: Callable[[Executable], Tensors], match: str
) -> None:
    path = _sealed(tmp_path / "bad.mrx", exe, tensors=change(exe))
    with pytest.raises(InvalidExecutableError, match=f"anchor 'labels': string constant.*{match}"):
        Executable.load(path)


def _labels(exe: Executable, **fields: Any) -> tuple[Anchor, ...]:
    return tuple(replace(a, **fields) if a.name == "labels" else a for a in exe.metadata.anchors)


def test_an_absurd_count_is_refused_before_anything_is_sized_from_it(
    exe: Executable, tmp_path: Path
) -> None:
    huge = TensorInfo((1 << 33,), np.dtype(object))
    path = _sealed(tmp_path / "huge.mrx", exe, anchors=_labels(exe, tensor_info=huge))
    with pytest.raises(InvalidExecutableError, match=r"anchor 'labels'.*uint64\[8589934593\]"):
        Executable.load(path)


@pytest.mark.parametrize(
    ("meta", "match"),
    [
        ({"format_version": 1}, "anchor 'labels': a string constant needs format version 2"),
        ({"format_version": 4}, "unsupported format version 4"),
        (
            {"role": AnchorRole.VARIABLE, "type": AnchorType.UNKNOWN},
            "anchor 'labels': a bytes anchor must be a user input or output without data",
        ),
    ],
    ids=["format-1", "format-4", "variable"],
)
def test_string_constants_outside_their_format_are_refused(
    exe: Executable, tmp_path: Path, meta: dict[str, Any], match: str
) -> None:
    fields = {k: v for k, v in meta.items() if k == "format_version"}
    anchor_fields = {k: v for k, v in meta.items() if k != "format_version"}
    if anchor_fields:
        fields["anchors"] = _labels(exe, **anchor_fields)
    with pytest.raises(InvalidExecutableError, match=match):
        Executable.load(_sealed(tmp_path / "bad.mrx", exe, **fields))


def test_a_string_constant_no_program_uses_is_refused(exe: Executable, tmp_path: Path) -> None:
    # A device hands strings to onnxruntime only through the graph: one that is no initializer
    # at the sentinel (here the payload has it inline again) would be silently ignored.
    old = weights_as_inputs(exe)
    t = {n: old.tensor(n) for n in old.tensor_names}
    t.update({n: exe.tensor(n) for n in (OFFSETS, BYTES)})
    labels = exe.metadata.anchor("labels")
    path = _sealed(
        tmp_path / "orphan.mrx",
        old,
        tensors=t,
        anchors=(*old.metadata.anchors, labels),
        format_version=2,
    )
    with pytest.raises(InvalidExecutableError, match="anchor 'labels': no main program has"):
        Executable.load(path)


def test_a_string_tensor_named_by_another_anchor_is_refused(
    exe: Executable, tmp_path: Path
) -> None:
    u64 = TensorInfo((5,), np.dtype(np.uint64))
    squatter = Anchor(
        OFFSETS, OFFSETS, u64, AnchorType.INPUT, AnchorRole.WEIGHT, (0,), has_data=True
    )
    path = _sealed(tmp_path / "clash.mrx", exe, anchors=(*exe.metadata.anchors, squatter))
    with pytest.raises(InvalidExecutableError, match="anchor 'labels': its string tensor"):
        Executable.load(path)

"""The .mrx format: round trips, split files, and every kind of bad file a user could hand us."""

from __future__ import annotations

import json
import os
import struct
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from model_runtime.errors import InvalidExecutableError, PackageHashMismatchError
from model_runtime.executable import Executable, compute_package_hash
from model_runtime.executable.codec import metadata_from_json, metadata_to_json
from model_runtime.executable.container import METADATA_KEY
from model_runtime.executable.model import AnchorRole, AnchorType
from model_runtime.executable.safetensors_io import write_safetensors
from model_runtime.executable.testing import MAIN_PAYLOAD, tiny_executable, tiny_tensors

Doc = dict[str, Any]


def _write_doc(path: Path, doc: Doc, tensors: dict[str, np.ndarray] | None = None) -> Path:
    """Write metadata ``doc`` with ``tensors``, sealed with a correct hash when it decodes, so
    the error a test sees comes from the defect it planted, not from the hash."""
    tensors = tiny_tensors() if tensors is None else tensors
    doc = dict(doc, package_hash="")
    try:
        meta = metadata_from_json(json.dumps(doc), where="<test>")
        doc["package_hash"] = compute_package_hash(meta, tensors)
    except InvalidExecutableError:
        pass
    write_safetensors(path, tensors, {METADATA_KEY: json.dumps(doc)})
    return path


def _doc() -> Doc:
    doc: Doc = json.loads(metadata_to_json(tiny_executable().metadata, include_hash=True))
    return doc


def _write_raw(path: Path, header: bytes, data: bytes = b"") -> Path:
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return path


def _raises(exc: type[Exception], path: Path, match: str, **kw: Any) -> InvalidExecutableError:
    with pytest.raises(exc, match=match) as info:
        Executable.load(path, **kw)
    assert str(path) in str(info.value), f"message does not name the file: {info.value}"
    assert isinstance(info.value, InvalidExecutableError)
    return info.value


@pytest.fixture
def good(tmp_path: Path) -> Path:
    return tiny_executable().save(tmp_path / "good.mrx")


# -- round trips -------------------------------------------------------------------------------


def test_round_trip_single_file_keeps_metadata_tensors_and_hash(good: Path) -> None:
    built = tiny_executable()
    loaded = Executable.load(good)
    assert loaded.metadata == built.metadata
    assert loaded.package_hash == built.package_hash and len(loaded.package_hash) == 64
    for name in built.tensor_names:
        np.testing.assert_array_equal(loaded.tensor(name), built.tensor(name))
    assert loaded.program_payload(1) == built.program_payload(1)
    assert loaded.sources == (good,)


def test_round_trip_split_files_assemble_on_load(tmp_path: Path) -> None:
    built = tiny_executable()
    prog, weights = built.save_split(tmp_path / "p.mrx", tmp_path / "w.mrx")
    loaded = Executable.load([weights, prog])  # order does not matter
    assert loaded.metadata == built.metadata
    np.testing.assert_array_equal(loaded.tensor("W"), built.tensor("W"))
    with pytest.raises(InvalidExecutableError, match="anchor 'W' has data but the tensor"):
        Executable.load(prog)


def test_loaded_tensors_are_read_only_views_of_one_private_buffer(good: Path) -> None:
    # Private memory, not a map of the file (a file changed in place must not show through,
    # see tests/integration/test_file_changes.py); one buffer per file, no copy per tensor.
    loaded = Executable.load(good)
    bases = set()
    for name in loaded.tensor_names:
        arr = loaded.tensor(name)
        assert not arr.flags.writeable
        with pytest.raises(ValueError, match="WRITEABLE"):
            arr.flags.writeable = True
        base: Any = arr
        while isinstance(base, np.ndarray) and base.base is not None:
            base = base.base
        assert isinstance(base, np.ndarray), f"tensor {name} lives in {type(base)}, not ours"
        assert not base.flags.writeable
        bases.add(id(base))
    assert len(bases) == 1


def test_file_replaced_or_deleted_after_load_keeps_the_loaded_data(tmp_path: Path) -> None:
    path = tiny_executable(seed=1).save(tmp_path / "m.mrx")
    loaded = Executable.load(path)
    before = np.array(loaded.tensor("W"))
    tiny_executable(seed=2).save(path)  # atomic replace, as every writer here does
    np.testing.assert_array_equal(loaded.tensor("W"), before)
    path.unlink()
    np.testing.assert_array_equal(loaded.tensor("W"), before)
    assert compute_package_hash(loaded.metadata, {n: loaded.tensor(n) for n in loaded.tensor_names})


def test_check_package_hash_false_loads_tampered_data_but_still_checks_structure(
    good: Path, tmp_path: Path
) -> None:
    raw = bytearray(good.read_bytes())
    w = tiny_tensors()["W"].tobytes()
    at = bytes(raw).index(w)
    raw[at] ^= 0xFF
    bad = tmp_path / "tampered.mrx"
    bad.write_bytes(bytes(raw))
    _raises(PackageHashMismatchError, bad, "package hash mismatch")
    loaded = Executable.load(bad, check_package_hash=False)
    assert not np.array_equal(loaded.tensor("W"), tiny_tensors()["W"])
    doc = _doc()
    doc["batch_size"] = 0
    _raises(
        InvalidExecutableError,
        _write_doc(tmp_path / "b.mrx", doc),
        "batch_size",
        check_package_hash=False,
    )


# -- the container ------------------------------------------------------------------------------


def _truncate(at: int) -> Callable[[bytes], bytes]:
    return lambda b: b[:at]


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (_truncate(0), "truncated"),
        (_truncate(5), "truncated"),
        (_truncate(100), "header length"),
        (lambda b: b[:-3], "data offsets|trailing|needs"),
        (lambda b: b"\x89PNG\r\n\x1a\n" + b[8:], "header length|magic"),
        (lambda b: b"PK\x03\x04\x14\x00\x00\x00" + b[8:], "header length|magic"),
        (lambda b: b + b"\0" * 16, "16 trailing bytes"),
        (lambda b: b[:8] + b"[" + b[9:], "not a JSON object|magic"),
        (lambda b: b[:8] + b"{" * 4 + b[12:], "not valid JSON"),
    ],
    ids=["empty", "5-bytes", "mid-header", "mid-data", "png", "zip", "appended", "array", "json"],
)
def test_damaged_container_is_invalid(
    good: Path, tmp_path: Path, mutate: Callable[[bytes], bytes], match: str
) -> None:
    bad = tmp_path / "bad.mrx"
    bad.write_bytes(mutate(good.read_bytes()))
    _raises(InvalidExecutableError, bad, match)


def _entry(dtype: str, shape: list[int], offs: list[int]) -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "data_offsets": offs}


@pytest.mark.parametrize(
    ("header", "data", "match"),
    [
        (b"[" * 200_000, b"", "not a JSON object"),
        (b'{"a":' + b"[" * 200_000 + b"]" * 200_000 + b"}", b"", "nested too deeply"),
        (
            json.dumps(
                {"a": _entry("F32", [2], [0, 8]), "b": _entry("F32", [2], [4, 12])}
            ).encode(),
            bytes(12),
            "overlaps",
        ),
        (
            json.dumps(
                {"a": _entry("F32", [1], [0, 4]), "b": _entry("F32", [1], [8, 12])}
            ).encode(),
            bytes(12),
            "4 bytes before tensor 'b' belong to no tensor",
        ),
        (json.dumps({"a": _entry("F32", [-1], [0, 4])}).encode(), bytes(4), "bad shape"),
        (json.dumps({"a": _entry("F32", [2**39, 2**39], [0, 4])}).encode(), bytes(4), "needs"),
        (json.dumps({"a": _entry("F32", [1], [0, 2**62])}).encode(), bytes(4), "offsets"),
        (json.dumps({"a": _entry("Q9", [1], [0, 4])}).encode(), bytes(4), "unsupported dtype"),
        (json.dumps({"a": {"dtype": "F32", "shape": [1]}}).encode(), bytes(4), "entry keys"),
        (json.dumps({"__metadata__": {"k": 1}}).encode(), b"", "__metadata__"),
        (json.dumps({"__metadata__": ["x"]}).encode(), b"", "__metadata__"),
        (
            b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
            b'"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}',
            bytes(1),
            "duplicate key 'a'",
        ),
        (b'{"__metadata__":{"x":"\xff\xfe"}}', b"", "not valid JSON"),
        (b'{"a":{"dtype":"F32","shape":[NaN],"data_offsets":[0,4]}}', bytes(4), "not valid JSON"),
    ],
    ids=[
        "array-nest",
        "deep-nest",
        "overlap",
        "gap",
        "negative",
        "absurd",
        "offset",
        "dtype",
        "keys",
        "meta-int",
        "meta-list",
        "dup-key",
        "utf8",
        "nan",
    ],
)
def test_hostile_header_is_invalid(tmp_path: Path, header: bytes, data: bytes, match: str) -> None:
    _raises(InvalidExecutableError, _write_raw(tmp_path / "h.mrx", header, data), match)


def test_huge_header_length_fails_fast_without_allocating(tmp_path: Path) -> None:
    bad = tmp_path / "huge.mrx"
    bad.write_bytes(struct.pack("<Q", 2**63) + b"{}")
    with open(tmp_path / "sparse.mrx", "wb") as f:  # a header length that fits the file size
        f.write(struct.pack("<Q", 1 << 30) + b"{")
        f.truncate(1 << 31)
    tracemalloc.start()
    start = time.perf_counter()
    for path in (bad, tmp_path / "sparse.mrx"):
        _raises(InvalidExecutableError, path, "header length")
    elapsed = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 1 << 20 and elapsed < 1.0


def test_not_a_file(tmp_path: Path) -> None:
    _raises(InvalidExecutableError, tmp_path / "missing.mrx", "no such file")
    _raises(InvalidExecutableError, tmp_path, "not a regular file")
    fifo = tmp_path / "fifo.mrx"
    os.mkfifo(fifo)
    _raises(InvalidExecutableError, fifo, "not a regular file")  # must not block on open


def test_split_file_defects(tmp_path: Path) -> None:
    built = tiny_executable()
    prog, weights = built.save_split(tmp_path / "p.mrx", tmp_path / "w.mrx")
    with pytest.raises(InvalidExecutableError, match="no file carries executable metadata") as e:
        Executable.load([weights])
    assert str(weights) in str(e.value)
    with pytest.raises(InvalidExecutableError, match="more than one file carries metadata"):
        Executable.load([prog, built.save(tmp_path / "full.mrx", tensors=["W"])])
    with pytest.raises(InvalidExecutableError, match="'W' is in two files"):
        Executable.load([built.save(tmp_path / "all.mrx"), weights])
    with pytest.raises(InvalidExecutableError, match="no executable files"):
        Executable.load([])


# -- the metadata document ----------------------------------------------------------------------


_DEL = object()


def _set(path: str, value: Any) -> Callable[[Doc], None]:
    """Mutator setting ``doc[a][b]...`` (keys split on '/', ints index lists); _DEL deletes."""

    def mutate(doc: Doc) -> None:
        *parents, last = [int(k) if k.isdigit() else k for k in path.split("/")]
        obj: Any = doc
        for k in parents:
            obj = obj[k]
        if value is _DEL:
            del obj[last]
        else:
            obj[last] = value

    return mutate


def _dup_anchor(doc: Doc) -> None:
    doc["anchors"].append(dict(doc["anchors"][0]))


_NOT_ONNX = np.frombuffer(b"this is not an onnx model at all", np.uint8)
_PROTO_NOISE = np.frombuffer(bytes([0x7A, 0x03]) + b"abc", np.uint8)  # parses: unknown field 15


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (_set("batch_size", _DEL), r"\$\.batch_size: missing"),
        (_set("anchors/0/role", _DEL), r"\$\.anchors\[0\]\.role: missing"),
        (_set("target", "cpu"), r"\$\.target: expected an object"),
        (_set("batch_size", "2"), "expected an integer"),
        (_set("format_version", 99), "unsupported format version"),
        (_set("anchors/2/shape", [-4, 3]), r"anchors\[2\]\.shape\[0\]"),
        (_set("anchors/2/shape", [2**40, 2**40, 4]), "absurd shape"),
        (_set("anchors/2/shape", [1] * 65), "rank 65 is absurd"),
        (_set("anchors/2/shape", [3, 4]), r"anchor 'W' is float32\[3, 4\] but its tensor is"),
        (_set("anchors/2/dtype", "float64"), r"anchor 'W' is float64\[4, 3\] but its tensor"),
        (_set("anchors/2/dtype", "complex64"), "unsupported dtype"),
        (_set("anchors/2/has_data", False), "weight without data"),
        (_dup_anchor, "duplicate anchor name 'x'"),
        (_set("target/device_kind", "gpu"), "unknown target device kind 'gpu'"),
        (_set("target/version", 2), "target cpu has IPU version 2"),
        (_set("program_flow/load", [7]), "program flow load names unknown program 7"),
        (_set("program_flow/main", []), "program flow main is empty"),
        (_set("program_flow/main", [0]), "program flow main names load program"),
        (_set("programs/1/payload", None), "main program 'main' has no payload"),
        (_set("programs/0/payload", MAIN_PAYLOAD), "load program 'load' has a payload"),
        (_set("programs/2/id", 1), "duplicate program ids"),
        (_set("anchors/0/programs", [5]), "anchor 'x' names unknown program 5"),
        (_set("anchors/2/type", "OUTPUT"), "anchor 'W': a weight must be INPUT, not OUTPUT"),
        (_set("anchors/0/type", "OUTPUT"), "a user_input must be INPUT"),
        (_set("anchors/4/type", "OUTPUT"), "a variable must be INPUT or UNKNOWN"),
        (_set("anchors/2/batch_dim", 0), "a weight has a batch_dim"),
        (_set("anchors/0/batch_dim", 5), "batch_dim 5 beyond its rank"),
        (
            _set("batch_size", 3),
            r"anchor 'x': dimension 0 \(its batch_dim\) is 2 .* batch_size is 3",
        ),
        (
            _set("output_to_variable", {"counter_out": "W"}),
            "'W', which is a weight, not a variable",
        ),
        (_set("output_to_variable", {"y": "counter"}), r"maps 'y' float32\[2, 3\] -> 'counter'"),
        (_set("output_to_variable", {"x": "counter"}), "'x', which is not an OUTPUT anchor"),
        (_set("output_to_variable", {"nope": "counter"}), "unknown anchor"),
        (_set("anchors/0/handle", "input"), "has no graph input 'input'"),
        (_set("anchors/0/shape", [2, 5]), r"'x' dimension 1 = 4"),
        (_set("options", {"k": 1}), r"\$\.options: expected an object of strings"),
    ],
)
def test_inconsistent_metadata_is_invalid(
    tmp_path: Path, mutate: Callable[[Doc], None], match: str
) -> None:
    doc = _doc()
    mutate(doc)
    _raises(InvalidExecutableError, _write_doc(tmp_path / "m.mrx", doc), match)


@pytest.mark.parametrize("payload", [_NOT_ONNX, _PROTO_NOISE], ids=["text", "protobuf-noise"])
def test_main_payload_that_is_not_onnx_is_invalid(tmp_path: Path, payload: np.ndarray) -> None:
    tensors = dict(tiny_tensors(), **{MAIN_PAYLOAD: payload})
    path = _write_doc(tmp_path / "p.mrx", _doc(), tensors)
    err = _raises(InvalidExecutableError, path, "main program 'main' .* not a.* ONNX model")
    assert type(err) is InvalidExecutableError
    with pytest.raises(InvalidExecutableError, match=r"not a.* ONNX model"):
        Executable.build(tiny_executable().metadata, tensors)


def test_graph_and_anchor_dtypes_must_agree(tmp_path: Path) -> None:
    doc = _doc()
    doc["anchors"][0]["dtype"] = "float16"
    _raises(InvalidExecutableError, _write_doc(tmp_path / "d.mrx", doc), r"as float32")


def test_metadata_json_defects(tmp_path: Path) -> None:
    tensors = tiny_tensors()
    for i, text in enumerate(['{"format_version": 1,', '{"a":1,"a":2}', "[" * 5000, '"x"']):
        path = tmp_path / f"j{i}.mrx"
        write_safetensors(path, tensors, {METADATA_KEY: text})
        _raises(InvalidExecutableError, path, "metadata")


def test_build_rejects_what_load_rejects() -> None:
    meta = tiny_executable().metadata
    w = next(a for a in meta.anchors if a.name == "W")
    bad = replace(w, role=AnchorRole.WEIGHT, type=AnchorType.OUTPUT)
    anchors = tuple(bad if a is w else a for a in meta.anchors)
    with pytest.raises(InvalidExecutableError, match="<built executable>: anchor 'W'"):
        Executable.build(replace(meta, anchors=anchors), tiny_tensors())

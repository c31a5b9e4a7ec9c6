"""JSON encoding of :class:`ExecutableMetadata` (the ``__metadata__`` document of a ``.mrx``).

Decoding is strict: every missing key, wrong type or unknown enum value raises
:class:`InvalidExecutableError` naming the file and the JSON path of the defect.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from model_runtime.errors import InvalidExecutableError
from model_runtime.executable.model import (
    DYNAMIC_FORMAT_VERSION,
    READABLE_FORMAT_VERSIONS,
    Anchor,
    AnchorRole,
    AnchorType,
    CustomOpRef,
    ExecutableMetadata,
    Program,
    ProgramFlow,
    ProgramKind,
    Target,
    TensorInfo,
)
from model_runtime.executable.safetensors_io import parse_json_strict

__all__ = ["BYTES_DTYPE", "DTYPES", "dtype_name", "metadata_from_json", "metadata_to_json"]

#: A string anchor's dtype (ONNX STRING, protocol BYTES): at run time a numpy object array of
#: ``bytes``; stored in the file by the name ``bytes``. Only a weight of this dtype has data,
#: stored as an offsets and a bytes tensor (see ``strings``).
BYTES_DTYPE: np.dtype[Any] = np.dtype(object)

#: dtypes an anchor may have, by the name stored in the file.
DTYPES: dict[str, np.dtype[Any]] = {
    name: np.dtype(name)
    for name in (
        "bool",
        "uint8",
        "int8",
        "uint16",
        "int16",
        "uint32",
        "int32",
        "uint64",
        "int64",
        "float16",
        "float32",
        "float64",
    )
}
DTYPES["bytes"] = BYTES_DTYPE


def dtype_name(dtype: np.dtype[Any]) -> str:
    """The name ``dtype`` is stored under (``bytes`` for strings, else numpy's name)."""
    return "bytes" if dtype.kind == "O" else dtype.name


def _anchor_to_dict(a: Anchor) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": a.name,
        "handle": a.handle,
        "shape": list(a.tensor_info.shape),
        "dtype": dtype_name(a.tensor_info.dtype),
        "type": a.type.value,
        "role": a.role.value,
        "programs": list(a.programs),
        "is_per_replica": a.is_per_replica,
        "has_data": a.has_data,
        "batch_dim": a.batch_dim,
    }
    if a.dim_names:  # only dynamic anchors (format 3) carry it: older files stay identical
        doc["dim_names"] = list(a.dim_names)
    return doc


def metadata_to_json(m: ExecutableMetadata, *, include_hash: bool) -> str:
    """Canonical JSON (sorted keys, no whitespace) of ``m``.

    Raises:
        TypeError: a field holds a value JSON cannot encode (a bug in whoever built ``m``).
    """
    doc = {
        "format_version": m.format_version,
        "model_name": m.model_name,
        "target": {
            "device_kind": m.target.device_kind,
            "num_devices": m.target.num_devices,
            "version": m.target.version,
            "tiles_per_ipu": m.target.tiles_per_ipu,
        },
        "batch_size": m.batch_size,
        "device_iterations": m.device_iterations,
        "replication_factor": m.replication_factor,
        "anchors": [_anchor_to_dict(a) for a in m.anchors],
        "programs": [
            {"id": p.id, "name": p.name, "kind": p.kind.value, "payload": p.payload}
            for p in m.programs
        ],
        "program_flow": {
            "load": list(m.program_flow.load),
            "main": list(m.program_flow.main),
            "save": list(m.program_flow.save),
        },
        "output_to_variable": dict(m.output_to_variable),
        "custom_ops": [
            {
                "library": c.library,
                "op": c.op,
                "library_hash": c.library_hash,
                "is_hashable": c.is_hashable,
            }
            for c in m.custom_ops
        ],
        "options": dict(m.options),
        "package_hash": m.package_hash if include_hash else "",
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


class _Reader:
    """Typed access to a JSON document that reports the path of every defect."""

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, path: str, what: str) -> InvalidExecutableError:
        return InvalidExecutableError(f"{self.where}: metadata {path}: {what}")

    def get(self, obj: Any, key: str, path: str) -> Any:
        if not isinstance(obj, dict):
            raise self.fail(path, "expected an object")
        if key not in obj:
            raise self.fail(f"{path}.{key}", "missing")
        return obj[key]

    def int_(self, obj: Any, key: str, path: str, *, lo: int = 0, hi: int = 2**62) -> int:
        v = self.get(obj, key, path)
        if not isinstance(v, int) or isinstance(v, bool):
            raise self.fail(f"{path}.{key}", f"expected an integer, got {type(v).__name__}")
        if not lo <= v <= hi:
            raise self.fail(f"{path}.{key}", f"{v} is out of range [{lo}, {hi}]")
        return v

    def str_(self, obj: Any, key: str, path: str) -> str:
        v = self.get(obj, key, path)
        if not isinstance(v, str):
            raise self.fail(f"{path}.{key}", f"expected a string, got {type(v).__name__}")
        return v

    def bool_(self, obj: Any, key: str, path: str) -> bool:
        v = self.get(obj, key, path)
        if not isinstance(v, bool):
            raise self.fail(f"{path}.{key}", f"expected a boolean, got {type(v).__name__}")
        return v

    def list_(self, obj: Any, key: str, path: str) -> list[Any]:
        v = self.get(obj, key, path)
        if not isinstance(v, list):
            raise self.fail(f"{path}.{key}", f"expected a list, got {type(v).__name__}")
        return v

    def ints(self, obj: Any, key: str, path: str, *, lo: int = 0) -> tuple[int, ...]:
        items = self.list_(obj, key, path)
        out = []
        for i, v in enumerate(items):
            if not isinstance(v, int) or isinstance(v, bool) or v < lo or v > 2**62:
                raise self.fail(f"{path}.{key}[{i}]", f"expected an integer >= {lo}, got {v!r}")
            out.append(v)
        return tuple(out)

    def enum_(self, obj: Any, key: str, path: str, cls: Any) -> Any:
        v = self.str_(obj, key, path)
        try:
            return cls(v)
        except ValueError:
            allowed = ", ".join(e.value for e in cls)
            raise self.fail(f"{path}.{key}", f"{v!r} is not one of {allowed}") from None

    def str_map(self, obj: Any, key: str, path: str) -> dict[str, str]:
        v = self.get(obj, key, path)
        if not isinstance(v, dict) or not all(
            isinstance(k, str) and isinstance(x, str) for k, x in v.items()
        ):
            raise self.fail(f"{path}.{key}", "expected an object of strings")
        return dict(v)


def metadata_from_json(text: str, *, where: str) -> ExecutableMetadata:
    """Decode and type-check the metadata document.

    Raises:
        InvalidExecutableError: the text is not JSON or does not have the expected structure.
    """
    doc = parse_json_strict(text, where=where, what="metadata")
    r = _Reader(where)
    version = r.int_(doc, "format_version", "$")
    if version not in READABLE_FORMAT_VERSIONS:
        readable = ", ".join(str(v) for v in READABLE_FORMAT_VERSIONS)
        raise r.fail(
            "$.format_version", f"unsupported format version {version} (this reads {readable})"
        )
    t = r.get(doc, "target", "$")
    target = Target(
        device_kind=r.str_(t, "device_kind", "$.target"),
        num_devices=r.int_(t, "num_devices", "$.target", lo=1, hi=1024),
        version=r.int_(t, "version", "$.target", hi=1000),
        tiles_per_ipu=r.int_(t, "tiles_per_ipu", "$.target", hi=1 << 20),
    )
    anchors = []
    for i, a in enumerate(r.list_(doc, "anchors", "$")):
        p = f"$.anchors[{i}]"
        dtype_name = r.str_(a, "dtype", p)
        if dtype_name not in DTYPES:
            raise r.fail(f"{p}.dtype", f"unsupported dtype {dtype_name!r}")
        bd = r.get(a, "batch_dim", p)
        if bd is not None and (not isinstance(bd, int) or isinstance(bd, bool) or bd < 0):
            raise r.fail(f"{p}.batch_dim", f"expected null or an integer >= 0, got {bd!r}")
        names: tuple[str, ...] = ()
        if isinstance(a, dict) and "dim_names" in a:
            raw = r.list_(a, "dim_names", p)
            if not all(isinstance(x, str) and len(x) <= 256 for x in raw):
                raise r.fail(f"{p}.dim_names", "expected a list of names (strings)")
            names = tuple(raw)
        anchors.append(
            Anchor(
                name=r.str_(a, "name", p),
                handle=r.str_(a, "handle", p),
                tensor_info=TensorInfo(
                    r.ints(a, "shape", p, lo=-1 if version >= DYNAMIC_FORMAT_VERSION else 0),
                    DTYPES[dtype_name],
                ),
                type=r.enum_(a, "type", p, AnchorType),
                role=r.enum_(a, "role", p, AnchorRole),
                programs=r.ints(a, "programs", p),
                is_per_replica=r.bool_(a, "is_per_replica", p),
                has_data=r.bool_(a, "has_data", p),
                batch_dim=bd,
                dim_names=names,
            )
        )
    programs = []
    for i, pr in enumerate(r.list_(doc, "programs", "$")):
        p = f"$.programs[{i}]"
        payload = r.get(pr, "payload", p)
        if payload is not None and not isinstance(payload, str):
            raise r.fail(f"{p}.payload", "expected null or a tensor name")
        programs.append(
            Program(
                id=r.int_(pr, "id", p),
                name=r.str_(pr, "name", p),
                kind=r.enum_(pr, "kind", p, ProgramKind),
                payload=payload,
            )
        )
    f = r.get(doc, "program_flow", "$")
    flow = ProgramFlow(
        load=r.ints(f, "load", "$.program_flow"),
        main=r.ints(f, "main", "$.program_flow"),
        save=r.ints(f, "save", "$.program_flow"),
    )
    custom_ops = []
    for i, c in enumerate(r.list_(doc, "custom_ops", "$")):
        p = f"$.custom_ops[{i}]"
        custom_ops.append(
            CustomOpRef(
                library=r.str_(c, "library", p),
                op=r.str_(c, "op", p),
                library_hash=r.str_(c, "library_hash", p),
                is_hashable=r.bool_(c, "is_hashable", p),
            )
        )
    return ExecutableMetadata(
        model_name=r.str_(doc, "model_name", "$"),
        target=target,
        batch_size=r.int_(doc, "batch_size", "$", lo=1, hi=1 << 24),
        device_iterations=r.int_(doc, "device_iterations", "$", lo=1, hi=1 << 20),
        replication_factor=r.int_(doc, "replication_factor", "$", lo=1, hi=1024),
        anchors=tuple(anchors),
        programs=tuple(programs),
        program_flow=flow,
        output_to_variable=r.str_map(doc, "output_to_variable", "$"),
        custom_ops=tuple(custom_ops),
        options=r.str_map(doc, "options", "$"),
        format_version=version,
        package_hash=r.str_(doc, "package_hash", "$"),
    )

"""Consistency checks between an executable's metadata, its tensors and its program graphs.

Two passes, so a loader can verify the package hash in between: :func:`validate_structure` is
cheap (metadata against itself and against the tensor table) and :func:`validate_programs`
parses each main program's ONNX payload and checks it against the anchors. :func:`validate`
runs both. Every failure is an :class:`InvalidExecutableError` naming ``where`` and the defect.

Weights in a main program's payload, the one external data allowed: see :mod:`.external_data`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from model_runtime.errors import InvalidExecutableError
from model_runtime.executable.external_data import (
    WEIGHT_DATA_LOCATION,
    anchored_initializers,
    check_external_data,
    without_anchored,
)
from model_runtime.executable.model import (
    DEVICE_KINDS,
    DYNAMIC,
    DYNAMIC_FORMAT_VERSION,
    STRINGS_FORMAT_VERSION,
    Anchor,
    AnchorRole,
    AnchorType,
    ExecutableMetadata,
    ProgramKind,
    parse_batch_sizes,
)
from model_runtime.executable.strings import check_string_data, string_tensor_names

__all__ = [
    "MAX_ANCHOR_ELEMENTS",
    "MAX_ANCHOR_RANK",
    "WEIGHT_DATA_LOCATION",
    "anchored_initializers",
    "validate",
    "validate_programs",
    "validate_structure",
]

#: No anchor may describe more elements than this (2**34 fp32 = 64 GiB): absurd shapes are
#: rejected before anything is sized from them.
MAX_ANCHOR_ELEMENTS = 1 << 34
MAX_ANCHOR_RANK = 64

#: The anchor types each role may have. A weight is only ever uploaded; a variable is uploaded
#: by load and read back by save, so its direction is INPUT or UNKNOWN, never OUTPUT alone.
_ROLE_TYPES: dict[AnchorRole, tuple[AnchorType, ...]] = {
    AnchorRole.USER_INPUT: (AnchorType.INPUT,),
    AnchorRole.USER_OUTPUT: (AnchorType.OUTPUT,),
    AnchorRole.WEIGHT: (AnchorType.INPUT,),
    AnchorRole.VARIABLE: (AnchorType.INPUT, AnchorType.UNKNOWN),
}


def _failer(where: str) -> Any:
    def fail(what: str) -> InvalidExecutableError:
        return InvalidExecutableError(f"{where}: {what}")

    return fail


def _spec(a: Anchor) -> str:
    return f"{a.tensor_info.dtype.name}{list(a.tensor_info.shape)}"


def validate(
    metadata: ExecutableMetadata, tensors: Mapping[str, np.ndarray], *, where: str
) -> None:
    """Run :func:`validate_structure` then :func:`validate_programs`.

    Raises:
        InvalidExecutableError: naming ``where`` and the first defect found.
    """
    validate_structure(metadata, tensors, where=where)
    validate_programs(metadata, tensors, where=where)


def validate_structure(
    metadata: ExecutableMetadata, tensors: Mapping[str, np.ndarray], *, where: str
) -> None:
    """Check that ``metadata`` is self-consistent and agrees with ``tensors`` (no parsing).

    Raises:
        InvalidExecutableError: naming ``where`` and the first defect found.
    """
    fail = _failer(where)
    m = metadata
    if m.target.device_kind not in DEVICE_KINDS:
        raise fail(
            f"unknown target device kind {m.target.device_kind!r} "
            f"(known: {', '.join(DEVICE_KINDS)})"
        )
    if m.target.device_kind == "cpu" and m.target.version != 0:
        raise fail(f"target cpu has IPU version {m.target.version} (must be 0)")
    _check_programs_and_flow(m, tensors, fail)
    buckets = m.options.get("batch_sizes")
    if buckets is not None:
        if parse_batch_sizes(buckets, m.batch_size) is None:
            raise fail(
                f"option batch_sizes {buckets[:80]!r} is not increasing positive sizes ending "
                f"at the batch size {m.batch_size}"
            )
        if m.device_iterations != 1 or m.variables:
            raise fail("batch_sizes needs one device iteration and no variables")
    names: set[str] = set()
    for a in m.anchors:
        if not a.name:
            raise fail("an anchor has an empty name")
        if a.name in names:
            raise fail(f"duplicate anchor name {a.name!r}")
        names.add(a.name)
        _check_anchor(m, a, tensors, fail)
    payloads = {p.payload for p in m.programs if p.payload is not None}
    for a in m.anchors:
        if a.has_data and a.dtype.kind == "O":
            for t in string_tensor_names(a.name):
                if t in names or t in payloads:
                    raise fail(
                        f"anchor {a.name!r}: its string tensor {t!r} is also named by an "
                        "anchor or a program"
                    )
    targets: set[str] = set()
    for out, var in m.output_to_variable.items():
        if out not in names or var not in names:
            raise fail(f"output_to_variable maps {out!r} -> {var!r}: unknown anchor")
        o, v = m.anchor(out), m.anchor(var)
        if o.type is not AnchorType.OUTPUT:
            raise fail(f"output_to_variable maps {out!r}, which is not an OUTPUT anchor")
        if v.role is not AnchorRole.VARIABLE:
            raise fail(
                f"output_to_variable maps {out!r} -> {var!r}, which is a {v.role.value}, "
                "not a variable"
            )
        if o.tensor_info != v.tensor_info:
            raise fail(f"output_to_variable maps {out!r} {_spec(o)} -> {var!r} {_spec(v)}")
        if var in targets:
            raise fail(f"output_to_variable updates variable {var!r} twice")
        targets.add(var)


def _check_programs_and_flow(
    m: ExecutableMetadata, tensors: Mapping[str, np.ndarray], fail: Any
) -> None:
    ids = [p.id for p in m.programs]
    if len(set(ids)) != len(ids):
        raise fail("duplicate program ids")
    prog_names = [p.name for p in m.programs]
    if len(set(prog_names)) != len(prog_names):
        raise fail("duplicate program names")
    by_id = {p.id: p for p in m.programs}
    if not m.program_flow.main:
        raise fail("program flow main is empty (nothing to run)")
    for stage, kind, flow_ids in (
        ("load", ProgramKind.LOAD, m.program_flow.load),
        ("main", ProgramKind.MAIN, m.program_flow.main),
        ("save", ProgramKind.SAVE, m.program_flow.save),
    ):
        for pid in flow_ids:
            prog = by_id.get(pid)
            if prog is None:
                raise fail(f"program flow {stage} names unknown program {pid}")
            if prog.kind is not kind:
                raise fail(f"program flow {stage} names {prog.kind.value} program {prog.name!r}")
    anchor_names = {a.name for a in m.anchors}
    for p in m.programs:
        if p.kind is ProgramKind.MAIN and p.payload is None:
            raise fail(f"main program {p.name!r} has no payload")
        if p.kind is not ProgramKind.MAIN and p.payload is not None:
            raise fail(f"{p.kind.value} program {p.name!r} has a payload (only main programs do)")
        if p.payload is None:
            continue
        if p.payload in anchor_names:
            raise fail(f"program {p.name!r}: payload {p.payload!r} is also an anchor's name")
        payload = tensors.get(p.payload)
        if payload is None:
            raise fail(f"program {p.name!r}: payload tensor {p.payload!r} is missing")
        if payload.dtype != np.uint8 or payload.ndim != 1 or payload.size == 0:
            raise fail(f"program {p.name!r}: payload {p.payload!r} is not a non-empty 1-d uint8")


def _check_anchor(
    m: ExecutableMetadata, a: Anchor, tensors: Mapping[str, np.ndarray], fail: Any
) -> None:
    shape = a.tensor_info.shape
    if len(shape) > MAX_ANCHOR_RANK:
        raise fail(f"anchor {a.name!r}: rank {len(shape)} is absurd (max {MAX_ANCHOR_RANK})")
    n = 1
    for d in shape:
        n *= max(d, 1)
        if d < DYNAMIC or n > MAX_ANCHOR_ELEMENTS:
            raise fail(f"anchor {a.name!r}: absurd shape {list(shape)[:MAX_ANCHOR_RANK]}")
    if DYNAMIC in shape or a.dim_names:
        _check_dynamic(m, a, fail)
    known = {p.id for p in m.programs}
    for pid in a.programs:
        if pid not in known:
            raise fail(f"anchor {a.name!r} names unknown program {pid}")
    if a.type not in _ROLE_TYPES[a.role]:
        allowed = " or ".join(t.value for t in _ROLE_TYPES[a.role])
        raise fail(f"anchor {a.name!r}: a {a.role.value} must be {allowed}, not {a.type.value}")
    if a.batch_dim is not None:
        if a.role not in (AnchorRole.USER_INPUT, AnchorRole.USER_OUTPUT):
            raise fail(f"anchor {a.name!r}: a {a.role.value} has a batch_dim (only user anchors)")
        if a.batch_dim >= len(shape):
            raise fail(f"anchor {a.name!r}: batch_dim {a.batch_dim} beyond its rank {len(shape)}")
        if shape[a.batch_dim] != m.batch_size:
            raise fail(
                f"anchor {a.name!r}: dimension {a.batch_dim} (its batch_dim) is "
                f"{shape[a.batch_dim]} but the executable's batch_size is {m.batch_size}"
            )
    if a.dtype.kind == "O":
        # Strings are user data fed and returned per run, or string constants: weights whose
        # data is an offsets and a bytes tensor (never variables: state is numbers).
        if a.role is AnchorRole.WEIGHT and a.has_data:
            if m.format_version < STRINGS_FORMAT_VERSION:
                raise fail(
                    f"anchor {a.name!r}: a string constant needs format version "
                    f"{STRINGS_FORMAT_VERSION}, the executable says {m.format_version}"
                )
            check_string_data(a, tensors, fail)
            return
        if a.role not in (AnchorRole.USER_INPUT, AnchorRole.USER_OUTPUT) or a.has_data:
            raise fail(
                f"anchor {a.name!r}: a bytes anchor must be a user input or output without "
                "data, or a weight with data (a string constant)"
            )
    if a.has_data:
        if a.role is AnchorRole.USER_OUTPUT:
            raise fail(f"anchor {a.name!r}: a user_output cannot have stored data")
        t = tensors.get(a.name)
        if t is None:
            raise fail(f"anchor {a.name!r} has data but the tensor is missing")
        if tuple(t.shape) != shape or t.dtype != a.tensor_info.dtype:
            raise fail(
                f"anchor {a.name!r} is {_spec(a)} but its tensor is {t.dtype.name}{list(t.shape)}"
            )
    elif a.role in (AnchorRole.WEIGHT, AnchorRole.VARIABLE):
        raise fail(f"anchor {a.name!r} is a {a.role.value} without data")


def _check_dynamic(m: ExecutableMetadata, a: Anchor, fail: Any) -> None:
    """A dynamic dimension (``-1``) is for user data only, never its batch axis, and is named."""
    shape = a.tensor_info.shape
    if m.format_version < DYNAMIC_FORMAT_VERSION:
        raise fail(
            f"anchor {a.name!r}: a dynamic dimension needs format version "
            f"{DYNAMIC_FORMAT_VERSION}, the executable says {m.format_version}"
        )
    if a.role not in (AnchorRole.USER_INPUT, AnchorRole.USER_OUTPUT) or a.has_data:
        raise fail(f"anchor {a.name!r}: only user inputs and outputs may have dynamic dimensions")
    if a.batch_dim is not None and a.batch_dim < len(shape) and shape[a.batch_dim] == DYNAMIC:
        raise fail(f"anchor {a.name!r}: its batch dimension {a.batch_dim} cannot be dynamic")
    if len(a.dim_names) != len(shape):
        raise fail(
            f"anchor {a.name!r}: dim_names has {len(a.dim_names)} entries for rank {len(shape)}"
        )
    for i, (d, name) in enumerate(zip(shape, a.dim_names, strict=True)):
        if (d == DYNAMIC) != bool(name):
            raise fail(
                f"anchor {a.name!r}: dimension {i} is {d} but its dim_names entry is {name!r} "
                "(a name exactly where the dimension is dynamic)"
            )


def validate_programs(
    metadata: ExecutableMetadata, tensors: Mapping[str, np.ndarray], *, where: str
) -> None:
    """Parse each main program's ONNX payload and check it against the anchors it serves.

    An anchor that lists a main program must be a graph input (INPUT), a graph output (OUTPUT)
    or either (UNKNOWN) under its ``handle``, with the same element type and, where the graph
    fixes a dimension, the same size. The only external data allowed is a top-level
    initializer at :data:`WEIGHT_DATA_LOCATION` named by a weight anchor's handle, with that
    anchor's shape and dtype and no data of its own (see the module docstring). Call
    :func:`validate_structure` first.

    Raises:
        InvalidExecutableError: a payload is not a valid ONNX model, references external data
            other than its own weight anchors, or disagrees with an anchor.
    """
    import onnx

    fail = _failer(where)
    anchored_anywhere: set[str] = set()
    for p in metadata.programs:
        if p.kind is not ProgramKind.MAIN or p.payload is None:
            continue
        what = f"main program {p.name!r} (payload {p.payload!r})"
        model = onnx.ModelProto()
        try:
            model.ParseFromString(np.asarray(tensors[p.payload]).tobytes())
        except Exception as exc:  # protobuf's DecodeError; its module is untyped
            raise fail(f"{what} is not an ONNX model: {exc}") from None
        # Random bytes often parse as a protobuf with only unknown fields; the checker is what
        # tells an ONNX model from noise.
        if not model.HasField("graph") or model.ir_version <= 0:
            raise fail(f"{what} is not an ONNX model: no graph or IR version")
        # Before the checker: it would stat an external data file, onnxruntime would read it.
        anchored = check_external_data(metadata, model, what, fail)
        try:
            onnx.checker.check_model(without_anchored(model, anchored))
        except Exception as exc:  # ValidationError and friends from the C++ checker
            raise fail(f"{what} is not a valid ONNX model: {str(exc)[:300]}") from None
        anchored_anywhere |= anchored
        inputs = {v.name: v for v in model.graph.input}
        outputs = {v.name: v for v in model.graph.output}
        for a in metadata.anchors:
            if p.id not in a.programs:
                continue
            if a.type is AnchorType.INPUT:
                value, side = inputs.get(a.handle), "input"
            elif a.type is AnchorType.OUTPUT:
                value, side = outputs.get(a.handle), "output"
            else:
                value, side = inputs.get(a.handle) or outputs.get(a.handle), "input or output"
            if value is None:
                raise fail(f"anchor {a.name!r}: {what} has no graph {side} {a.handle!r}")
            _check_value(a, value, what, fail)
    # A device hands string constants to onnxruntime only as initializers (strings are never
    # weights fed as graph inputs), so each must be one.
    for a in metadata.weights:
        if a.has_data and a.dtype.kind == "O" and a.handle not in anchored_anywhere:
            raise fail(
                f"anchor {a.name!r}: no main program has string constant {a.handle!r} as an "
                f"initializer at {WEIGHT_DATA_LOCATION!r}"
            )


def _check_value(a: Anchor, value: Any, what: str, fail: Any) -> None:
    from onnx import helper

    tt = value.type.tensor_type
    if not value.type.HasField("tensor_type"):
        raise fail(f"anchor {a.name!r}: {what} graph value {a.handle!r} is not a tensor")
    if tt.elem_type:
        try:
            graph_dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type))
        except Exception:
            graph_dtype = None
        if graph_dtype != a.tensor_info.dtype:
            raise fail(
                f"anchor {a.name!r} is {_spec(a)} but {what} has {a.handle!r} as "
                f"{graph_dtype.name if graph_dtype is not None else f'elem_type {tt.elem_type}'}"
            )
    if tt.HasField("shape"):
        dims = tt.shape.dim
        shape = a.tensor_info.shape
        if len(dims) != len(shape):
            raise fail(
                f"anchor {a.name!r} is {_spec(a)} but {what} has {a.handle!r} with rank {len(dims)}"
            )
        for i, (d, s) in enumerate(zip(dims, shape, strict=True)):
            if d.HasField("dim_value") and d.dim_value != s:
                raise fail(
                    f"anchor {a.name!r} is {_spec(a)} but {what} has {a.handle!r} "
                    f"dimension {i} = {d.dim_value}"
                )

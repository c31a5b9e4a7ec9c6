"""Lowering the optimised graph into an executable: weights out, anchors and programs in.

The main program's graph takes user inputs and variables as graph inputs. Weights stay
initializers of the graph -- constants, so onnxruntime at load constant-folds them, prepacks
them for its kernels and applies the device's layout transformations, as it would on the source
model -- but their bytes leave the payload: each becomes a weight anchor whose data is an
executable tensor, and its initializer in the payload is only a stub marked as external data at
:data:`~model_runtime.executable.validate.WEIGHT_DATA_LOCATION` (never a file; a device supplies
the anchor's tensor when it creates its session). Variables stay graph inputs and outputs: they
change between runs and are uploaded, aliased and saved by the program flow.

Small integer constants (shapes, axes, indices, pads) and scalars stay inside the payload with
their data: they are structure, onnxruntime needs them constant to plan the graph, and they are
not worth an anchor.

String constants (top-level STRING initializers: class labels, vocabularies, the "yes" a graph
compares with) all leave the payload, whatever their size, scalars included: no ONNX op takes
structure (a shape, an axis) as a string, so none is needed to plan the graph, and one rule
keeps every string byte of the model in the executable's tensors, checked on load, rather than
some inside the payload. Each becomes a weight anchor of dtype ``bytes`` whose data is an
offsets and a bytes tensor (:mod:`model_runtime.executable.strings`), with the same stub in the
payload; a device puts the strings back into the graph when it creates its session. Strings in
node attributes (a LabelEncoder's keys, a classifier's ``classlabels_strings``) and subgraphs
are part of the program and stay in it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from model_runtime.compiler.buckets import make_batch_symbolic
from model_runtime.compiler.graph import anchor_dtype, graph_dims
from model_runtime.compiler.optimize import OptimizedModel
from model_runtime.compiler.options import CompileOptions
from model_runtime.compiler.rebatch import PreparedModel
from model_runtime.errors import CompileError
from model_runtime.executable.codec import DTYPES
from model_runtime.executable.container import Executable
from model_runtime.executable.model import (
    DYNAMIC,
    Anchor,
    AnchorRole,
    AnchorType,
    CustomOpRef,
    ExecutableMetadata,
    Program,
    ProgramFlow,
    ProgramKind,
    TensorInfo,
    required_format_version,
)
from model_runtime.executable.strings import (
    pack_strings,
    string_tensor_names,
    with_string_initializers,
)
from model_runtime.executable.validate import WEIGHT_DATA_LOCATION

__all__ = ["LAYOUT", "LOAD_ID", "MAIN_ID", "MAIN_PAYLOAD", "SAVE_ID", "lower", "weights_as_inputs"]

#: How main programs are laid out, part of the cache key: weights and string constants as
#: initializers whose data are anchors' tensors (before: string constants inside the payload;
#: before that, weights as graph inputs).
LAYOUT = "weights-and-strings-as-anchored-initializers"

LOAD_ID, MAIN_ID, SAVE_ID = 0, 1, 2
MAIN_PAYLOAD = "__program__/main"

#: Non-float initializers up to this size stay in the payload whatever consumes them.
STRUCTURAL_MAX_BYTES = 512

#: Inputs (by op and position) that hold shapes, axes, indices or sizes: non-float constants
#: fed there stay in the payload at any size.
_STRUCTURAL_INPUTS: dict[str, frozenset[int]] = {
    "Reshape": frozenset({1}),
    "Expand": frozenset({1}),
    "Tile": frozenset({1}),
    "Slice": frozenset({1, 2, 3, 4}),
    "ConstantOfShape": frozenset({0}),
    "Squeeze": frozenset({1}),
    "Unsqueeze": frozenset({1}),
    "Pad": frozenset({1, 3}),
    "Resize": frozenset({3}),
    "TopK": frozenset({1}),
    "Split": frozenset({1}),
    "OneHot": frozenset({1}),
    "Range": frozenset({0, 1, 2}),
    "Gather": frozenset({1}),
    "GatherElements": frozenset({1}),
    "ReduceSum": frozenset({1}),
    "ReduceMean": frozenset({1}),
    "ReduceMax": frozenset({1}),
    "ReduceMin": frozenset({1}),
    "ReduceProd": frozenset({1}),
    "CumSum": frozenset({1}),
}


def _structural(tensor: onnx.TensorProto, consumers: Mapping[str, list[tuple[str, int]]]) -> bool:
    dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
    if np.dtype(dtype).kind not in "iub":
        return False
    n = 1
    for d in tensor.dims:
        n *= d
    if n * np.dtype(dtype).itemsize <= STRUCTURAL_MAX_BYTES:
        return True
    uses = consumers.get(tensor.name, [])
    return bool(uses) and all(i in _STRUCTURAL_INPUTS.get(op, ()) for op, i in uses)


def _consumers(graph: onnx.GraphProto) -> dict[str, list[tuple[str, int]]]:
    uses: dict[str, list[tuple[str, int]]] = {}
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name:
                uses.setdefault(name, []).append((node.op_type, i))
    return uses


def lower(
    optimized: OptimizedModel,
    prepared: PreparedModel,
    rebatched: onnx.ModelProto,
    outputs: Mapping[str, TensorInfo],
    options: CompileOptions,
    model_name: str,
    extra_options: Mapping[str, str],
    where: str,
    custom_op_refs: tuple[CustomOpRef, ...] = (),
    *,
    symbolic_batch: bool = False,
) -> Executable:
    """Move the weights' bytes out of the optimised graph and seal the executable.

    Raises:
        CompileError: a tensor name clashes with the program payload, or an input the
            executable needs has a type it cannot carry.
        InvalidExecutableError: the result is inconsistent (a compiler bug).
    """
    model = optimized.proto
    graph = model.graph
    consumers = _consumers(graph)
    base_dir = str(optimized.base_dir)

    weights: dict[str, np.ndarray] = {}
    strings: dict[str, np.ndarray] = {}
    kept: list[onnx.TensorProto] = []
    for tensor in graph.initializer:
        if tensor.data_type == onnx.TensorProto.STRING:
            strings[tensor.name] = _string_value(tensor, where)
            kept.append(_weight_stub(tensor.name, tensor.data_type, strings[tensor.name].shape))
            continue
        value = numpy_helper.to_array(tensor, base_dir=base_dir)
        # A scalar stays in the payload: too small for an anchor, and a stored tensor is at
        # least 1-d (the stub's rank would differ from the graph's, and broadcasting with it).
        liftable = (
            value.ndim > 0
            and value.dtype.name in DTYPES
            and value.dtype == DTYPES[value.dtype.name]
        )
        if liftable and not _structural(tensor, consumers):
            weights[tensor.name] = np.ascontiguousarray(value)
            kept.append(_weight_stub(tensor.name, tensor.data_type, value.shape))
        elif onnx.external_data_helper.uses_external_data(tensor):
            kept.append(numpy_helper.from_array(value, tensor.name))
        else:
            kept.append(tensor)
    del graph.initializer[:]
    graph.initializer.extend(kept)

    # Inputs in a fixed order (user, variables); onnxruntime may have dropped unused ones,
    # which are put back so every anchor has its graph input.
    by_name = {vi.name: vi for vi in graph.input}
    user_inputs = [by_name.get(n) or _input_like(rebatched, n) for n in prepared.user_inputs]
    var_inputs = [by_name.get(n) or _input_like(rebatched, n) for n in prepared.variables]
    del graph.input[:]
    graph.input.extend([*user_inputs, *var_inputs])

    for out in graph.output:
        info = outputs[out.name]
        elem = helper.np_dtype_to_tensor_dtype(info.dtype)
        out.type.CopyFrom(helper.make_tensor_type_proto(elem, graph_dims(out.name, info.shape)))

    serialized = model
    if symbolic_batch:  # batch-size buckets: anchors keep the full batch, the payload any
        serialized = onnx.ModelProto()
        serialized.CopyFrom(model)
        make_batch_symbolic(
            serialized, prepared.user_inputs, prepared.user_outputs, options.batch_dim
        )
    payload = np.frombuffer(serialized.SerializeToString(), dtype=np.uint8).copy()
    tensors: dict[str, np.ndarray] = {MAIN_PAYLOAD: payload}
    anchors: list[Anchor] = []
    bd: int | None = options.batch_dim if options.batch_size else None  # 0: no batch axis
    by_input = {vi.name: vi for vi in rebatched.graph.input}
    for vi in user_inputs:
        # The shapes as re-batching left them: the optimiser may have dropped a symbol.
        source = by_input.get(vi.name, vi).type.tensor_type.shape.dim
        dims = tuple(d.dim_value if d.dim_value > 0 else DYNAMIC for d in source)
        names = tuple(d.dim_param if d.dim_value <= 0 else "" for d in source)
        dtype = anchor_dtype(vi.type.tensor_type.elem_type, f"{where}: input {vi.name!r}")
        anchors.append(
            Anchor(
                name=vi.name,
                handle=vi.name,
                tensor_info=TensorInfo(dims, dtype),
                type=AnchorType.INPUT,
                role=AnchorRole.USER_INPUT,
                programs=(MAIN_ID,),
                batch_dim=bd,
                dim_names=names if DYNAMIC in dims else (),
            )
        )
    for name in [*prepared.user_outputs, *prepared.update_outputs]:
        info = outputs[name]
        anchors.append(
            Anchor(
                name=name,
                handle=name,
                tensor_info=info,
                type=AnchorType.OUTPUT,
                role=AnchorRole.USER_OUTPUT,
                programs=(MAIN_ID,),
                # A variable's new value is state, not rows: it has no batch dim.
                batch_dim=None if name in options.variable_updates else bd,
                dim_names=(
                    tuple(d if isinstance(d, str) else "" for d in graph_dims(name, info.shape))
                    if info.is_dynamic
                    else ()
                ),
            )
        )
    for name, value in weights.items():
        anchors.append(_data_anchor(name, value, AnchorRole.WEIGHT, (LOAD_ID,)))
        tensors[name] = value
    for name, value in prepared.variables.items():
        anchors.append(_data_anchor(name, value, AnchorRole.VARIABLE, (LOAD_ID, MAIN_ID, SAVE_ID)))
        tensors[name] = np.ascontiguousarray(value)
    # Tensor names the executable derives (payload, string constants' data) may be no anchor's.
    derived = {MAIN_PAYLOAD}
    for name, value in strings.items():
        anchors.append(_data_anchor(name, value, AnchorRole.WEIGHT, (LOAD_ID,)))
        for t, data in zip(string_tensor_names(name), pack_strings(value), strict=True):
            derived.add(t)
            tensors[t] = data
    clash = sorted(derived & {a.name for a in anchors})
    if clash:
        raise CompileError(f"{where}: a tensor is named {clash[0]!r}, which is reserved")

    metadata = ExecutableMetadata(
        model_name=model_name,
        target=options.device_target,
        batch_size=options.batch_size or 1,  # no batch axis: one request per run
        anchors=tuple(anchors),
        programs=(
            Program(LOAD_ID, "load", ProgramKind.LOAD),
            Program(MAIN_ID, "main", ProgramKind.MAIN, payload=MAIN_PAYLOAD),
            Program(SAVE_ID, "save", ProgramKind.SAVE),
        ),
        program_flow=ProgramFlow(load=(LOAD_ID,), main=(MAIN_ID,), save=(SAVE_ID,)),
        device_iterations=options.device_iterations,
        replication_factor=options.replication_factor,
        output_to_variable=dict(options.variable_updates),
        custom_ops=custom_op_refs,
        options=dict(extra_options),
        format_version=required_format_version(tuple(anchors)),
    )
    return Executable.build(metadata, tensors)


def weights_as_inputs(executable: Executable) -> Executable:
    """``executable`` in the layout compilers wrote before weights stayed initializers: every
    main program takes its weights as graph inputs (fed at run time, so onnxruntime can neither
    fold nor prepack them) and keeps its string constants inside the payload (format version
    1: no string anchors). Devices still load that layout; this rebuilds it for compatibility
    tests and for the compiled-vs-source benchmark's "before" row.

    Raises:
        InvalidExecutableError: the result is inconsistent (a bug).
    """
    from dataclasses import replace

    from model_runtime.executable.validate import anchored_initializers

    m = executable.metadata
    string_anchors = [a for a in m.weights if a.has_data and a.dtype.kind == "O"]
    strings = {a.handle: executable.anchor_data(a.name) for a in string_anchors}
    dropped = {t for a in string_anchors for t in string_tensor_names(a.name)}
    tensors = {n: executable.tensor(n) for n in executable.tensor_names if n not in dropped}
    for program in m.programs:
        if program.payload is None:
            continue
        model = onnx.load_model_from_string(executable.program_payload(program))
        names = set(anchored_initializers(model)) - set(strings)
        graph = model.graph
        stubs = [t for t in graph.initializer if t.name in names]
        kept = [t for t in graph.initializer if t.name not in names]
        del graph.initializer[:]
        graph.initializer.extend(kept)
        graph.input.extend(
            helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in stubs
        )
        inline = {t.name: strings[t.name] for t in kept if t.name in strings}
        payload = with_string_initializers(model, inline)
        tensors[program.payload] = np.frombuffer(payload, np.uint8).copy()
    anchors = tuple(a for a in m.anchors if a not in string_anchors)
    return Executable.build(
        replace(
            m,
            anchors=anchors,
            format_version=required_format_version(anchors),
            package_hash="",
        ),
        tensors,
    )


def _weight_stub(name: str, data_type: int, shape: tuple[int, ...]) -> onnx.TensorProto:
    """An initializer without data whose bytes are the weight anchor ``name``'s tensor."""
    stub = onnx.TensorProto()
    stub.name = name
    stub.data_type = data_type
    stub.dims.extend(int(d) for d in shape)
    stub.data_location = onnx.TensorProto.EXTERNAL
    entry = stub.external_data.add()
    entry.key, entry.value = "location", WEIGHT_DATA_LOCATION
    return stub


def _string_value(tensor: onnx.TensorProto, where: str) -> np.ndarray:
    """A STRING initializer's elements as an object array of ``bytes`` (any bytes: numpy_helper
    would insist on UTF-8)."""
    if onnx.external_data_helper.uses_external_data(tensor):
        raise CompileError(f"{where}: string initializer {tensor.name!r} uses external data")
    shape = tuple(int(d) for d in tensor.dims)
    n = 1
    for d in shape:
        n *= d
    if len(tensor.string_data) != n:
        raise CompileError(
            f"{where}: string initializer {tensor.name!r} of shape {list(shape)} holds "
            f"{len(tensor.string_data)} strings"
        )
    value = np.empty(n, dtype=object)
    value[:] = list(tensor.string_data)
    return value.reshape(shape)


def _input_like(model: onnx.ModelProto, name: str) -> onnx.ValueInfoProto:
    for vi in model.graph.input:
        if vi.name == name:
            found: onnx.ValueInfoProto = vi
            return found
    raise CompileError(f"input {name!r} vanished from the graph")  # pragma: no cover


def _data_anchor(
    name: str, value: np.ndarray[Any, Any], role: AnchorRole, programs: tuple[int, ...]
) -> Anchor:
    return Anchor(
        name=name,
        handle=name,
        tensor_info=TensorInfo(tuple(int(d) for d in value.shape), value.dtype),
        type=AnchorType.INPUT,
        role=role,
        programs=programs,
        has_data=True,
    )

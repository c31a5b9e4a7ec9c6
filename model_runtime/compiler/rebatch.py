"""Graph preparation and re-batching: variables become inputs, the batch dim becomes fixed.

Two passes, in this order:

* :func:`prepare` splits the graph's inputs into user inputs, weights (initializers, kept as
  constants so the optimiser can fold them) and variables (initializers turned into graph inputs
  so nothing folds their initial value into the graph).
* :func:`rebatch` fixes the batch dimension of every user input to the executable's batch size.
  A graph exported with a fixed batch of 1 usually also holds that 1 in ``Reshape`` constants;
  those are rewritten where shape inference shows the reshaped tensor carries the batch.
  Whether the result still computes every row independently is checked afterwards by running it
  (:mod:`model_runtime.compiler.verify`), not assumed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from model_runtime.compiler.graph import (
    anchor_dtype,
    constant_values,
    initializer_names,
    tensor_shape,
)
from model_runtime.compiler.options import CompileOptions
from model_runtime.errors import CompileError

__all__ = [
    "BATCH_SYMBOL",
    "PreparedModel",
    "RebatchedModel",
    "name_dynamic_dims",
    "prepare",
    "rebatch",
]

#: Symbolic name the batch dim carries while shape inference traces where the batch flows.
BATCH_SYMBOL = "__model_runtime_batch__"

#: Initializers bigger than this are replaced by typed inputs in the copy given to shape
#: inference: it serialises the model, and weights only slow it down (or pass 2 GiB).
_SKELETON_BYTES = 4096

_MAX_REWRITE_ROUNDS = 64


@dataclass(frozen=True, slots=True)
class PreparedModel:
    """The model with variables as graph inputs; weights stay initializers (constants)."""

    proto: onnx.ModelProto
    user_inputs: tuple[str, ...]
    user_outputs: tuple[str, ...]
    update_outputs: tuple[str, ...]
    variables: dict[str, np.ndarray]


@dataclass(frozen=True, slots=True)
class RebatchedModel:
    """``proto`` with user inputs fixed at the batch size. ``mode`` says what it was before:
    ``none`` (already the batch size), ``dynamic`` (symbolic/unknown) or ``fixed-1``."""

    proto: onnx.ModelProto
    mode: str
    reshapes_rewritten: int


def _copy(proto: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    return out


def prepare(proto: onnx.ModelProto, options: CompileOptions, where: str) -> PreparedModel:
    """Copy ``proto`` and turn the variables named in ``options`` into graph inputs.

    Raises:
        CompileError: a variable is not an initializer, a variable update names no graph
            output, the graph has sparse initializers, or it has no user input.
    """
    model = _copy(proto)
    graph = model.graph
    if graph.sparse_initializer:
        raise CompileError(f"{where}: sparse initializers are not supported")
    inits = initializer_names(graph)
    outputs = [o.name for o in graph.output]
    for var in options.variables:
        if var not in inits:
            sample = ", ".join(sorted(inits)[:8]) or "none"
            raise CompileError(
                f"{where}: variable {var!r} is not an initializer of the model "
                f"(it has {len(inits)} initializers: {sample}{', ...' if len(inits) > 8 else ''})"
            )
    for out in options.variable_updates:
        if out not in outputs:
            raise CompileError(
                f"{where}: variable update names output {out!r}, which is not a graph output "
                f"(outputs: {', '.join(outputs)})"
            )

    variables: dict[str, np.ndarray] = {}
    var_inputs: list[onnx.ValueInfoProto] = []
    kept: list[onnx.TensorProto] = []
    for tensor in graph.initializer:
        if tensor.name in options.variables:
            value = numpy_helper.to_array(tensor)
            anchor_dtype(tensor.data_type, f"{where}: variable {tensor.name!r}")
            variables[tensor.name] = value
            var_inputs.append(
                helper.make_tensor_value_info(tensor.name, tensor.data_type, list(value.shape))
            )
        else:
            kept.append(tensor)
    del graph.initializer[:]
    graph.initializer.extend(kept)

    # IR < 4 lists initializers among the inputs (overridable, so never constant-folded):
    # drop them there so weights are constants; variables get an input of their exact shape.
    user = [vi for vi in graph.input if vi.name not in inits]
    del graph.input[:]
    graph.input.extend(user)
    graph.input.extend(var_inputs)
    model.ir_version = max(model.ir_version, 4)

    if not user:
        raise CompileError(f"{where}: the model has no inputs to feed (every input is constant)")
    for vi in user:
        if not vi.type.HasField("tensor_type"):
            raise CompileError(
                f"{where}: input {vi.name!r} is not a tensor (sequences, maps and optionals are "
                "not supported)"
            )
        anchor_dtype(vi.type.tensor_type.elem_type, f"{where}: input {vi.name!r}")
    return PreparedModel(
        proto=model,
        user_inputs=tuple(vi.name for vi in user),
        user_outputs=tuple(o for o in outputs if o not in options.variable_updates),
        update_outputs=tuple(o for o in outputs if o in options.variable_updates),
        variables=variables,
    )


def rebatch(prepared: PreparedModel, batch_size: int, batch_dim: int, where: str) -> RebatchedModel:
    """Fix the batch dim of every user input at ``batch_size`` (0: no batch axis); every other
    dynamic dimension stays symbolic (named, see :func:`name_dynamic_dims`).

    Raises:
        CompileError: an input has unknown rank, no batch dim, or a batch fixed at a size other
            than 1 or ``batch_size``.
    """
    model = _copy(prepared.proto)
    graph = model.graph
    if batch_size == 0:
        return _unbatched(model, prepared, where)
    modes: set[str] = set()
    symbolic: list[onnx.TensorShapeProto.Dimension] = []
    for vi in graph.input:
        if vi.name not in prepared.user_inputs:
            continue
        tensor_type = vi.type.tensor_type
        if not tensor_type.HasField("shape"):
            raise CompileError(f"{where}: input {vi.name!r} has unknown rank; give it a shape")
        dims = tensor_type.shape.dim
        if len(dims) <= batch_dim:
            raise CompileError(
                f"{where}: input {vi.name!r} has rank {len(dims)}, so it has no batch "
                f"dimension {batch_dim}"
            )
        name_dynamic_dims(vi, skip=batch_dim)
        d = dims[batch_dim]
        if d.HasField("dim_value") and d.dim_value > 0:
            if d.dim_value == batch_size:
                modes.add("none")
                continue
            if d.dim_value != 1:
                raise CompileError(
                    f"{where}: input {vi.name!r} has its batch dimension {batch_dim} fixed at "
                    f"{d.dim_value}; it cannot be compiled for batch size {batch_size} "
                    f"(use {d.dim_value}, or a model with a dynamic batch)"
                )
            modes.add("fixed-1")
        else:
            modes.add("dynamic")
        d.Clear()
        d.dim_param = BATCH_SYMBOL
        symbolic.append(d)

    if not symbolic:
        return RebatchedModel(proto=model, mode="none", reshapes_rewritten=0)
    if "none" in modes:
        fixed = [
            vi.name
            for vi in graph.input
            if vi.name in prepared.user_inputs
            and vi.type.tensor_type.shape.dim[batch_dim].dim_value == batch_size
        ]
        other = [vi.name for vi in graph.input if vi.name in prepared.user_inputs]
        other = [n for n in other if n not in fixed]
        raise CompileError(
            f"{where}: the inputs disagree on the batch: {fixed} have batch {batch_size} but "
            f"{other} do not; every input must carry the batch in dimension {batch_dim}"
        )

    # Inferred shapes of intermediates (and the outputs) carry the old batch: drop them.
    del graph.value_info[:]
    for out in graph.output:
        if out.type.HasField("tensor_type"):
            out.type.tensor_type.ClearField("shape")

    rewritten = _rewrite_reshapes(model, batch_size, batch_dim) if "fixed-1" in modes else 0
    for d in symbolic:
        d.Clear()
        d.dim_value = batch_size
    mode = "fixed-1" if "fixed-1" in modes else "dynamic"
    return RebatchedModel(proto=model, mode=mode, reshapes_rewritten=rewritten)


def _unbatched(model: onnx.ModelProto, prepared: PreparedModel, where: str) -> RebatchedModel:
    """A model without a batch axis (batch size 0) runs each request alone at its own shape;
    its dynamic dimensions stay symbolic."""
    for vi in model.graph.input:
        if vi.name not in prepared.user_inputs:
            continue
        tensor_type = vi.type.tensor_type
        if not tensor_type.HasField("shape"):
            raise CompileError(f"{where}: input {vi.name!r} has unknown rank; give it a shape")
        name_dynamic_dims(vi, skip=None)
    return RebatchedModel(proto=model, mode="none", reshapes_rewritten=0)


def name_dynamic_dims(vi: onnx.ValueInfoProto, skip: int | None) -> None:
    """In place: every dynamic dimension of ``vi`` but ``skip`` (the batch) gets a symbol; an
    unnamed one (no ``dim_param``, or a non-positive ``dim_value``) gets its own, so it stays
    dynamic through shape inference and is recorded as ``-1`` (DESIGN.md §4)."""
    for i, d in enumerate(vi.type.tensor_type.shape.dim):
        if i == skip or (d.HasField("dim_value") and d.dim_value > 0):
            continue
        if not (d.HasField("dim_param") and d.dim_param):
            d.Clear()
            d.dim_param = f"{vi.name}_dim{i}"


def _skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    skeleton = onnx.ModelProto()
    skeleton.CopyFrom(model)
    graph = skeleton.graph
    small: list[onnx.TensorProto] = []
    for tensor in graph.initializer:
        n = 1
        for dim in tensor.dims:
            n *= dim
        if n * 8 <= _SKELETON_BYTES:
            small.append(tensor)
        else:
            graph.input.append(
                helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims))
            )
    del graph.initializer[:]
    graph.initializer.extend(small)
    return skeleton


def _inferred_shapes(model: onnx.ModelProto) -> dict[str, list[int | str | None]]:
    try:
        inferred = onnx.shape_inference.infer_shapes(
            _skeleton(model), strict_mode=False, data_prop=True
        )
    except Exception:
        # Inference is a hint here; the verification run decides.
        return {}
    g = inferred.graph
    return {vi.name: tensor_shape(vi) for vi in (*g.input, *g.value_info, *g.output)}


def _rewrite_reshapes(model: onnx.ModelProto, batch_size: int, batch_dim: int) -> int:
    """Rewrite ``Reshape`` constants that pin the batch at 1 on a batch-carrying tensor.

    The batch entry becomes 0 ("copy this dim from the input"), which keeps the symbolic batch
    flowing through shape inference, so the next round finds reshapes further down.
    """
    graph = model.graph
    taken = {t.name for t in graph.initializer} | {o for n in graph.node for o in n.output}
    rewritten = 0
    for _ in range(_MAX_REWRITE_ROUNDS):
        reshapes = [
            n
            for n in graph.node
            if n.op_type == "Reshape" and n.domain in ("", "ai.onnx") and len(n.input) > 1
        ]
        if not reshapes:
            return rewritten
        shapes = _inferred_shapes(model)
        consts = constant_values(graph, {n.input[1] for n in reshapes})
        changed = False
        for node in reshapes:
            value = consts.get(node.input[1])
            if value is None or value.ndim != 1 or value.size <= batch_dim:
                continue
            if int(value[batch_dim]) != 1:
                continue
            data_shape = shapes.get(node.input[0])
            if not data_shape or len(data_shape) <= batch_dim:
                continue
            if data_shape[batch_dim] != BATCH_SYMBOL:
                continue
            allowzero = any(a.name == "allowzero" and a.i for a in node.attribute)
            new = value.astype(np.int64).copy()
            new[batch_dim] = batch_size if allowzero else 0
            name = f"{node.input[1]}__rebatched"
            i = 0
            while name in taken:
                i += 1
                name = f"{node.input[1]}__rebatched_{i}"
            taken.add(name)
            graph.initializer.append(numpy_helper.from_array(new, name))
            node.input[1] = name
            rewritten += 1
            changed = True
        if not changed:
            return rewritten
    return rewritten

"""The one external data an executable may hold: its weight anchors, as payload initializers.

A payload may keep a weight as an initializer (so onnxruntime constant-folds and prepacks it)
without holding its bytes: the initializer is marked as ONNX external data at the fixed location
:data:`WEIGHT_DATA_LOCATION`, and the bytes are the executable's own tensor of the weight anchor
whose handle is the initializer's name (a device supplies them when it creates its session, see
:func:`anchored_initializers`). A string constant (a ``bytes`` weight, see :mod:`.strings`) is
such an initializer too, of type STRING: its data is the anchor's offsets and bytes tensors,
which the device puts back into the graph. That is the only external data an executable may
hold: any other tensor anywhere in a payload (initializer, sparse initializer, node attribute,
subgraph, function) that references external data -- a file, a memory address, anything -- is
refused before onnxruntime or the ONNX checker sees it, because onnxruntime would otherwise open
that file relative to the working directory.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from model_runtime.executable.model import AnchorRole, ExecutableMetadata

__all__ = [
    "WEIGHT_DATA_LOCATION",
    "anchored_initializers",
    "check_external_data",
    "without_anchored",
]

#: The external-data location that marks a payload initializer as "the bytes are the weight
#: anchor's tensor" (never a path: no file by this name is ever opened).
WEIGHT_DATA_LOCATION = "*/_MODEL_RUNTIME_WEIGHT_ANCHOR_/*"


def anchored_initializers(model: Any) -> tuple[str, ...]:
    """Names of ``model``'s top-level initializers whose bytes are weight anchors' tensors.

    ``model`` is an ``onnx.ModelProto`` of a validated main program (see the module
    docstring); its device must supply exactly these initializers, from the weight anchors
    with these handles, when it creates its session.
    """
    return tuple(t.name for t in model.graph.initializer if _is_anchored(t))


def _is_anchored(tensor: Any) -> bool:
    entries = [(e.key, e.value) for e in tensor.external_data]
    return entries == [("location", WEIGHT_DATA_LOCATION)]


def _uses_external_data(tensor: Any) -> bool:
    from onnx import TensorProto

    return tensor.data_location == TensorProto.EXTERNAL or len(tensor.external_data) > 0


def _has_inline_data(tensor: Any) -> bool:
    return any(
        len(getattr(tensor, f)) > 0
        for f in (
            "raw_data",
            "float_data",
            "int32_data",
            "string_data",
            "int64_data",
            "double_data",
            "uint64_data",
        )
    )


def _nested_tensors(model: Any) -> Any:
    """Every ``TensorProto`` anywhere in ``model`` but its graph's own initializers: sparse
    initializers, node attributes, subgraphs, functions, training info, whatever field holds
    them."""
    from onnx import TensorProto

    def children(msg: Any, skip: str | None = None) -> list[Any]:
        found: list[Any] = []
        for fd, value in msg.ListFields():
            if fd.message_type is not None and fd.name != skip:
                # one message, or a repeated field of them
                found.extend((value,) if hasattr(value, "ListFields") else value)
        return found

    stack = children(model, skip="graph") + children(model.graph, skip="initializer")
    while stack:
        msg = stack.pop()
        if isinstance(msg, TensorProto):
            yield msg
        else:
            stack.extend(children(msg))


def check_external_data(
    metadata: ExecutableMetadata, model: Any, what: str, fail: Any
) -> frozenset[str]:
    """Refuse every external data reference but the payload's own weight anchors; return
    the names of those (top-level initializers)."""
    from onnx import TensorProto, helper

    data_only = "an executable is data only: it may not reference files or memory"

    def ref(tensor: Any) -> str:
        locations = [e.value for e in tensor.external_data if e.key == "location"]
        where = f"location {locations[0]!r}" if locations else "no location"
        return f"{what}: tensor {tensor.name!r} references external data ({where})"

    for tensor in _nested_tensors(model):
        if _uses_external_data(tensor):
            raise fail(f"{ref(tensor)}; {data_only}")
    weights = {a.handle: a for a in metadata.anchors if a.role is AnchorRole.WEIGHT}
    graph_inputs = {v.name for v in model.graph.input}
    anchored: set[str] = set()
    for tensor in model.graph.initializer:
        if not _uses_external_data(tensor):
            continue
        if not _is_anchored(tensor):
            raise fail(f"{ref(tensor)}; {data_only}")
        if tensor.data_location != TensorProto.EXTERNAL or _has_inline_data(tensor):
            raise fail(f"{ref(tensor)} but also holds data of its own or is not marked external")
        anchor = weights.get(tensor.name)
        if anchor is None or not anchor.has_data:
            raise fail(f"{ref(tensor)}, but no weight anchor with data has handle {tensor.name!r}")
        if tensor.name in graph_inputs:
            raise fail(f"{ref(tensor)} and is also a graph input")
        if tensor.name in anchored:
            raise fail(f"{what}: initializer {tensor.name!r} is listed twice")
        try:
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type))
        except Exception:
            dtype = None
        info = anchor.tensor_info
        if dtype != anchor.dtype or tuple(tensor.dims) != anchor.shape:
            raise fail(
                f"anchor {anchor.name!r} is {info.dtype.name}{list(info.shape)} but {what} has "
                f"initializer "
                f"{tensor.name!r} as {dtype.name if dtype is not None else tensor.data_type}"
                f"{list(tensor.dims)}"
            )
        anchored.add(tensor.name)
    return frozenset(anchored)


def without_anchored(model: Any, anchored: frozenset[str]) -> Any:
    """``model`` with its anchored initializers as typed graph inputs (for the checker, which
    would otherwise look for a file at their location)."""
    if not anchored:
        return model
    import onnx
    from onnx import helper

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    kept = [t for t in graph.initializer if t.name not in anchored]
    lifted = [t for t in graph.initializer if t.name in anchored]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    graph.input.extend(
        helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in lifted
    )
    return copy

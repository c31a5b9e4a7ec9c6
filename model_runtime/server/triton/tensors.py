"""A Triton config's ``input`` / ``output`` against the model's tensors, as Triton's
onnxruntime backend reads them.

- ``dims``: past the batch axis when ``max_batch_size`` > 0, else the whole shape; ``-1`` is a
  variable dimension. An input's ``-1`` must meet a variable dimension of the model (the
  executable's ``-1``); a fixed config dimension where the model's is variable narrows what
  requests may send (checked at the server boundary). Outputs match exactly, as Triton
  compares them (``compare_exact``).
- ``reshape``: the client sends (or gets) ``dims``, the model takes (or gives)
  ``reshape.shape``; the two hold the same elements (Triton's rule: equal counts, or, with
  variable dimensions, equal products between them); the model is compared with
  ``reshape.shape``.
- ``optional``: a request may leave the input out; Triton's onnxruntime backend refuses it in
  a model with a batch axis, and so do we. Every input an executable has is one its program
  needs (an ONNX input with a default value is compiled as a constant), so a request that
  leaves one out is refused naming it.
- ``label_filename``: a file in the model's directory, one class label per line, read once at
  load (see :mod:`.layout`), for the classification extension.
- A config that lists no inputs (or no outputs) gets the model's (Triton's auto-complete); one
  that lists inputs lists every input the model has. A tensor of a batched model that is only
  its batch axis is completed, in a Triton layout, as Triton does: ``dims: [1]`` with an empty
  reshape.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from model_runtime.errors import ConfigurationError
from model_runtime.server.tensors.request import TensorSpec
from model_runtime.server.triton import model_config_pb2 as pb
from model_runtime.server.triton.boundary import Boundary, Reshape

__all__ = ["DATATYPES", "Completed", "check_declared", "complete", "match", "reshape_fits"]

# Our protocol datatypes (model_runtime.server.tensors.datatypes) -> Triton's config enum.
DATATYPES = {
    "BOOL": pb.TYPE_BOOL,
    "UINT8": pb.TYPE_UINT8,
    "UINT16": pb.TYPE_UINT16,
    "UINT32": pb.TYPE_UINT32,
    "UINT64": pb.TYPE_UINT64,
    "INT8": pb.TYPE_INT8,
    "INT16": pb.TYPE_INT16,
    "INT32": pb.TYPE_INT32,
    "INT64": pb.TYPE_INT64,
    "FP16": pb.TYPE_FP16,
    "FP32": pb.TYPE_FP32,
    "FP64": pb.TYPE_FP64,
    "BYTES": pb.TYPE_STRING,
    "BF16": pb.TYPE_BF16,
}


def _fail(where: object, field: str, why: str) -> ConfigurationError:
    return ConfigurationError(f"{where}: {field}: {why}")


def _trunks(shape: Sequence[int]) -> list[int]:
    """The element counts between the variable dimensions of ``shape``."""
    out, n = [], 1
    for d in shape:
        if d == -1:
            out.append(n)
            n = 1
        else:
            n *= d
    return [*out, n]


def reshape_fits(dims: Sequence[int], shape: Sequence[int]) -> bool:
    """True when ``dims`` and ``shape`` hold the same elements (Triton's rule: an empty
    ``shape``, a scalar, takes ``dims`` of one element)."""
    if not shape:
        return -1 not in dims and _trunks(dims) == [1]
    return _trunks(dims) == _trunks(shape)


def _check_shape(where: object, at: str, shape: Sequence[int]) -> None:
    bad = [d for d in shape if d != -1 and d < 1]
    if bad:
        raise _fail(where, at, f"{list(shape)}: each dimension is >= 1, or -1 (variable)")


def check_declared(config: pb.ModelConfig, where: object) -> None:
    """Check the config's ``input`` / ``output`` on their own (before any model is read).

    Raises:
        ConfigurationError: a missing name or datatype, a name listed twice, a dimension
            that is neither >= 1 nor -1, a reshape that holds other elements than its
            ``dims``, an optional input of a model with a batch axis, or a
            ``label_filename`` that leaves the model's directory; naming the field.
    """
    for kind, tensors in (("input", config.input), ("output", config.output)):
        seen: set[str] = set()
        for i, t in enumerate(tensors):
            at = f"{kind}[{i}]"
            if not t.name:
                raise _fail(where, f"{at}.name", "missing")
            if t.name in seen:
                raise _fail(where, f"{at}.name", f"{kind} {t.name!r} is listed twice")
            seen.add(t.name)
            if t.data_type == pb.TYPE_INVALID:
                raise _fail(where, f"{at}.data_type", "missing")
            _check_shape(where, f"{at}.dims", t.dims)
            if t.HasField("reshape"):
                shape = list(t.reshape.shape)
                _check_shape(where, f"{at}.reshape.shape", shape)
                if not reshape_fits(t.dims, shape):
                    raise _fail(
                        where,
                        f"{at}.reshape",
                        f"dims {list(t.dims)} and reshape.shape {shape} hold different "
                        "numbers of elements",
                    )
            # a model.py handles a missing input; an ensemble skips what needs it alone
            own = config.backend == "python" or config.platform == "ensemble"
            if kind == "input" and t.optional and config.max_batch_size > 0 and not own:
                raise _optional_batched(where, at, t.name)
            if kind == "output" and t.label_filename:
                path = PurePosixPath(t.label_filename)
                if path.is_absolute() or ".." in path.parts or "\\" in t.label_filename:
                    raise _fail(
                        where,
                        f"{at}.label_filename",
                        f"{t.label_filename!r} must name a file inside the model's directory",
                    )


def _optional_batched(where: object, at: str, name: str) -> ConfigurationError:
    return _fail(
        where,
        f"{at}.optional",
        f"optional input {name!r} is not supported for a model with a batch axis "
        "(max_batch_size > 0), as in Triton's onnxruntime backend",
    )


def _model_dims(spec: TensorSpec, batched: bool) -> list[int]:
    return list(spec.shape[1:] if batched else spec.shape)


def match(
    config: pb.ModelConfig,
    where: object,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    batched: bool,
) -> None:
    """Check the config's ``input`` / ``output`` against the model's (``batched``: it has a
    batch axis, left out of ``dims``).

    Raises:
        ConfigurationError: a tensor the model lacks, another datatype or shape (a ``-1``
            fits any size), a model input the config leaves out, or an optional input of a
            model with a batch axis; naming the field and the tensor.
    """
    for kind, declared, actual, exact in (
        ("input", config.input, inputs, False),
        ("output", config.output, outputs, True),
    ):
        by_name = {s.name: s for s in actual}
        for i, t in enumerate(declared):
            spec = by_name.get(t.name)
            at = f"{kind}[{i}]"
            if spec is None:
                raise _fail(where, f"{at}.name", f"the model has no {kind} {t.name!r}")
            if DATATYPES.get(spec.datatype) != t.data_type:
                want = pb.DataType.Name(t.data_type)
                raise _fail(where, f"{at}.data_type", f"{want}, but the model has {spec.datatype}")
            if kind == "input" and t.optional and batched:
                raise _optional_batched(where, at, t.name)
            model = _model_dims(spec, batched)
            field, dims = f"{at}.dims", list(t.dims)
            if t.HasField("reshape"):
                field, dims = f"{at}.reshape.shape", list(t.reshape.shape)
            # -1 in the config takes any of the model's sizes (Triton serves it; a request of
            # another size than the model's fixed one is the model's to refuse)
            fits = len(dims) == len(model) and all(
                d in (m, -1) or (not exact and m == -1) for d, m in zip(dims, model, strict=True)
            )
            if not fits:
                raise _fail(where, field, f"{dims}, but the model's {kind} {t.name!r} has {model}")
        if kind == "input" and declared:
            listed = {t.name for t in declared}
            left = [s.name for s in actual if s.name not in listed]
            if left:
                raise _fail(
                    where,
                    "input",
                    f"the model's input(s) {left} are not listed (a config that lists "
                    "inputs lists every input of the model)",
                )


@dataclass(frozen=True, slots=True)
class Completed:
    """The tensors as served: what clients see (``inputs`` / ``outputs``), the config's
    tensors (declared, or completed from the model) and the boundary between the client's
    shapes and the model's (None when they are the same)."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    config_inputs: tuple[pb.ModelInput, ...]
    config_outputs: tuple[pb.ModelOutput, ...]
    boundary: Boundary | None


def _client(
    spec: TensorSpec, dims: Sequence[int], batched: bool, labels: Any, optional: bool = False
) -> TensorSpec:
    shape = (-1, *dims) if batched else tuple(dims)
    return TensorSpec(
        spec.name, spec.datatype, tuple(shape), labels=labels, batched=batched, optional=optional
    )


def complete(
    config: pb.ModelConfig,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    batched: bool,
    *,
    scalars: bool = False,
    labels: Mapping[str, tuple[str, ...]] | None = None,
) -> Completed:
    """The served tensors of a model whose tensors passed :func:`match`: the config's, in
    its order, else the model's; ``scalars``: complete a batched model's ``[batch]`` tensor as
    Triton does (``dims: [1]``, empty reshape); ``labels``: each output's class labels.

    Raises:
        nothing: the checks are :func:`check_declared` and :func:`match`.
    """
    labels = labels or {}
    cls_of = {"input": pb.ModelInput, "output": pb.ModelOutput}
    served: dict[str, tuple[list[TensorSpec], list[Any], list[Reshape]]] = {}
    for kind, declared, actual in (
        ("input", config.input, inputs),
        ("output", config.output, outputs),
    ):
        specs: list[TensorSpec] = []
        tensors: list[Any] = []
        reshapes: list[Reshape] = []
        by_name = {s.name: s for s in actual}
        if declared:
            for t in declared:
                spec = by_name[t.name]
                model = _model_dims(spec, batched)
                dims = list(t.dims)
                shape = list(t.reshape.shape) if t.HasField("reshape") else None
                narrows = kind == "input" and shape is None and dims != model
                if shape is not None or narrows:
                    reshapes.append(Reshape(t.name, tuple(dims), _tuple(shape)))
                optional = kind == "input" and bool(t.optional)
                specs.append(_client(spec, dims, batched, labels.get(t.name), optional))
                copy = cls_of[kind]()
                copy.CopyFrom(t)
                tensors.append(copy)
        else:
            for spec in actual:
                dims = _model_dims(spec, batched)
                t = cls_of[kind](name=spec.name, data_type=DATATYPES.get(spec.datatype, 0))
                if scalars and batched and not dims:
                    # Triton's auto-complete: the client sends [batch, 1], the model takes
                    # [batch]; an empty reshape is the model's side.
                    t.reshape.SetInParent()
                    reshapes.append(Reshape(spec.name, (1,), ()))
                    dims = [1]
                t.dims.extend(dims)
                specs.append(_client(spec, dims, batched, labels.get(spec.name)))
                tensors.append(t)
        served[kind] = (specs, tensors, reshapes)
    in_specs, in_tensors, in_reshapes = served["input"]
    out_specs, out_tensors, out_reshapes = served["output"]
    boundary = None
    if in_reshapes or out_reshapes:
        boundary = Boundary(in_reshapes, out_reshapes, batched=batched)
    return Completed(
        tuple(in_specs), tuple(out_specs), tuple(in_tensors), tuple(out_tensors), boundary
    )


def _tuple(shape: Sequence[int] | None) -> tuple[int, ...] | None:
    return None if shape is None else tuple(shape)

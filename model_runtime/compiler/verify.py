"""Running the graph before it is optimised: output shapes, and that re-batching kept it right.

A re-batched graph is trusted only after it has been run: each row of its output on a random
batch must equal what the original graph computes on that row alone. A graph that mixes samples
across the batch (batch statistics, reshapes that fold the batch into other dims, hard-coded
batch-1 states) fails here with a message that says so, instead of serving wrong answers.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from model_runtime.compiler.graph import anchor_dtype, tensor_shape
from model_runtime.compiler.ort import first_line, make_session, random_array, run
from model_runtime.compiler.rebatch import PreparedModel, RebatchedModel
from model_runtime.errors import CompileError
from model_runtime.executable.model import DYNAMIC, DYNAMIC_CHECK_SIZES, TensorInfo

__all__ = ["check_outputs", "check_updates", "is_dynamic", "rows_equal"]

_RTOL = 1e-3
_ATOL = 1e-4


def _input_infos(
    model: onnx.ModelProto, names: tuple[str, ...], size: int = DYNAMIC_CHECK_SIZES[0]
) -> dict[str, TensorInfo]:
    """The user inputs' shapes and dtypes, with every dynamic dimension at ``size``."""
    infos: dict[str, TensorInfo] = {}
    for vi in model.graph.input:
        if vi.name in names:
            shape = tuple(d if isinstance(d, int) and d > 0 else size for d in tensor_shape(vi))
            dtype = anchor_dtype(vi.type.tensor_type.elem_type, f"input {vi.name!r}")
            infos[vi.name] = TensorInfo(shape, dtype)
    return infos


def is_dynamic(model: onnx.ModelProto, names: tuple[str, ...], batch_dim: int | None) -> bool:
    """Some named input has a dynamic dimension other than ``batch_dim``."""
    for vi in model.graph.input:
        if vi.name in names:
            for i, d in enumerate(tensor_shape(vi)):
                if i != batch_dim and not (isinstance(d, int) and d > 0):
                    return True
    return False


def rows_equal(expected: np.ndarray, actual: np.ndarray) -> tuple[bool, float]:
    if expected.shape != actual.shape:
        return False, float("inf")
    if expected.dtype.kind != "f":
        return bool(np.array_equal(expected, actual)), 0.0
    e = expected.astype(np.float64)
    a = actual.astype(np.float64)
    finite = np.isfinite(e)
    scale = float(np.max(np.abs(e[finite]))) if finite.any() else 0.0
    ok = np.allclose(a, e, rtol=_RTOL, atol=_ATOL * max(scale, 1e-2), equal_nan=True)
    diff = float(np.max(np.abs(a - e), initial=0.0, where=finite & np.isfinite(a)))
    return bool(ok), diff


def check_outputs(
    prepared: PreparedModel,
    rebatched: RebatchedModel,
    batch_size: int,
    batch_dim: int,
    where: str,
    seed: int = 0,
) -> dict[str, TensorInfo]:
    """Run the re-batched graph on random data; return every output's shape and dtype.

    When the batch was changed, also run the original graph row by row and compare.

    Raises:
        CompileError: onnxruntime cannot run the graph; a user output does not carry the batch;
            a variable update does not match its variable; or a re-batched row differs from the
            original graph's result for that row (the graph cannot be re-batched).
    """
    rng = np.random.default_rng(seed)
    inputs = _input_infos(rebatched.proto, prepared.user_inputs)
    feeds: dict[str, Any] = {
        n: random_array(rng, info.shape, info.dtype) for n, info in inputs.items()
    }
    feeds.update(prepared.variables)
    changed = rebatched.mode != "none"
    try:
        session = make_session(rebatched.proto)
        outputs = run(session, feeds)
    except Exception as exc:
        if changed:
            raise CompileError(
                f"{where}: the graph cannot be re-batched to {batch_size}: onnxruntime fails on "
                f"the re-batched graph: {first_line(exc)}"
            ) from exc
        raise CompileError(f"{where}: onnxruntime cannot run the model: {first_line(exc)}") from exc

    infos: dict[str, TensorInfo] = {}
    for name, value in outputs.items():
        dtype = anchor_dtype(
            onnx.helper.np_dtype_to_tensor_dtype(value.dtype), f"{where}: output {name!r}"
        )
        infos[name] = TensorInfo(tuple(int(d) for d in value.shape), dtype)
    bd = batch_dim if batch_size else None
    if is_dynamic(rebatched.proto, prepared.user_inputs, bd):
        infos = _dynamic_outputs(session, prepared, rebatched, infos, feeds, rng, bd, where)
    for name in prepared.user_outputs if batch_size else ():  # 0: no batch axis
        shape = infos[name].shape
        if len(shape) <= batch_dim or shape[batch_dim] != batch_size:
            hint = (
                f" after re-batching from a {rebatched.mode} batch; the graph cannot be re-batched"
                if changed
                else ""
            )
            raise CompileError(
                f"{where}: output {name!r} has shape {list(shape)} at batch size {batch_size}: "
                f"its dimension {batch_dim} is not the batch{hint}"
            )
    if changed:
        _compare_rows(prepared, feeds, outputs, batch_size, batch_dim, where)
    return infos


def _dynamic_outputs(
    session: Any,
    prepared: PreparedModel,
    rebatched: RebatchedModel,
    infos: dict[str, TensorInfo],
    feeds: dict[str, Any],
    rng: np.random.Generator,
    batch_dim: int | None,
    where: str,
) -> dict[str, TensorInfo]:
    """Run the graph again with every dynamic input dimension at the second size: an output
    dimension that changed is dynamic (``-1``), one that did not is fixed.

    Raises:
        CompileError: onnxruntime fails at the second size, or an output's rank changed.
    """
    size = DYNAMIC_CHECK_SIZES[1]
    second = _input_infos(rebatched.proto, prepared.user_inputs, size)
    feeds2 = dict(feeds)
    feeds2.update({n: random_array(rng, info.shape, info.dtype) for n, info in second.items()})
    try:
        outputs2 = run(session, feeds2)
    except Exception as exc:
        raise CompileError(
            f"{where}: the model's dynamic dimensions were checked at two sizes "
            f"({DYNAMIC_CHECK_SIZES[0]} and {size}); onnxruntime fails at {size}: {first_line(exc)}"
        ) from exc
    out: dict[str, TensorInfo] = {}
    for name, info in infos.items():
        shape2 = tuple(int(d) for d in outputs2[name].shape)
        if len(shape2) != len(info.shape):
            raise CompileError(
                f"{where}: output {name!r} has rank {len(info.shape)} with dynamic dimensions "
                f"at {DYNAMIC_CHECK_SIZES[0]} and rank {len(shape2)} at {size}: its rank must "
                "not vary"
            )
        shape = tuple(
            a if a == b or i == batch_dim else DYNAMIC
            for i, (a, b) in enumerate(zip(info.shape, shape2, strict=True))
        )
        if name in prepared.update_outputs and DYNAMIC in shape:
            raise CompileError(
                f"{where}: variable update {name!r} has shape {list(shape)}: a variable's "
                "shape cannot depend on a request's dynamic dimensions"
            )
        out[name] = TensorInfo(shape, info.dtype)
    return out


def check_updates(
    update_map: dict[str, str],
    variables: dict[str, np.ndarray],
    infos: dict[str, TensorInfo],
    where: str,
) -> None:
    """Each variable update output has exactly its variable's shape and dtype.

    Raises:
        CompileError: naming the output, the variable and both shapes.
    """
    for out, var in update_map.items():
        info = infos[out]
        value = variables[var]
        if info.shape != tuple(value.shape) or info.dtype != value.dtype:
            raise CompileError(
                f"{where}: output {out!r} ({info.dtype.name}{list(info.shape)}) cannot update "
                f"variable {var!r} ({value.dtype.name}{list(value.shape)}): they must match"
            )


def _compare_rows(
    prepared: PreparedModel,
    feeds: dict[str, Any],
    outputs: dict[str, np.ndarray],
    batch_size: int,
    batch_dim: int,
    where: str,
) -> None:
    try:
        original = make_session(prepared.proto)
    except Exception as exc:
        raise CompileError(
            f"{where}: onnxruntime cannot load the model: {first_line(exc)}"
        ) from exc
    for row in range(batch_size):
        row_feeds = {
            n: (np.take(v, [row], axis=batch_dim) if n in prepared.user_inputs else v)
            for n, v in feeds.items()
        }
        try:
            expected = run(original, row_feeds)
        except Exception as exc:
            raise CompileError(
                f"{where}: onnxruntime cannot run the original model on one row: {first_line(exc)}"
            ) from exc
        for name in prepared.user_outputs:
            want = expected[name]
            got = np.take(outputs[name], [row], axis=batch_dim)
            ok, diff = rows_equal(want, got)
            if not ok:
                raise CompileError(
                    f"{where}: the graph cannot be re-batched to {batch_size}: row {row} of "
                    f"output {name!r} differs from the original model run on that row alone "
                    f"(shape {list(got.shape)} vs {list(want.shape)}, max abs diff {diff:.3g}). "
                    "The graph mixes samples across the batch or hard-codes its batch size "
                    "(e.g. in a Reshape, Slice or ConstantOfShape); export it with a dynamic "
                    f"batch, or compile it with batch size {_original_batch(prepared, batch_dim)}"
                )


def _original_batch(prepared: PreparedModel, batch_dim: int) -> str:
    for vi in prepared.proto.graph.input:
        if vi.name in prepared.user_inputs:
            dims = tensor_shape(vi)
            if len(dims) > batch_dim and isinstance(dims[batch_dim], int):
                return str(dims[batch_dim])
    return "1"

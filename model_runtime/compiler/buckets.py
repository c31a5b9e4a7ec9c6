"""Batch-size buckets: whether the compiled main program also runs smaller batches.

A model whose batch was dynamic (or fixed at 1 and re-batched) usually computes every row the
same way whatever the batch. Then one program serves every batch size up to the executable's:
the payload's batch dimension is left symbolic and the executable lists its buckets (option
``batch_sizes``: 1, 2, 4, ... and the batch size), so the queue runs a lone request at batch 1
instead of padding it to the full batch (DESIGN.md §6). As with re-batching, this is trusted
only after it has been run: the optimised program runs a full random batch and then its first
rows alone, and they must agree; otherwise the executable keeps its one batch size.

Buckets need one device iteration, no variables (their updates are whole-batch state) and no
custom ops (their kernels are registered per process, not here).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Mapping

import numpy as np
import onnx
import onnxruntime as ort

from model_runtime.compiler.optimize import OptimizedModel
from model_runtime.compiler.options import CompileOptions
from model_runtime.compiler.ort import random_array, run, session_options
from model_runtime.compiler.rebatch import PreparedModel, RebatchedModel
from model_runtime.compiler.verify import rows_equal
from model_runtime.executable.model import DYNAMIC_CHECK_SIZES, TensorInfo

__all__ = ["BUCKET_SYMBOL", "bucket_sizes", "find_buckets", "make_batch_symbolic"]

#: The name of the symbolic batch dimension in a bucketed payload.
BUCKET_SYMBOL = "batch"


def bucket_sizes(batch_size: int) -> tuple[int, ...]:
    """1, 2, 4, ... below ``batch_size``, then ``batch_size``: at most 2x padding."""
    sizes: list[int] = []
    n = 1
    while n < batch_size:
        sizes.append(n)
        n *= 2
    sizes.append(batch_size)
    return tuple(sizes)


def make_batch_symbolic(
    model: onnx.ModelProto, inputs: Iterable[str], outputs: Iterable[str], batch_dim: int
) -> None:
    """In place: dimension ``batch_dim`` of the named graph inputs and outputs becomes
    :data:`BUCKET_SYMBOL`; inferred shapes of intermediates (which carry the batch) go."""
    graph = model.graph
    names = set(inputs) | set(outputs)
    for vi in (*graph.input, *graph.output):
        if vi.name in names and vi.type.tensor_type.HasField("shape"):
            dims = vi.type.tensor_type.shape.dim
            if len(dims) > batch_dim:
                dims[batch_dim].Clear()
                dims[batch_dim].dim_param = BUCKET_SYMBOL
    del graph.value_info[:]


def find_buckets(
    optimized: OptimizedModel,
    prepared: PreparedModel,
    rebatched: RebatchedModel,
    outputs: Mapping[str, TensorInfo],
    options: CompileOptions,
    custom_ops: bool,
) -> tuple[int, ...] | None:
    """The executable's batch sizes when its optimised program runs smaller batches to the
    same rows, else None (see the module docstring). Never raises: a program that fails the
    check simply keeps one batch size."""
    b = options.batch_size
    if (
        not options.batch_buckets
        or b < 2
        or options.device_iterations != 1
        or prepared.variables
        or custom_ops
        or options.batch_dim != 0
        or rebatched.mode == "none"  # the source fixed the batch itself: keep it
        or any(info.dtype.kind == "O" for info in outputs.values())  # strings: one size
    ):
        return None
    bd = options.batch_dim
    model = onnx.ModelProto()
    model.CopyFrom(optimized.proto)
    make_batch_symbolic(model, prepared.user_inputs, prepared.user_outputs, bd)
    infos = {
        vi.name: vi.type.tensor_type
        for vi in rebatched.proto.graph.input
        if vi.name in prepared.user_inputs
    }
    rng = np.random.default_rng(1)
    feed = {}
    for name, tt in infos.items():
        dynamic = DYNAMIC_CHECK_SIZES[0]  # (the size the compiler ran it at)
        shape = tuple(d.dim_value if d.dim_value > 0 else dynamic for d in tt.shape.dim)
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if np.dtype(dtype).kind == "O":
            return None  # string rows: one batch size
        feed[name] = random_array(rng, shape, np.dtype(dtype))
    names = list(prepared.user_outputs)
    for name in names:
        if outputs[name].shape[bd : bd + 1] != (b,):
            return None  # an output that does not carry the batch
    try:
        # Beside the optimised graph, whose weights may live in files next to it.
        with tempfile.NamedTemporaryFile(dir=optimized.base_dir, suffix=".onnx") as f:
            onnx.save_model(model, f.name)
            session = ort.InferenceSession(
                f.name, session_options("disable"), providers=["CPUExecutionProvider"]
            )
        full = run(session, feed)
        for n in sorted({1, min(3, b - 1)}):
            part = run(session, {k: np.take(v, range(n), axis=bd) for k, v in feed.items()})
            for name in names:
                if not rows_equal(np.take(full[name], range(n), axis=bd), part[name])[0]:
                    return None
    except Exception:  # onnxruntime refused the smaller batch: one batch size it is
        return None
    return bucket_sizes(b)

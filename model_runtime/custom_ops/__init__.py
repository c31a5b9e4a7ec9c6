"""Custom ops (seed 002, DESIGN.md §10): Python libraries of kernels, and the expression op.

How a kernel runs. Two designs were possible: (a) the kernel is Python, registered with
onnxruntime when the device creates its session (onnxruntime-extensions' Python ops); (b) the
build function returns ONNX nodes that the compiler inlines, so no library code runs at
inference. We chose (a):

* "One fused kernel" for ``codelet_expression_op`` is only possible with (a): onnxruntime's CPU
  provider does not fuse elementwise chains, so (b) would run ``x*x + y*z`` as three kernels
  with whole-array intermediates; with (a) one node evaluates the whole tree block by block.
* "Libraries come only from an allow-list at load" is honoured as the seed intends: the device
  re-imports each library the executable names, *only* if the loading process allows it, checks
  its source hash against the one recorded at compile time, and rebuilds the kernels from specs
  stored as JSON data. No code is ever read from the executable.
* Kernels stay in the same device/backend path: they are onnxruntime nodes of the main program.

Costs of (a), measured: a Python op call costs about 100 µs, and the kernel needs the host's
Python (so an executable with custom ops runs only where its libraries are installed). See
:mod:`.kernels` for the two onnxruntime-extensions pitfalls we work around (an exception in a
Python op aborts the process; outputs were copied through Python lists).

Hooks (where the rest of the runtime calls in):

* compiler: :func:`lower` before the other passes (records ``ExecutableMetadata.custom_ops``),
  :func:`enable` on every compile-time ``SessionOptions``, :func:`cacheability` when caching
  (an unhashable op: compiled, not cached), :func:`check_cacheable` when pre-compiling.
* device backend: :func:`prepare_session` before creating the main program's session, and
  :func:`check_run` after every ``session.run``.
"""

from model_runtime.custom_ops.api import BuildFunction, CustomOp, Kernel, TensorInfo
from model_runtime.custom_ops.expression import OPSET as EXPRESSION_OPSET, codelet_expression_op
from model_runtime.custom_ops.kernels import check_run, enable, raise_pending
from model_runtime.custom_ops.libraries import (
    ALLOW_ENV,
    allowed_libraries,
    load_library,
    set_allowed_libraries,
)
from model_runtime.custom_ops.lowering import (
    Cacheability,
    cacheability,
    check_cacheable,
    custom_op_nodes,
    lower,
    prepare_session,
)

__all__ = [
    "ALLOW_ENV",
    "EXPRESSION_OPSET",
    "BuildFunction",
    "Cacheability",
    "CustomOp",
    "Kernel",
    "TensorInfo",
    "allowed_libraries",
    "cacheability",
    "check_cacheable",
    "check_run",
    "codelet_expression_op",
    "custom_op_nodes",
    "enable",
    "load_library",
    "lower",
    "prepare_session",
    "raise_pending",
    "set_allowed_libraries",
]

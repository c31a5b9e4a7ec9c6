"""ONNX -> executable: compile options, the compiler, the executable cache, the reference runner.

``compile_model`` is the entry point; see :mod:`model_runtime.compiler.compile` for the passes.
"""

from model_runtime.compiler.cache import ExecutableCache, cache_key
from model_runtime.compiler.compile import compile_executable, compile_model
from model_runtime.compiler.options import OPTIMIZATION_LEVELS, CompileOptions
from model_runtime.compiler.reference import random_inputs, run_reference

__all__ = [
    "OPTIMIZATION_LEVELS",
    "CompileOptions",
    "ExecutableCache",
    "cache_key",
    "compile_executable",
    "compile_model",
    "random_inputs",
    "run_reference",
]

"""``compile_model``: ONNX model in, ``.mrx`` executable out (through the cache when enabled).

The passes, in order: load and check (:mod:`.source`), prepare variables and fix the batch
(:mod:`.rebatch`), run the graph to learn output shapes and prove the re-batching
(:mod:`.verify`), optimise offline (:mod:`.optimize`), move the weights' bytes into anchors
(they stay constants of the graph) and seal (:mod:`.lower`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

import onnx
import onnxruntime as ort
import structlog
from onnx import helper

from model_runtime import custom_ops
from model_runtime.compiler.buckets import find_buckets
from model_runtime.compiler.cache import ExecutableCache, cache_key
from model_runtime.compiler.graph import default_opset, graph_dims, upgrade_opset
from model_runtime.compiler.lower import lower
from model_runtime.compiler.optimize import optimize
from model_runtime.compiler.options import CompileOptions
from model_runtime.compiler.rebatch import prepare, rebatch
from model_runtime.compiler.source import ModelLike, ModelSource, load_source
from model_runtime.compiler.verify import check_outputs, check_updates
from model_runtime.errors import CompileError
from model_runtime.executable.container import Executable
from model_runtime.executable.model import TensorInfo
from model_runtime.flags import get_flags

__all__ = ["compile_executable", "compile_model"]

log = structlog.get_logger(__name__)


def compile_executable(model: ModelLike, options: CompileOptions | None = None) -> Executable:
    """Compile ``model`` into an in-memory :class:`Executable` (no file, no cache).

    Raises:
        CompileError: the options are invalid, or the model cannot be read, checked,
            re-batched, run or optimised; the message names the model and the defect.
        CustomOpError: a custom op library is not allowed, missing or broken.
    """
    options = options or CompileOptions()
    source = load_source(model, options.model_name)
    return _compile(source, options)


def compile_model(
    model: ModelLike,
    output_path: str | os.PathLike[str] | None = None,
    options: CompileOptions | None = None,
) -> Path:
    """Compile ``model`` into an executable file and return its path.

    With an executable cache (``options.executable_cache_path``, else
    ``MODEL_RUNTIME_FLAGS="--executable_cache_path=DIR"``) a cached executable for the same model,
    options and target is reused; the result is also copied to ``output_path`` when one is given.
    Without a cache and without ``output_path``, the file goes next to the model as ``.mrx``.

    A model using a custom op not marked hashable (seed 001: it cannot be cached or
    pre-compiled) is compiled as if no cache were set, and a warning ``executable not cached``
    says which op and why; it then needs ``output_path`` or a model read from a file.

    Raises:
        CompileError: as :func:`compile_executable`, or no output path can be chosen.
        CustomOpError: a custom op library is not allowed, missing or broken.
        ConfigurationError: ``MODEL_RUNTIME_FLAGS`` does not parse.
        OSError: the output or cache directory cannot be written.
    """
    options = options or CompileOptions()
    cache_dir = options.executable_cache_path or get_flags().executable_cache_path
    source = load_source(model, options.model_name)
    options.validate(f"model {source.name!r}")
    out = Path(output_path) if output_path is not None else None

    uncached = ""  # why a cache in effect was not used
    if cache_dir:
        # A changed library is a new key; a custom op not marked hashable is never cached.
        usable = custom_ops.cacheability(source.proto)
        if usable.cacheable:
            return _compile_cached(source, options, Path(cache_dir), usable.fingerprint, out)
        uncached = usable.reason("cached")
        log.warning(
            "executable not cached",
            model=source.name,
            cache=str(cache_dir),
            reason=uncached,
        )

    if out is None:
        if source.path is None:
            raise CompileError(
                f"model {source.name!r}: give an output path "
                + (f"({uncached})" if uncached else "(or an executable cache)")
                + " to compile a model that was not read from a file"
            )
        out = source.path.with_suffix(".mrx")
    _compile(source, options).save(out)
    log.info("compiled executable", path=str(out), model=source.name, cached=False)
    return out


def _compile_cached(
    source: ModelSource,
    options: CompileOptions,
    cache_dir: Path,
    fingerprint: str,
    out: Path | None,
) -> Path:
    cache = ExecutableCache(cache_dir)
    key = cache_key(source.sha256, options, fingerprint)
    with cache.lock(key):
        path = cache.lookup(key)
        if path is not None:
            log.info("executable cache hit", path=str(path), model=source.name)
        else:
            path = cache.path(key)
            _compile(source, options).save(path)
            log.info("compiled executable", path=str(path), model=source.name, cached=True)
    if out is None:
        return path
    out.parent.mkdir(parents=True, exist_ok=True)
    _copy_atomic(path, out)
    return out


def _copy_atomic(src: Path, dst: Path) -> None:
    fd, tmp = tempfile.mkstemp(prefix=dst.name + ".", suffix=".tmp", dir=dst.parent)
    os.close(fd)
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    finally:
        Path(tmp).unlink(missing_ok=True)


def _compile(source: ModelSource, options: CompileOptions) -> Executable:
    where = f"model {source.name!r}"
    options.validate(where)
    upgraded, converted_to = upgrade_opset(source.proto, where)
    if converted_to is not None:
        where += f" (upgraded from opset {default_opset(source.proto)} to {converted_to})"
    # Custom op nodes become kernel nodes onnxruntime can run (and optimise around).
    lowered, custom_op_refs = custom_ops.lower(upgraded, where=where)
    prepared = prepare(lowered, options, where)
    rebatched = rebatch(prepared, options.batch_size, options.batch_dim, where)
    outputs = check_outputs(prepared, rebatched, options.batch_size, options.batch_dim, where)
    check_updates(dict(options.variable_updates), prepared.variables, outputs, where)
    _set_output_shapes(rebatched.proto, outputs)
    with tempfile.TemporaryDirectory(prefix="model-runtime-compile-") as tmp:
        optimized = optimize(rebatched.proto, options.optimization_level, where, Path(tmp))
        buckets = find_buckets(
            optimized, prepared, rebatched, outputs, options, bool(custom_op_refs)
        )
        extra = {
            "optimization_level": options.optimization_level,
            "offline_optimization_level": optimized.level,
            "source_sha256": source.sha256,
            "opset": str(default_opset(source.proto)),
            "opset_converted_to": str(converted_to or ""),
            "batch_dim": str(options.batch_dim),
            "rebatched_from": rebatched.mode,
            "reshapes_rewritten": str(rebatched.reshapes_rewritten),
            "onnx_version": onnx.__version__,
            "onnxruntime_version": ort.__version__,
            "producer": source.proto.producer_name or "",
        }
        if buckets:
            extra["batch_sizes"] = ",".join(map(str, buckets))
        exe = lower(
            optimized,
            prepared,
            rebatched.proto,
            outputs,
            options,
            source.name,
            extra,
            where,
            custom_op_refs,
            symbolic_batch=bool(buckets),
        )
    return exe


def _set_output_shapes(model: onnx.ModelProto, outputs: Mapping[str, TensorInfo]) -> None:
    # Concrete output shapes help the optimiser and make the payload self-describing.
    for out in model.graph.output:
        info = outputs[out.name]
        elem = helper.np_dtype_to_tensor_dtype(info.dtype)
        out.type.CopyFrom(helper.make_tensor_type_proto(elem, graph_dims(out.name, info.shape)))

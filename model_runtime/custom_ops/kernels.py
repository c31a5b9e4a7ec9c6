"""Custom op kernels inside onnxruntime, through onnxruntime-extensions' Python ops (PyOp).

A lowered custom node is ``ai.onnx.contrib::MRCustomOp_<dtype>_<inputs>x<outputs>`` with one
string attribute, ``mr_spec``: a JSON document naming the library, the op, the node's
attributes and declared tensor infos. One dispatcher serves every kernel, looking it up by
``mr_spec`` in a process table that :func:`install` fills (the compiler while lowering, the
device at load).

Three properties of onnxruntime-extensions 0.15 shape this module:

* registering a Python op type after a session using the library was created makes destroying
  that session segfault (reproduced outside this project: register op A, create a session,
  register op B, drop the first session). So the op types form a fixed set (one dtype per
  kernel, up to :data:`MAX_INPUTS` inputs and :data:`MAX_OUTPUTS` outputs), all registered at
  once before our first session, and no op type is ever registered twice (that breaks every
  later session). Do not register other Python ops with onnxruntime-extensions in-process.

* an exception escaping a Python op *aborts the process* (``std::terminate``). The dispatcher
  therefore never lets one escape: it records a :class:`CustomOpError` in the running thread,
  returns zeros of the declared shapes, and :func:`raise_pending` raises the error after
  ``session.run`` returns (onnxruntime runs nodes on the calling thread in sequential mode).
* the stock hook copies outputs through Python lists; ours hands flat numpy arrays back.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from model_runtime.custom_ops.api import Kernel
from model_runtime.errors import ApplicationRuntimeError, CustomOpError

__all__ = [
    "DOMAIN",
    "OP_PREFIX",
    "SPEC_ATTR",
    "LoadedKernel",
    "check_run",
    "enable",
    "install",
    "is_installed",
    "op_type_for",
    "raise_pending",
    "run_kernel",
]

DOMAIN = "ai.onnx.contrib"
OP_PREFIX = "MRCustomOp_"
SPEC_ATTR = "mr_spec"
_ENABLED_KEY = "model_runtime.custom_ops.enabled"

#: dtypes kernels take and return (numpy name -> (op type code, PyCustomOpDef attribute)).
_DTYPES: dict[str, tuple[str, str]] = {
    "float32": ("f32", "dt_float"),
    "float64": ("f64", "dt_double"),
    "int32": ("i32", "dt_int32"),
    "int64": ("i64", "dt_int64"),
}
MAX_INPUTS = 8
MAX_OUTPUTS = 4


@dataclass(frozen=True, slots=True)
class LoadedKernel:
    """A built kernel, ready to run: ``name`` is ``library:op`` for messages."""

    name: str
    kernel: Kernel
    is_elementwise: bool


_lock = threading.Lock()
_kernels: dict[str, LoadedKernel] = {}
_signatures: dict[str, int] = {}  # op type -> onnxruntime-extensions op id
_our_ids: set[int] = set()
_pending = threading.local()
_hook_installed = False


def _extensions() -> Any:
    try:
        import onnxruntime_extensions as ortx  # type: ignore[import-untyped]
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise CustomOpError(
            "custom ops need the onnxruntime-extensions package: pip install onnxruntime-extensions"
        ) from exc
    return ortx


def op_type_for(inputs: Sequence[np.dtype[Any]], outputs: Sequence[np.dtype[Any]]) -> str:
    """The lowered node's op type for these input and output dtypes.

    Kernels take and return tensors of one dtype (float32, float64, int32 or int64), 1 to
    :data:`MAX_INPUTS` inputs and 1 to :data:`MAX_OUTPUTS` outputs: the set of op types is fixed
    and registered at once, before any session exists (see the module docstring).

    Raises:
        CustomOpError: another dtype, mixed dtypes, or too many inputs or outputs.
    """
    names = sorted({np.dtype(d).name for d in (*inputs, *outputs)})
    if len(names) != 1 or names[0] not in _DTYPES:
        raise CustomOpError(
            f"custom op kernels take and return tensors of one dtype ({', '.join(_DTYPES)}), "
            f"got {names}; cast the tensors in the graph around the op"
        )
    if not 1 <= len(inputs) <= MAX_INPUTS or not 1 <= len(outputs) <= MAX_OUTPUTS:
        raise CustomOpError(
            f"custom op kernels take 1-{MAX_INPUTS} inputs and return 1-{MAX_OUTPUTS} outputs, "
            f"got {len(inputs)} and {len(outputs)}"
        )
    return f"{OP_PREFIX}{_DTYPES[names[0]][0]}_{len(inputs)}x{len(outputs)}"


def _register_all() -> None:
    global _hook_installed
    if _hook_installed:
        return
    ortx = _extensions()
    pydef = ortx.PyCustomOpDef
    for code, attr in _DTYPES.values():
        dt = getattr(pydef, attr)
        for n_in in range(1, MAX_INPUTS + 1):
            for n_out in range(1, MAX_OUTPUTS + 1):
                op_type = f"{OP_PREFIX}{code}_{n_in}x{n_out}"
                opdef = ortx.onnx_op(
                    op_type=op_type,
                    inputs=[dt] * n_in,
                    outputs=[dt] * n_out,
                    attrs={SPEC_ATTR: pydef.dt_string},
                )(_unreachable)
                _signatures[op_type] = opdef._id
                _our_ids.add(opdef._id)
    from onnxruntime_extensions import _ocos

    stock = _ocos._on_pyop_invocation

    def hook(k_id: int, feed: list[Any], attributes: dict[str, Any]) -> tuple[Any, ...]:
        if k_id not in _our_ids:
            return stock(k_id, feed, attributes)  # type: ignore[no-any-return]
        return _dispatch(k_id, feed, attributes)

    pydef.install_hooker(hook)
    _hook_installed = True


def _unreachable(*args: Any, **kwargs: Any) -> Any:  # pragma: no cover - our hook dispatches
    raise AssertionError("model_runtime custom op dispatched through the stock hook")


def install(spec: str, loaded: LoadedKernel, op_type: str) -> None:
    """Make the kernel for ``spec`` runnable by nodes of ``op_type`` in this process.

    Raises:
        CustomOpError: onnxruntime-extensions is missing.
    """
    if op_type not in _all_op_types():
        raise CustomOpError(f"unknown custom op kernel type {op_type!r}; recompile the model")
    with _lock:
        _register_all()
        _kernels[spec] = loaded


def _all_op_types() -> frozenset[str]:
    return frozenset(
        f"{OP_PREFIX}{code}_{i}x{o}"
        for code, _ in _DTYPES.values()
        for i in range(1, MAX_INPUTS + 1)
        for o in range(1, MAX_OUTPUTS + 1)
    )


def is_installed(spec: str) -> bool:
    """Whether a kernel for ``spec`` is installed in this process."""
    return spec in _kernels


def enable(session_options: Any) -> None:
    """Register the Python-op library with an onnxruntime ``SessionOptions`` (call before the
    session is created). A no-op when no custom op kernel was ever installed in this process,
    or when these options already have it.

    Raises:
        CustomOpError: onnxruntime-extensions is missing.
    """
    if not _signatures:
        return
    try:  # idempotent: onnxruntime refuses the same library twice on one SessionOptions
        session_options.get_session_config_entry(_ENABLED_KEY)
        return
    except RuntimeError:
        pass
    session_options.register_custom_ops_library(_extensions().get_library_path())
    session_options.add_session_config_entry(_ENABLED_KEY, "1")


def raise_pending() -> None:
    """Raise (and clear) the first kernel error recorded on this thread since the last call.

    Call after every ``session.run`` of a graph with custom ops.

    Raises:
        CustomOpError: a kernel failed or returned outputs its Kernel does not declare.
    """
    error = getattr(_pending, "error", None)
    if error is not None:
        _pending.error = None
        raise error


def check_run(device: str) -> None:
    """:func:`raise_pending` for a device backend: a kernel failure is the program's failure.

    Raises:
        ApplicationRuntimeError: a kernel failed on this thread's last run (``from`` the
            :class:`CustomOpError` that says which op and why); ``device`` names the device.
    """
    try:
        raise_pending()
    except CustomOpError as exc:
        raise ApplicationRuntimeError(f"{device}: {exc}") from exc


def _resolve(shape: Sequence[int], like: np.ndarray[Any, Any] | None) -> tuple[int, ...]:
    if like is None:
        return tuple(max(d, 1) for d in shape)
    return tuple(
        (like.shape[i] if i < like.ndim else 1) if d < 0 else d for i, d in enumerate(shape)
    )


def run_kernel(loaded: LoadedKernel, inputs: Sequence[np.ndarray[Any, Any]]) -> list[np.ndarray]:
    """Run ``loaded`` on ``inputs`` and check its outputs against what it declares.

    Raises:
        CustomOpError: the kernel raised, or returned the wrong number, shapes or dtypes.
    """
    kernel = loaded.kernel
    try:
        result = kernel.compute(*inputs)
    except CustomOpError:
        raise
    except Exception as exc:
        raise CustomOpError(f"custom op {loaded.name} failed: {type(exc).__name__}: {exc}") from exc
    outs = [result] if isinstance(result, np.ndarray) else list(result)
    if len(outs) != len(kernel.outputs):
        raise CustomOpError(
            f"custom op {loaded.name} returned {len(outs)} outputs, its Kernel declares "
            f"{len(kernel.outputs)}; make compute return one array per declared output"
        )
    like = inputs[0] if inputs else None
    checked = []
    for i, (out, info) in enumerate(zip(outs, kernel.outputs, strict=True)):
        arr = np.asarray(out)
        shape = like.shape if loaded.is_elementwise and like is not None else None
        shape = shape or _resolve(info.shape, like)
        if arr.shape != shape or arr.dtype != info.dtype:
            raise CustomOpError(
                f"custom op {loaded.name} returned {arr.dtype.name}{list(arr.shape)} for output "
                f"{i}, but its Kernel declares {info.dtype.name}{list(shape)}; fix the kernel's "
                "compute function (or the outputs its build function declares)"
            )
        checked.append(arr)
    return checked


def _fallback(spec: str, feed: Sequence[np.ndarray[Any, Any]]) -> list[np.ndarray]:
    like = feed[0] if feed else None
    try:
        declared = json.loads(spec)["outputs"]
        return [np.zeros(_resolve(s, like), dtype=np.dtype(d)) for s, d in declared]
    except Exception:  # unreadable spec: onnxruntime checks the output count and type itself
        return [np.zeros((1,), dtype=np.float32)]


def _dispatch(k_id: int, feed: list[Any], attributes: dict[str, Any]) -> tuple[Any, ...]:
    spec = str(attributes.get(SPEC_ATTR, ""))
    arrays = [np.asarray(x) for x in feed]
    try:
        loaded = _kernels.get(spec)
        if loaded is None:
            raise CustomOpError(
                "a custom op node ran without its kernel: the device did not prepare the "
                "executable's custom ops (model_runtime.custom_ops.prepare_session)"
            )
        outs = run_kernel(loaded, arrays)
    except BaseException as exc:  # must not reach onnxruntime: it would abort the process
        error = exc if isinstance(exc, CustomOpError) else CustomOpError(f"custom op: {exc!r}")
        if getattr(_pending, "error", None) is None:
            _pending.error = error
        outs = _fallback(spec, arrays)
    result: list[Any] = [k_id]
    for out in outs:
        result.append(out.shape)
        result.append(np.ascontiguousarray(out).ravel())
    return tuple(result)

"""Custom op kernels inside onnxruntime, through onnxruntime-extensions' Python ops (PyOp).

A lowered custom node is ``ai.onnx.contrib::MRCustomOp_<input dtypes>__<output dtypes>`` with
one string attribute, ``mr_spec``: a JSON document naming the library, the op, the node's
attributes and declared tensor infos. Each signature is registered with onnxruntime-extensions
once per process (registering an op type twice breaks every later session); one dispatcher
serves every kernel of a signature, looking its kernel up by ``mr_spec`` in a process table that
:func:`install` fills (the compiler while lowering, the device at load).

Two properties of onnxruntime-extensions 0.15 shape this module:

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

#: numpy dtype name -> (op type code, PyCustomOpDef attribute)
_DTYPES: dict[str, tuple[str, str]] = {
    "float32": ("f32", "dt_float"),
    "float64": ("f64", "dt_double"),
    "float16": ("f16", "dt_float16"),
    "int8": ("i8", "dt_int8"),
    "int16": ("i16", "dt_int16"),
    "int32": ("i32", "dt_int32"),
    "int64": ("i64", "dt_int64"),
    "uint8": ("u8", "dt_uint8"),
    "uint16": ("u16", "dt_uint16"),
    "uint32": ("u32", "dt_uint32"),
    "uint64": ("u64", "dt_uint64"),
    "bool": ("b", "dt_bool"),
}


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

    Raises:
        CustomOpError: a dtype custom op kernels cannot carry.
    """

    def codes(dtypes: Sequence[np.dtype[Any]]) -> str:
        out = []
        for dt in dtypes:
            entry = _DTYPES.get(np.dtype(dt).name)
            if entry is None:
                raise CustomOpError(
                    f"custom op kernels cannot carry dtype {np.dtype(dt).name} "
                    f"(supported: {', '.join(_DTYPES)})"
                )
            out.append(entry[0])
        return "-".join(out)

    return f"{OP_PREFIX}{codes(inputs)}__{codes(outputs)}"


def _register_signature(op_type: str) -> None:
    global _hook_installed
    if op_type in _signatures:
        return
    ortx = _extensions()
    by_code = {code: attr for code, attr in _DTYPES.values()}
    ins, outs = op_type[len(OP_PREFIX) :].split("__")
    pydef = ortx.PyCustomOpDef
    opdef = ortx.onnx_op(
        op_type=op_type,
        inputs=[getattr(pydef, by_code[c]) for c in ins.split("-") if c],
        outputs=[getattr(pydef, by_code[c]) for c in outs.split("-") if c],
        attrs={SPEC_ATTR: pydef.dt_string},
    )(_unreachable)
    _signatures[op_type] = opdef._id
    _our_ids.add(opdef._id)
    if not _hook_installed:
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
    with _lock:
        _register_signature(op_type)
        _kernels[spec] = loaded


def is_installed(spec: str) -> bool:
    """Whether a kernel for ``spec`` is installed in this process."""
    return spec in _kernels


def enable(session_options: Any) -> None:
    """Register the Python-op library with an onnxruntime ``SessionOptions`` (call before the
    session is created). A no-op when no custom op kernel was ever installed in this process.

    Raises:
        CustomOpError: onnxruntime-extensions is missing.
    """
    if _signatures:
        session_options.register_custom_ops_library(_extensions().get_library_path())


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

"""The reference runner: one batch through an executable's main program with plain onnxruntime.

It is the first end-to-end path and what device backends are tested against: no queues, no
actors. Weights the main program keeps as initializers are handed to onnxruntime from the
executable's tensors when its session is made (cached per executable; string constants, which
onnxruntime cannot take that way, are put back into the graph); weights that are graph
inputs (executables compiled before weights stayed initializers) are fed from the executable
on every call. Slow by design, obviously correct.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from model_runtime import custom_ops
from model_runtime.compiler.ort import first_line, random_array, session_options
from model_runtime.errors import ApplicationRuntimeError, InputValidationError
from model_runtime.executable.container import Executable
from model_runtime.executable.model import Anchor, ProgramKind
from model_runtime.executable.strings import with_string_initializers
from model_runtime.executable.validate import anchored_initializers

__all__ = ["random_inputs", "run_reference"]

#: package hash -> (session, the weight arrays it was given: they must outlive it)
_SESSIONS: OrderedDict[str, tuple[ort.InferenceSession, list[np.ndarray]]] = OrderedDict()
_SESSIONS_LOCK = threading.Lock()
_MAX_SESSIONS = 4


def _session(exe: Executable) -> ort.InferenceSession:
    key = exe.package_hash
    with _SESSIONS_LOCK:
        cached = _SESSIONS.get(key)
        if cached is not None:
            _SESSIONS.move_to_end(key)
            return cached[0]
    main = [exe.metadata.program(p) for p in exe.metadata.program_flow.main]
    if len(main) != 1 or main[0].kind is not ProgramKind.MAIN:
        raise ApplicationRuntimeError(
            f"{exe.metadata.model_name}: the reference runner needs exactly one main program"
        )
    so = session_options("all", enable_custom_ops=False)  # registering twice fails
    custom_ops.prepare_session(so, exe)  # install the kernels of its custom ops, if any
    payload = exe.program_payload(main[0])
    handles = {a.handle: a.name for a in exe.metadata.weights}
    model = onnx.load_model_from_string(payload)
    names = anchored_initializers(model)
    if any(n not in handles for n in names):
        raise ApplicationRuntimeError(
            f"{exe.metadata.model_name}: a main program initializer names no weight"
        )
    values = {n: np.array(exe.anchor_data(handles[n]), order="C") for n in names}
    strings = {n: v for n, v in values.items() if v.dtype.kind == "O"}
    if strings:  # an OrtValue holds no strings: they go back into the graph
        payload = with_string_initializers(model, strings)
    constants = [v for n, v in values.items() if n not in strings]
    if constants:
        so.add_external_initializers(
            [n for n in values if n not in strings],
            [ort.OrtValue.ortvalue_from_numpy(c) for c in constants],
        )
    try:
        session = ort.InferenceSession(payload, so, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise ApplicationRuntimeError(
            f"{exe.metadata.model_name}: onnxruntime cannot load the main program: "
            f"{first_line(exc)}"
        ) from exc
    with _SESSIONS_LOCK:
        _SESSIONS[key] = (session, constants)
        while len(_SESSIONS) > _MAX_SESSIONS:
            _SESSIONS.popitem(last=False)
    return session


def _checked(kind: str, anchor: Anchor, value: Any, model: str) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise InputValidationError(
            f"{model}: {kind} {anchor.name!r} must be a numpy array, got {type(value).__name__}"
        )
    if value.dtype != anchor.dtype:
        raise InputValidationError(
            f"{model}: {kind} {anchor.name!r} must be {anchor.dtype.name}, got {value.dtype.name}"
        )
    if tuple(value.shape) != anchor.shape:
        raise InputValidationError(
            f"{model}: {kind} {anchor.name!r} must have shape {list(anchor.shape)}, "
            f"got {list(value.shape)}"
        )
    if value.dtype.kind == "O":  # strings: the runtime's bytes, as onnxruntime takes them
        return np.asarray(_AS_STR(value), dtype=object)
    return np.ascontiguousarray(value)


def _as_str(value: Any) -> Any:
    # onnxruntime's binding would write a bytes object as its repr ("b'...'"), silently.
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value


_AS_STR = np.frompyfunc(_as_str, 1, 1)


def _names_match(kind: str, given: Mapping[str, Any], expected: list[str], model: str) -> None:
    missing = [n for n in expected if n not in given]
    unknown = [n for n in given if n not in expected]
    if missing or unknown:
        parts = []
        if missing:
            parts.append(f"missing {kind}s {missing}")
        if unknown:
            parts.append(f"unknown {kind}s {unknown}")
        raise InputValidationError(f"{model}: {'; '.join(parts)} (expects {expected})")


def run_reference(
    exe: Executable,
    inputs: Mapping[str, np.ndarray],
    variables: Mapping[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """Run ``exe``'s main program once, on exactly one batch, with plain onnxruntime.

    ``inputs`` maps every user input anchor name to an array of exactly its shape and dtype;
    string inputs may hold ``bytes`` (UTF-8, as the runtime keeps them) or ``str``, and string
    outputs come back as onnxruntime gives them, ``str``.
    ``variables`` gives the current value of some or all variables (the rest start from their
    initial values). Returns every output anchor by name, user outputs and variables' new
    values (see ``metadata.output_to_variable``) alike.

    Raises:
        InputValidationError: an input or variable is missing, unknown, or of the wrong
            shape or dtype.
        ApplicationRuntimeError: onnxruntime cannot load or run the main program, or a custom
            op kernel failed.
        CustomOpError: a custom op library the executable uses is not allowed or has changed.
    """
    m = exe.metadata
    model = f"model {m.model_name!r}"
    _names_match("input", inputs, [a.name for a in m.user_inputs], model)
    feeds: dict[str, np.ndarray] = {}
    for a in m.user_inputs:
        feeds[a.handle] = _checked("input", a, inputs[a.name], model)
    given = dict(variables or {})
    known_vars = [a.name for a in m.variables]
    unknown = [n for n in given if n not in known_vars]
    if unknown:
        raise InputValidationError(f"{model}: unknown variables {unknown} (has {known_vars})")
    for a in m.variables:
        value = given.get(a.name)
        feeds[a.handle] = (
            exe.tensor(a.name) if value is None else _checked("variable", a, value, model)
        )

    session = _session(exe)
    graph_inputs = {i.name for i in session.get_inputs()}
    for a in m.weights:
        if a.handle in graph_inputs:  # else a constant of the session
            feeds[a.handle] = exe.tensor(a.name)
    outputs = [a for a in m.anchors if a.role.value == "user_output"]
    try:
        values = session.run([a.handle for a in outputs], feeds)
    except Exception as exc:
        custom_ops.check_run(model)  # the kernel's own error says more than onnxruntime's
        raise ApplicationRuntimeError(
            f"{model}: the main program failed: {first_line(exc)}"
        ) from exc
    custom_ops.check_run(model)
    return {a.name: np.asarray(v) for a, v in zip(outputs, values, strict=True)}


def random_inputs(exe: Executable, seed: int = 0) -> dict[str, np.ndarray]:
    """One batch of random inputs for ``exe`` (normal floats, small ints), by anchor name."""
    rng = np.random.default_rng(seed)
    return {
        a.name: np.asarray(random_array(rng, a.shape, a.dtype)) for a in exe.metadata.user_inputs
    }

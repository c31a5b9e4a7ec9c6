"""onnxruntime sessions of executables' main programs: options, weights, and sharing.

**Options**, chosen for a server (:func:`session_options`):

* threads: ``intra_op_num_threads`` is the device slot's thread count (``DeviceSpec.threads``,
  from the inventory); one inter-op thread, sequential execution (one program runs at a time on
  a device).
* spinning off: ``session.intra_op.allow_spinning`` (and ``inter_op``) is ``"0"``. A spinning
  pool keeps its threads busy-waiting after every run, which on a server steals the cores from
  the other devices, the event loop and the network stack between batches. Set
  ``MODEL_RUNTIME_ORT_SPINNING=1`` in the environment (read at each load) to turn spinning back
  on for a machine whose cores a single device owns (slightly lower latency per run).
* no memory arena: ``enable_cpu_mem_arena`` is off. onnxruntime's arena keeps, per session,
  the memory of its largest run for good; with many models that is memory held by models that
  are not running (measured, MLP 784-512-512-10: 1.0 MB more per session at batch 8, 2.7 MB
  instead of 3.7 MB), and without it runs took the same time within noise (MLP batch 8 and 32,
  squeezenet batch 1 and 4; 2% longer at MLP batch 256). ``MODEL_RUNTIME_ORT_ARENA=1`` turns
  it back on.
* graph optimisation level: explicit, ``ORT_ENABLE_ALL`` (the layout transformations specific to
  the CPU that runs the program belong here, at load, not in the portable executable), unless
  the executable was compiled asking for less (``optimization_level`` ``disable`` or ``basic`` in
  its options), which is then honoured.
* logging: fatal only; every run error is translated into ours.

**Weights** are constants of the session. A compiled main program keeps its weights as
initializers whose bytes are the executable's weight tensors (see
:mod:`model_runtime.executable.validate`); those tensors themselves (read-only arrays of the
executable's private memory), or the ``frozen_inputs`` that replace them, are handed to
onnxruntime with ``SessionOptions.add_external_initializers``, so it constant-folds and
prepacks them exactly as it would the source model's and never opens a file. onnxruntime copies
what it is handed this way into the session (its own memory, which its prepacking then
replaces by the packed layout), so nothing here keeps the arrays once the session is built, and
a runner may release the executable's copy (``Executable.release``): a served model then holds
its weights once, in its session. (onnxruntime's ``AddInitializer``, the API that would use our
buffers in place, keeps them unpacked beside the packed copy: no saving while prepacking pays.)
That onnxruntime copies is checked by
``tests/unit/test_device_backend.py::test_onnxruntime_owns_the_weights_it_was_handed``, which
frees the arrays, scribbles over the memory and runs again: a version of onnxruntime that used
them in place would fail it. String constants cannot travel that way (an ``OrtValue`` holds no
strings): they are put back into the main program's graph as initializers before the session is
created.

**Sharing** (issue 34). onnxruntime copies the initializers it is handed into each session and
prepacks the weights of MatMul, Gemm and convolutions into a layout of its own (measured with
1.32: each session of a 48 MB three-layer MLP adds 1.2x its weights, with or without
prepacking; a second session of it another 1.0x). So a session is built once per executable and
options, and every device that runs that executable with those options runs the same session
object: onnxruntime's ``Run`` may be called from several threads at once, and a device's state
(its variables, its ``RunOptions``, which a reset terminates) lives in its backend, not in the
session. Sessions are shared, keyed by the executable's package hash (SHA-256 of every tensor
and the metadata: equal hashes are equal bytes), the main program and the options, while a
device or a runner holds them (a weak registry: a device reset reloads onto the session it
had; a runner holds its replicas' sessions for its whole life, so a replica whose actors
restart finds its session again, also after the runner released the executable's weights; the
last holder to let go frees it). Not shared, built for the one device that asks:

* a device with more than one intra-op thread: concurrent runs of one session share that
  session's one thread pool, so two such devices would compute with the threads of one;
* weights replaced by ``frozen_inputs`` (the constants are that device's own);
* executables with custom ops (each load checks their libraries against the allow-list again).

Building is serialised in the process, so the memory a build adds to the process
(:attr:`OrtSession.built_bytes`, the resident set's growth while onnxruntime builds it) is that
session's alone; an estimate (freed memory the allocator reuses is not counted), which is what
``/metrics`` reports. The copies a build frees go back to the system before it is measured
(:mod:`.native_heap`): a session costs what it keeps.

**Prepacking** stays on: it costs no memory once the build's copies are given back (measured
with 1.32, MLP 784-512-512-10, W = 2.55 MB, ten sessions: each 1.05 W with prepacking, 1.04 W
with ``session.disable_prepacking``; 1.55 W and 1.03 W when the freed copies stay in the heap),
because the packed layout replaces the initializer it packs.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime as ort

from actors.device.backends.native_heap import give_back_freed, resident_bytes
from actors.device.inventory import DeviceSpec
from model_runtime.errors import (
    ApplicationRuntimeError,
    ConfigurationError,
    InputValidationError,
)
from model_runtime.executable.model import AnchorRole, Program
from model_runtime.executable.validate import anchored_initializers

if TYPE_CHECKING:
    from model_runtime.executable import Executable

__all__ = [
    "ARENA_ENV",
    "SPINNING_ENV",
    "OrtSession",
    "SessionKey",
    "arena",
    "live_sessions",
    "load_level",
    "open_session",
    "session_options",
    "spinning",
]

#: Environment variable that turns onnxruntime's thread-pool spinning on ("1") for every
#: session a cpu (or ipu-model) device creates; off by default (module docstring, Options).
SPINNING_ENV = "MODEL_RUNTIME_ORT_SPINNING"
#: Environment variable that turns onnxruntime's CPU memory arena on ("1"); off by default.
ARENA_ENV = "MODEL_RUNTIME_ORT_ARENA"
_ON = ("1", "true", "yes", "on")
_OFF = ("", "0", "false", "no", "off")

_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def load_level(executable: Executable) -> ort.GraphOptimizationLevel:
    """The graph optimisation level a device applies when it loads ``executable``.

    ``ORT_ENABLE_ALL``, unless the executable was compiled with ``optimization_level``
    ``disable`` or ``basic`` (then that level). An unknown or missing level means ``all``.
    """
    requested = executable.metadata.options.get("optimization_level", "all")
    return _LEVELS.get(requested, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)


def spinning(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``MODEL_RUNTIME_ORT_SPINNING`` turns thread-pool spinning on (default: off).

    Raises:
        ConfigurationError: the variable is set to something other than 0/1/true/false/on/off.
    """
    return _switch(SPINNING_ENV, environ)


def arena(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``MODEL_RUNTIME_ORT_ARENA`` turns the CPU memory arena on (default: off).

    Raises:
        ConfigurationError: the variable is set to something other than 0/1/true/false/on/off.
    """
    return _switch(ARENA_ENV, environ)


def _switch(name: str, environ: Mapping[str, str] | None) -> bool:
    env = os.environ if environ is None else environ
    value = env.get(name, "").strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise ConfigurationError(f"{name}={env.get(name)!r}: expected 0 or 1")


def session_options(
    spec: DeviceSpec, executable: Executable, environ: Mapping[str, str] | None = None
) -> ort.SessionOptions:
    """The onnxruntime session options of ``executable`` on ``spec`` (module docstring, Options).

    Raises:
        ConfigurationError: ``MODEL_RUNTIME_ORT_SPINNING`` or ``MODEL_RUNTIME_ORT_ARENA`` is
            malformed.
    """
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = max(1, spec.threads)
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = load_level(executable)
    spin = "1" if spinning(environ) else "0"
    opts.add_session_config_entry("session.intra_op.allow_spinning", spin)
    opts.add_session_config_entry("session.inter_op.allow_spinning", spin)
    opts.enable_cpu_mem_arena = arena(environ)
    # Fatal only: every run error is translated into ours (and logged by the session);
    # onnxruntime's own ERROR lines would go to stderr, past the application's logging.
    opts.log_severity_level = 4
    return opts


@dataclass(frozen=True, slots=True)
class SessionKey:
    """What makes two devices' sessions the same session (module docstring, Sharing)."""

    package_hash: str
    program: int
    threads: int
    level: int
    spinning: bool
    arena: bool


class OrtSession:
    """One onnxruntime session of a main program, and what its build added to the process."""

    __slots__ = ("__weakref__", "built_bytes", "key", "session", "weights")

    def __init__(
        self, session: Any, weights: frozenset[str], key: SessionKey | None, built: int
    ) -> None:
        self.session = session
        #: Anchor names of the weights handed to onnxruntime as constants: the session holds
        #: its own copy of them (module docstring, Weights).
        self.weights = weights
        #: None: this device's own session (module docstring: not shared).
        self.key = key
        #: Growth of the process's resident set while the session was built (bytes, >= 0).
        self.built_bytes = built


_LIVE: weakref.WeakValueDictionary[SessionKey, OrtSession] = weakref.WeakValueDictionary()
#: Held while a session is built or looked up: one build at a time (module docstring).
_BUILD = threading.Lock()


def live_sessions() -> list[OrtSession]:
    """Every shared session some device holds now (for tests and metrics)."""
    with _BUILD:
        return list(_LIVE.values())


def _key(
    spec: DeviceSpec, executable: Executable, program: Program, frozen: Mapping[str, np.ndarray]
) -> SessionKey | None:
    m = executable.metadata
    if spec.threads != 1 or m.custom_ops or not m.package_hash:
        return None
    if any(m.anchor(name).role is AnchorRole.WEIGHT for name in frozen):
        return None
    return SessionKey(
        package_hash=m.package_hash,
        program=program.id,
        threads=spec.threads,
        level=int(load_level(executable)),
        spinning=spinning(),
        arena=arena(),
    )


def open_session(
    spec: DeviceSpec, executable: Executable, program: Program, frozen: Mapping[str, np.ndarray]
) -> OrtSession:
    """The session that runs ``program`` of ``executable`` on ``spec``: the live shared one
    where there is one (module docstring), else a new one, registered for sharing if it may be.

    Raises:
        ApplicationRuntimeError: onnxruntime cannot build a session from the program.
        InputValidationError: a frozen string constant holds something other than bytes/str.
        ConfigurationError: ``MODEL_RUNTIME_ORT_SPINNING`` is malformed.
        CustomOpError: a custom op library is refused (see ``prepare_session``).
    """
    key = _key(spec, executable, program, frozen)
    with _BUILD:
        if key is not None and (live := _LIVE.get(key)) is not None:
            return live
        give_back_freed()  # what others freed and this build would reuse is not its growth
        before = resident_bytes()
        session, weights = _build(spec, executable, program, frozen)
        give_back_freed()  # the build's transient copies (.native_heap)
        built = OrtSession(session, weights, key, max(0, resident_bytes() - before))
        if key is not None:
            _LIVE[key] = built
        return built


def _build(
    spec: DeviceSpec, executable: Executable, program: Program, frozen: Mapping[str, np.ndarray]
) -> tuple[Any, frozenset[str]]:
    device = spec.describe()
    opts = session_options(spec, executable)
    if executable.metadata.custom_ops:
        # Kernels come from the allow-listed libraries of this process, never the file.
        from model_runtime.custom_ops import prepare_session

        prepare_session(opts, executable)
    payload = executable.program_payload(program)
    # Every weight in memory: the executable itself, or, where the runner released weights a
    # session already holds, a new read of its files verified against its package hash.
    constants, names = _constant_weights(executable.held(), payload, frozen, device)
    strings = {n: v for n, v in constants.items() if v.dtype.kind == "O"}
    if strings:  # an OrtValue holds no strings: they go back into the graph itself
        payload = _with_strings(payload, strings, device)
        constants = {n: v for n, v in constants.items() if n not in strings}
    if constants:
        opts.add_external_initializers(
            list(constants), [ort.OrtValue.ortvalue_from_numpy(v) for v in constants.values()]
        )
    try:
        session = ort.InferenceSession(payload, opts, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own (untyped) exception classes
        raise ApplicationRuntimeError(
            f"{device}: onnxruntime rejected main program {program.name!r}: {exc}"
        ) from exc
    # Not kept: onnxruntime copied them into the session (module docstring, Weights).
    return session, frozenset(names[h] for h in constants if names[h] not in frozen)


def _constant_weights(
    executable: Executable, payload: bytes, frozen: Mapping[str, np.ndarray], device: str
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Initializer name -> owned array, for every weight the main program keeps as an
    initializer (its frozen value where one is given): what onnxruntime must be handed; and
    initializer name -> the weight's anchor name.

    Raises:
        ApplicationRuntimeError: the payload does not parse, or keeps an initializer for a
            weight it does not have (both refused by validation: such an executable was
            assembled around it).
    """
    import onnx

    model = onnx.ModelProto()
    try:
        model.ParseFromString(payload)
    except Exception as exc:  # protobuf's DecodeError
        raise ApplicationRuntimeError(f"{device}: main program is not ONNX: {exc}") from exc
    names = anchored_initializers(model)
    if not names:
        return {}, {}
    by_handle = {a.handle: a for a in executable.metadata.weights}
    constants: dict[str, np.ndarray] = {}
    anchors: dict[str, str] = {}
    for name in names:
        a = by_handle.get(name)
        if a is None:  # never handed to onnxruntime: it would look for a file
            raise ApplicationRuntimeError(
                f"{device}: main program initializer {name!r} names no weight of the executable"
            )
        value = frozen.get(a.name)
        # The executable's own tensors, read into private memory at load (no file change can
        # touch them) and read-only: no copy of ours per replica (onnxruntime makes its own
        # per session). A string constant's array is always a fresh one; a frozen input is the
        # runner's owned copy.
        constants[name] = value if value is not None else executable.anchor_data(a.name)
        anchors[name] = a.name
    return constants, anchors


def _with_strings(payload: bytes, strings: Mapping[str, np.ndarray], device: str) -> bytes:
    """``payload`` with its string constants' stubs replaced by initializers holding them.

    Raises:
        InputValidationError: a frozen string constant holds something other than bytes/str.
        ApplicationRuntimeError: the payload does not parse (refused by validation).
    """
    import onnx

    from model_runtime.executable.strings import with_string_initializers

    model = onnx.ModelProto()
    try:
        model.ParseFromString(payload)
    except Exception as exc:  # protobuf's DecodeError
        raise ApplicationRuntimeError(f"{device}: main program is not ONNX: {exc}") from exc
    try:
        return with_string_initializers(model, strings)
    except TypeError as exc:
        raise InputValidationError(f"{device}: frozen string constant: {exc}") from exc

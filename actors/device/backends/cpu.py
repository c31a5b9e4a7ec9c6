"""The ``cpu`` backend: onnxruntime's CPU execution provider, a fixed number of intra-op threads.

Weights are constants of the session. A compiled main program keeps its weights as initializers
whose bytes are the executable's weight tensors (see :mod:`model_runtime.executable.validate`);
at load this backend hands those tensors themselves (read-only arrays of the executable's
private memory, with no copy of ours per replica), or the ``frozen_inputs`` that replace them,
to onnxruntime with ``SessionOptions.add_external_initializers``: so onnxruntime constant-folds
and prepacks them exactly as it would the source model's and never opens a file. (onnxruntime
1.32 still copies them into each session, about 1x the weights, and its prepacking keeps a
packed copy: measured, issue 34.) String constants cannot travel that way (an ``OrtValue``
holds no strings): they are put back into the main program's graph as initializers before the
session is created, at load. Executables whose main program takes weights as graph inputs
(compiled before that, or built by hand) still load: those weights are fed like variables.

"Device memory" for the rest is a feed dict built once at load: variables (and weights that are
graph inputs) as owned, contiguous arrays, keyed by graph input name. A run adds only the user
inputs and calls ``session.run``; onnxruntime wraps contiguous numpy inputs without copying, and
its outputs are fresh arrays. (Measured on the 2-core machine, tiny model: ``run`` with a dict
13 µs; IOBinding with pre-bound OrtValues 44-53 µs, and its ``get_outputs`` reuses output memory
between runs. So the plain feed is both the faster and the safer way to keep state "on device".)

Session options, chosen for a server (:func:`session_options`):

* threads: ``intra_op_num_threads`` is the device slot's thread count (``DeviceSpec.threads``,
  from the inventory); one inter-op thread, sequential execution (one program runs at a time on
  a device).
* spinning off: ``session.intra_op.allow_spinning`` (and ``inter_op``) is ``"0"``. A spinning
  pool keeps its threads busy-waiting after every run, which on a server steals the cores from
  the other devices, the event loop and the network stack between batches. Set
  ``MODEL_RUNTIME_ORT_SPINNING=1`` in the environment (read at each load) to turn spinning back
  on for a machine whose cores a single device owns (slightly lower latency per run).
* graph optimisation level: explicit, ``ORT_ENABLE_ALL`` (the layout transformations specific to
  the CPU that runs the program belong here, at load, not in the portable executable), unless
  the executable was compiled asking for less (``optimization_level`` ``disable`` or ``basic`` in
  its options), which is then honoured.
* logging: fatal only; every run error is translated into ours.

String tensors (``bytes`` anchors) are numpy object arrays of ``bytes`` everywhere in the
runtime; onnxruntime's Python binding takes ``str`` (it would write a ``bytes`` object as its
``repr``) and returns ``str``, so a model with string inputs or outputs has them decoded from
and encoded to UTF-8 here, per run (models without strings skip this).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime as ort

from actors.device.inventory import DeviceSpec
from model_runtime.errors import (
    ApplicationRuntimeError,
    ConfigurationError,
    DeviceStateError,
    InputValidationError,
)
from model_runtime.executable.model import Anchor, AnchorRole, ProgramKind
from model_runtime.executable.validate import anchored_initializers

if TYPE_CHECKING:
    from model_runtime.executable import Executable

__all__ = ["SPINNING_ENV", "CpuBackend", "RunAborted", "load_level", "session_options"]

#: Environment variable that turns onnxruntime's thread-pool spinning on ("1") for every
#: session a cpu (or ipu-model) device creates; off by default (see the module docstring).
SPINNING_ENV = "MODEL_RUNTIME_ORT_SPINNING"
_ON = ("1", "true", "yes", "on")
_OFF = ("", "0", "false", "no", "off")

_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}

try:  # onnxruntime's exception types live in its pybind module
    from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument as _OrtInvalidArgument
except ImportError:  # pragma: no cover
    _OrtInvalidArgument = ValueError


def _decode_one(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _encode_one(value: Any) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


_DECODE = np.frompyfunc(_decode_one, 1, 1)
_ENCODE = np.frompyfunc(_encode_one, 1, 1)


def to_str_array(arr: np.ndarray, name: str) -> np.ndarray:
    """``arr`` (``bytes`` elements) as the ``str`` array onnxruntime takes.

    Raises:
        InputValidationError: an element is not valid UTF-8.
    """
    try:
        return np.asarray(_DECODE(arr), dtype=object)
    except UnicodeDecodeError as exc:
        raise InputValidationError(
            f"run_main: input {name!r} holds bytes that are not UTF-8, which onnxruntime "
            f"cannot take: {exc}"
        ) from None


def to_bytes_array(arr: np.ndarray) -> np.ndarray:
    """onnxruntime's ``str`` array as the runtime's ``bytes`` array (UTF-8)."""
    return np.asarray(_ENCODE(arr), dtype=object)


class RunAborted(DeviceStateError):
    """A run was aborted by :meth:`CpuBackend.terminate` (a reset or stop)."""


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
    env = os.environ if environ is None else environ
    value = env.get(SPINNING_ENV, "").strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise ConfigurationError(f"{SPINNING_ENV}={env.get(SPINNING_ENV)!r}: expected 0 or 1")


def session_options(
    spec: DeviceSpec, executable: Executable, environ: Mapping[str, str] | None = None
) -> ort.SessionOptions:
    """The onnxruntime session options of ``executable`` on device ``spec`` (module docstring).

    Raises:
        ConfigurationError: ``MODEL_RUNTIME_ORT_SPINNING`` is malformed.
    """
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = max(1, spec.threads)
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = load_level(executable)
    spin = "1" if spinning(environ) else "0"
    opts.add_session_config_entry("session.intra_op.allow_spinning", spin)
    opts.add_session_config_entry("session.inter_op.allow_spinning", spin)
    # Fatal only: every run error is translated into ours (and logged by the session);
    # onnxruntime's own ERROR lines would go to stderr, past the application's logging.
    opts.log_severity_level = 4
    return opts


class CpuBackend:
    """Runs an executable's main program with onnxruntime on the CPU (see module docstring)."""

    kind = "cpu"

    def __init__(self, spec: DeviceSpec) -> None:
        self._custom_ops = False
        self.spec = spec
        self._exe: Executable | None = None
        self._frozen: dict[str, np.ndarray] = {}
        self._constants: list[np.ndarray] = []  # weights the session holds (must outlive it)
        self._session: Any = None
        self._feed: dict[str, np.ndarray] = {}
        self._inputs: tuple[tuple[str, str, tuple[int, ...], np.dtype[Any]], ...] = ()
        self._buckets: frozenset[int] = frozenset()
        self._strings = False  # any string input or output: converted per run
        self._str_inputs: tuple[tuple[str, str], ...] = ()  # (anchor name, handle)
        self._str_outputs: frozenset[int] = frozenset()  # graph output indexes
        self._output_names: list[str] = []
        self._outputs: tuple[tuple[int, str], ...] = ()  # (graph output index, anchor name)
        self._updates: tuple[tuple[int, str, bool], ...] = ()  # (index, var handle, copy?)
        self._variables: tuple[Anchor, ...] = ()
        self._run_options: Any = None
        self._lock = threading.Lock()
        self._terminated = False

    @property
    def executable(self) -> Executable | None:
        return self._exe

    # -- load ------------------------------------------------------------------------------

    def load(self, executable: Executable, frozen_inputs: Mapping[str, np.ndarray] | None) -> None:
        """See :meth:`Backend.load`.

        Raises:
            InputValidationError: a frozen input names no anchor or has the wrong shape/dtype.
            ApplicationRuntimeError: onnxruntime cannot build a session from the main program.
            ConfigurationError: ``MODEL_RUNTIME_ORT_SPINNING`` is malformed.
        """
        self.unload()
        m = executable.metadata
        frozen = dict(frozen_inputs or {})
        for name, value in frozen.items():
            try:
                a = m.anchor(name)
            except KeyError:
                raise InputValidationError(f"frozen input {name!r} names no anchor") from None
            if a.role is AnchorRole.USER_OUTPUT:
                raise InputValidationError(f"frozen input {name!r} is an output")
            arr = np.asarray(value)
            if arr.shape != a.shape or arr.dtype != a.dtype:
                raise InputValidationError(
                    f"frozen input {name!r} is {arr.dtype.name}{list(arr.shape)}, "
                    f"expected {a.dtype.name}{list(a.shape)}"
                )
            frozen[name] = np.array(arr, copy=True, order="C")
        mains = [m.program(pid) for pid in m.program_flow.main]
        if len(mains) != 1 or mains[0].kind is not ProgramKind.MAIN:
            raise ApplicationRuntimeError(
                f"{self.spec.describe()}: expected exactly one main program, got {len(mains)}"
            )
        opts = session_options(self.spec, executable)
        self._custom_ops = bool(m.custom_ops)
        if self._custom_ops:
            # Kernels come from the allow-listed libraries of this process, never the file.
            from model_runtime.custom_ops import prepare_session

            prepare_session(opts, executable)
        payload = executable.program_payload(mains[0])
        constants = _constant_weights(executable, payload, frozen, self.spec.describe())
        strings = {n: v for n, v in constants.items() if v.dtype.kind == "O"}
        if strings:  # an OrtValue holds no strings: they go back into the graph itself
            payload = _with_strings(payload, strings, self.spec.describe())
            constants = {n: v for n, v in constants.items() if n not in strings}
        if constants:
            opts.add_external_initializers(
                list(constants), [ort.OrtValue.ortvalue_from_numpy(v) for v in constants.values()]
            )
        try:
            session = ort.InferenceSession(payload, opts, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own (untyped) exception classes
            raise ApplicationRuntimeError(
                f"{self.spec.describe()}: onnxruntime rejected main program "
                f"{mains[0].name!r}: {exc}"
            ) from exc
        graph_inputs = {i.name for i in session.get_inputs()}
        self._output_names = [o.name for o in session.get_outputs()]
        out_index = {n: i for i, n in enumerate(self._output_names)}
        user_outputs = []
        for a in m.user_outputs:
            if a.handle in out_index:
                user_outputs.append((out_index[a.handle], a.name))
        updates = []
        user_output_names = {a.name for a in m.user_outputs}
        for out, var in m.output_to_variable.items():
            o, v = m.anchor(out), m.anchor(var)
            if o.handle in out_index:
                updates.append((out_index[o.handle], v.handle, out in user_output_names))
        # Smaller batches the program runs too (its batch dimension is symbolic), along
        # axis 0 of every user input; the full batch is checked as before.
        self._buckets = frozenset(m.run_sizes[:-1])
        self._inputs = tuple(
            (a.name, a.handle, a.shape, a.dtype)
            for a in m.user_inputs
            if a.name not in frozen and a.handle in graph_inputs
        )
        self._outputs = tuple(user_outputs)
        self._str_inputs = tuple((n, h) for n, h, _, dt in self._inputs if dt.kind == "O")
        self._str_outputs = frozenset(
            i for i, o in enumerate(session.get_outputs()) if o.type == "tensor(string)"
        )
        self._strings = bool(self._str_inputs or self._str_outputs)
        self._updates = tuple(updates)
        self._variables = m.variables
        self._session = session
        self._constants = list(constants.values())
        self._exe = executable
        self._frozen = frozen
        self.run_load()

    def run_load(self) -> None:
        """See :meth:`Backend.run_load`.

        Raises:
            DeviceStateError: nothing loaded.
        """
        exe = self._require()
        m = exe.metadata
        graph_inputs = {i.name for i in self._session.get_inputs()}
        feed: dict[str, np.ndarray] = {}
        for a in (*m.weights, *m.variables, *m.user_inputs):
            if a.handle not in graph_inputs:
                continue
            if a.name in self._frozen:
                # a private copy: variables are replaced, never written in place, but a caller
                # must never see device state change under its feet
                feed[a.handle] = self._frozen[a.name].copy()
            elif a.role is not AnchorRole.USER_INPUT:
                feed[a.handle] = np.array(exe.tensor(a.name), copy=True, order="C")
        self._feed = feed
        with self._lock:
            self._run_options = ort.RunOptions()
            self._terminated = False

    # -- run -------------------------------------------------------------------------------

    def run_main(
        self,
        batches: Sequence[Mapping[str, np.ndarray]],
        into: Sequence[Mapping[str, np.ndarray]] | None = None,
    ) -> list[dict[str, np.ndarray]]:
        """See :meth:`Backend.run_main`. Outputs given ``into`` are written there by
        onnxruntime itself (IOBinding): no copy; others are fresh arrays.

        Raises:
            DeviceStateError: nothing loaded, or the run was aborted (:class:`RunAborted`).
            InputValidationError: wrong number of batches, a missing or mis-shaped input.
            ApplicationRuntimeError: onnxruntime failed while running.
        """
        exe = self._require()
        iterations = exe.metadata.device_iterations
        if len(batches) != iterations:
            raise InputValidationError(
                f"run_main: {len(batches)} batches given, the executable runs {iterations} "
                "device iterations per main run"
            )
        feed = self._feed
        session = self._session
        names = self._output_names
        outputs: list[dict[str, np.ndarray]] = []
        # One RunOptions per load: terminate() raises its flag, and every run after that fails
        # until the next load (a read of a flag here; the worker thread is the only writer
        # besides terminate()).
        run_options = self._run_options
        if self._terminated:
            raise RunAborted(f"{self.spec.describe()}: run aborted (terminated)")
        try:
            for k, batch in enumerate(batches):
                for name, handle, shape, dtype in self._inputs:
                    try:
                        arr = batch[name]
                    except KeyError:
                        raise InputValidationError(f"run_main: input {name!r} missing") from None
                    if (arr.shape != shape or arr.dtype != dtype) and not self._fits(
                        arr, shape, dtype
                    ):
                        raise InputValidationError(
                            f"run_main: input {name!r} is {arr.dtype.name}{list(arr.shape)}, "
                            f"expected {dtype.name}{list(shape)}"
                        )
                    feed[handle] = arr
                dest = into[k] if into is not None else None
                if self._strings:
                    for name, handle in self._str_inputs:
                        feed[handle] = to_str_array(feed[handle], name)
                    dest = None  # IOBinding does not bind object arrays
                try:
                    if dest:
                        result = self._run_into(feed, dest, run_options)
                    else:
                        result = session.run(names, feed, run_options)
                except _OrtInvalidArgument as exc:
                    raise InputValidationError(f"run_main: onnxruntime: {exc}") from exc
                except Exception as exc:  # Fail, RuntimeException...: untyped in onnxruntime
                    if self._terminated:
                        raise RunAborted(f"{self.spec.describe()}: run aborted") from exc
                    if self._custom_ops:  # a kernel's own failure says which op and why
                        _check_custom_ops(self.spec.describe())
                    raise ApplicationRuntimeError(
                        f"{self.spec.describe()}: main program failed: {exc}"
                    ) from exc
                if self._custom_ops:
                    _check_custom_ops(self.spec.describe())
                if self._str_outputs:
                    result = [
                        to_bytes_array(v) if i in self._str_outputs else v
                        for i, v in enumerate(result)
                    ]
                for index, handle, copy in self._updates:
                    value = result[index]
                    feed[handle] = value.copy() if copy else value
                outputs.append({name: result[i] for i, name in self._outputs})
        finally:
            for _, handle, _, _ in self._inputs:
                feed.pop(handle, None)  # do not keep the caller's arrays alive
        return outputs

    def _fits(self, arr: np.ndarray, shape: tuple[int, ...], dtype: np.dtype[Any]) -> bool:
        """``arr`` is a batch the program runs although not the anchor's exact shape: a smaller
        bucket along axis 0, any size along a dynamic dimension (-1)."""
        if arr.dtype != dtype or arr.ndim != len(shape) or not shape:
            return False
        if arr.shape[0] != shape[0] and arr.shape[0] not in self._buckets:
            return False
        return all(w < 0 or d == w for d, w in zip(arr.shape[1:], shape[1:], strict=True))

    def _run_into(
        self,
        feed: Mapping[str, np.ndarray],
        dest: Mapping[str, np.ndarray],
        run_options: ort.RunOptions,
    ) -> list[np.ndarray]:
        """One run with the outputs named in ``dest`` written to its arrays (IOBinding)."""
        binding = self._session.io_binding()
        for handle, arr in feed.items():
            binding.bind_cpu_input(handle, arr)
        bound: dict[int, np.ndarray] = {}
        for i, name in self._outputs:
            buffer = dest.get(name)
            if buffer is not None:
                bound[i] = buffer
        for i, handle in enumerate(self._output_names):
            buffer = bound.get(i)
            if buffer is None:
                binding.bind_output(handle, "cpu")
            else:
                binding.bind_output(
                    handle, "cpu", 0, buffer.dtype, list(buffer.shape), buffer.ctypes.data
                )
        self._session.run_with_iobinding(binding, run_options)
        values = binding.get_outputs()
        return [bound[i] if i in bound else values[i].numpy() for i in range(len(values))]

    def run_save(self) -> dict[str, np.ndarray]:
        """See :meth:`Backend.run_save`.

        Raises:
            DeviceStateError: nothing loaded.
        """
        self._require()
        return {
            a.name: self._feed[a.handle].copy() for a in self._variables if a.handle in self._feed
        }

    def reset(self) -> None:
        """See :meth:`Backend.reset` (variables back to initial or frozen values).

        Raises:
            DeviceStateError: nothing loaded.
        """
        self.run_load()

    def restore_variables(self, values: Mapping[str, np.ndarray]) -> None:
        """See :meth:`Backend.restore_variables`.

        Raises:
            DeviceStateError: nothing loaded.
            InputValidationError: an unknown variable or a wrong shape/dtype.
        """
        self._require()
        by_name = {a.name: a for a in self._variables}
        staged: dict[str, np.ndarray] = {}
        for name, value in values.items():
            a = by_name.get(name)
            if a is None:
                raise InputValidationError(f"restore_variables: {name!r} is not a variable")
            arr = np.asarray(value)
            if arr.shape != a.shape or arr.dtype != a.dtype:
                raise InputValidationError(
                    f"restore_variables: {name!r} is {arr.dtype.name}{list(arr.shape)}, "
                    f"expected {a.dtype.name}{list(a.shape)}"
                )
            staged[a.handle] = np.array(arr, copy=True, order="C")
        self._feed.update(staged)

    def unload(self) -> None:
        """See :meth:`Backend.unload`."""
        self._exe = None
        self._session = None
        self._constants = []
        self._feed = {}
        self._frozen = {}

    def terminate(self) -> None:
        """See :meth:`Backend.terminate`: the in-flight ``session.run`` stops early."""
        with self._lock:
            self._terminated = True
            if self._run_options is not None:  # the run under way stops; later ones refuse
                self._run_options.terminate = True

    def _require(self) -> Executable:
        if self._exe is None:
            raise DeviceStateError(f"{self.spec.describe()}: no executable loaded")
        return self._exe


def _constant_weights(
    executable: Executable, payload: bytes, frozen: Mapping[str, np.ndarray], device: str
) -> dict[str, np.ndarray]:
    """Initializer name -> owned array, for every weight the main program keeps as an
    initializer (its frozen value where one is given): what onnxruntime must be handed.

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
        return {}
    by_handle = {a.handle: a for a in executable.metadata.weights}
    constants: dict[str, np.ndarray] = {}
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
    return constants


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


def _check_custom_ops(device: str) -> None:
    """Raise a custom op kernel's failure on this thread's last run, if there was one."""
    from model_runtime.custom_ops import check_run

    check_run(device)

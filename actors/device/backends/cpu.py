"""The ``cpu`` backend: onnxruntime's CPU execution provider, a fixed number of intra-op threads.

The session that runs the main program, its options and how its weights reach onnxruntime are
:mod:`.ort_sessions`' (one session per executable and options, shared by every device that runs
it). Executables whose main program takes weights as graph inputs (compiled before weights
became session constants, or built by hand) still load: those weights are fed like variables.

"Device memory" for the rest is a feed dict built once at load: variables (and weights that are
graph inputs) as owned, contiguous arrays, keyed by graph input name. A run adds only the user
inputs and calls ``session.run``; onnxruntime wraps contiguous numpy inputs without copying, and
its outputs are fresh arrays. (Measured on the 2-core machine, tiny model: ``run`` with a dict
13 µs; IOBinding with pre-bound OrtValues 44-53 µs, and its ``get_outputs`` reuses output memory
between runs. So the plain feed is both the faster and the safer way to keep state "on device".)
Everything a device changes is its own: the feed, and the ``RunOptions`` that
:meth:`CpuBackend.terminate` raises, so a reset of one device never touches another's runs on a
shared session.

String tensors (``bytes`` anchors) are numpy object arrays of ``bytes`` everywhere in the
runtime; onnxruntime's Python binding takes ``str`` (it would write a ``bytes`` object as its
``repr``) and returns ``str``, so a model with string inputs or outputs has them decoded from
and encoded to UTF-8 here, per run (models without strings skip this).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime as ort

from actors.device.backends.ort_sessions import OrtSession, open_session
from actors.device.inventory import DeviceSpec
from model_runtime.errors import ApplicationRuntimeError, DeviceStateError, InputValidationError
from model_runtime.executable.model import Anchor, AnchorRole, ProgramKind

if TYPE_CHECKING:
    from model_runtime.executable import Executable

__all__ = ["CpuBackend", "RunAborted"]

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


class CpuBackend:
    """Runs an executable's main program with onnxruntime on the CPU (see module docstring)."""

    kind = "cpu"

    def __init__(self, spec: DeviceSpec) -> None:
        self._custom_ops = False
        self.spec = spec
        self._exe: Executable | None = None
        self._frozen: dict[str, np.ndarray] = {}
        self._shared: OrtSession | None = None  # the session and what it was built from
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

    @property
    def ort_session(self) -> OrtSession | None:
        """The onnxruntime session this device runs (shared with other devices where its
        ``key`` is not None), or None when nothing is loaded."""
        return self._shared

    def memory(self) -> dict[str, int]:
        """Bytes this device adds to the process beside what it shares: ``session``, the
        build of a session of its own (0 when it runs a shared one, counted by the model:
        .ort_sessions), and ``state``, its variables and fed weights."""
        shared = self._shared
        own = shared.built_bytes if shared is not None and shared.key is None else 0
        return {"session": own, "state": sum(v.nbytes for v in self._feed.values())}

    # -- load ------------------------------------------------------------------------------

    def load(self, executable: Executable, frozen_inputs: Mapping[str, np.ndarray] | None) -> None:
        """See :meth:`Backend.load`.

        Raises:
            InputValidationError: a frozen input names no anchor or has the wrong shape/dtype.
            ApplicationRuntimeError: onnxruntime cannot build a session from the main program.
            ConfigurationError: ``MODEL_RUNTIME_ORT_SPINNING`` is malformed.
        """
        m = executable.metadata
        # The new session is opened before the old one is let go, so a reset reloads onto the
        # session it had (.ort_sessions); a load that fails leaves nothing loaded.
        try:
            frozen = _checked_frozen(executable, frozen_inputs)
            mains = [m.program(pid) for pid in m.program_flow.main]
            if len(mains) != 1 or mains[0].kind is not ProgramKind.MAIN:
                raise ApplicationRuntimeError(
                    f"{self.spec.describe()}: expected exactly one main program, got {len(mains)}"
                )
            shared = open_session(self.spec, executable, mains[0], frozen)
        finally:
            self.unload()
        self._custom_ops = bool(m.custom_ops)
        session = shared.session
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
        self._shared = shared
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
        bucket along axis 0, any size along a dynamic dimension (-1, axis 0 included: a model
        without a batch axis)."""
        if arr.dtype != dtype or arr.ndim != len(shape) or not shape:
            return False
        if shape[0] >= 0 and arr.shape[0] != shape[0] and arr.shape[0] not in self._buckets:
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
        self._shared = None
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


def _checked_frozen(
    executable: Executable, frozen_inputs: Mapping[str, np.ndarray] | None
) -> dict[str, np.ndarray]:
    """Owned, C-contiguous copies of ``frozen_inputs`` (anchor name -> array).

    Raises:
        InputValidationError: a frozen input names no anchor, an output, or has the wrong
            shape or dtype.
    """
    m = executable.metadata
    frozen: dict[str, np.ndarray] = {}
    for name, value in (frozen_inputs or {}).items():
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
    return frozen


def _check_custom_ops(device: str) -> None:
    """Raise a custom op kernel's failure on this thread's last run, if there was one."""
    from model_runtime.custom_ops import check_run

    check_run(device)

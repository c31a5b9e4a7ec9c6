"""The ``cpu`` backend: onnxruntime's CPU execution provider, a fixed number of intra-op threads.

"Device memory" is a feed dict built once at load: weights and variables as owned, contiguous
arrays, keyed by graph input name. A run adds only the user inputs and calls ``session.run``;
onnxruntime wraps contiguous numpy inputs without copying, and its outputs are fresh arrays.
(Measured on the 2-core machine, tiny model: ``run`` with a dict 13 µs; IOBinding with
pre-bound OrtValues 44-53 µs, and its ``get_outputs`` reuses output memory between runs. So the
plain feed is both the faster and the safer way to keep weights "on device".)
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime as ort

from actors.device.inventory import DeviceSpec
from model_runtime.errors import (
    ApplicationRuntimeError,
    DeviceStateError,
    InputValidationError,
)
from model_runtime.executable.model import Anchor, AnchorRole, ProgramKind

if TYPE_CHECKING:
    from model_runtime.executable import Executable

__all__ = ["CpuBackend", "RunAborted"]

try:  # onnxruntime's exception types live in its pybind module
    from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument as _OrtInvalidArgument
except ImportError:  # pragma: no cover
    _OrtInvalidArgument = ValueError


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
        self._session: Any = None
        self._feed: dict[str, np.ndarray] = {}
        self._inputs: tuple[tuple[str, str, tuple[int, ...], np.dtype[Any]], ...] = ()
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
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = max(1, self.spec.threads)
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # Fatal only: every run error is translated into ours (and logged by the session);
        # onnxruntime's own ERROR lines would go to stderr, past the application's logging.
        opts.log_severity_level = 4
        self._custom_ops = bool(m.custom_ops)
        if self._custom_ops:
            # Kernels come from the allow-listed libraries of this process, never the file.
            from model_runtime.custom_ops import prepare_session

            prepare_session(opts, executable)
        try:
            session = ort.InferenceSession(
                executable.program_payload(mains[0]), opts, providers=["CPUExecutionProvider"]
            )
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
        self._inputs = tuple(
            (a.name, a.handle, a.shape, a.dtype)
            for a in m.user_inputs
            if a.name not in frozen and a.handle in graph_inputs
        )
        self._outputs = tuple(user_outputs)
        self._updates = tuple(updates)
        self._variables = m.variables
        self._session = session
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
        run_options = ort.RunOptions()
        with self._lock:
            if self._terminated:
                raise RunAborted(f"{self.spec.describe()}: run aborted (terminated)")
            self._run_options = run_options
        try:
            for k, batch in enumerate(batches):
                for name, handle, shape, dtype in self._inputs:
                    try:
                        arr = batch[name]
                    except KeyError:
                        raise InputValidationError(f"run_main: input {name!r} missing") from None
                    if arr.shape != shape or arr.dtype != dtype:
                        raise InputValidationError(
                            f"run_main: input {name!r} is {arr.dtype.name}{list(arr.shape)}, "
                            f"expected {dtype.name}{list(shape)}"
                        )
                    feed[handle] = arr
                dest = into[k] if into is not None else None
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
                for index, handle, copy in self._updates:
                    value = result[index]
                    feed[handle] = value.copy() if copy else value
                outputs.append({name: result[i] for i, name in self._outputs})
        finally:
            for _, handle, _, _ in self._inputs:
                feed.pop(handle, None)  # do not keep the caller's arrays alive
            with self._lock:
                self._run_options = None
        return outputs

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
        self._feed = {}
        self._frozen = {}

    def terminate(self) -> None:
        """See :meth:`Backend.terminate`: the in-flight ``session.run`` stops early."""
        with self._lock:
            self._terminated = True
            if self._run_options is not None:
                self._run_options.terminate = True

    def _require(self) -> Executable:
        if self._exe is None:
            raise DeviceStateError(f"{self.spec.describe()}: no executable loaded")
        return self._exe


def _check_custom_ops(device: str) -> None:
    """Raise a custom op kernel's failure on this thread's last run, if there was one."""
    from model_runtime.custom_ops import check_run

    check_run(device)

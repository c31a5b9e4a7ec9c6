"""The ``ipu-model`` backend: a simulated IPU that checks memory, then computes on the CPU.

Its memory is ``num_ipus * tiles_per_ipu * memory_per_tile`` (Mk2: 1472 tiles of 624 KiB; Mk1:
1216 tiles of 256 KiB; the small model: 4 tiles). An executable needs its weights, its
variables and an estimate of its activations: the statically known sizes of every user input,
output and intermediate value of the main program (after ONNX shape inference), times the
device iterations' worth of user inputs and outputs. If that exceeds the memory, :meth:`load`
refuses with :class:`~model_runtime.errors.DeviceMemoryError` stating needed vs available.
Weights count once, from their anchors, whether the main program holds them as session
constants (compiled executables) or takes them as graph inputs (older ones); computing, and the
onnxruntime session options, are the cpu backend's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from actors.device.backends.cpu import CpuBackend
from actors.device.inventory import DeviceSpec
from model_runtime.errors import DeviceMemoryError, UnsupportedExecutableError
from model_runtime.executable.model import dynamic_dims

if TYPE_CHECKING:
    from model_runtime.executable import Executable

__all__ = ["IpuModelBackend", "estimate_memory"]


def _value_bytes(value: Any) -> int:
    from onnx import helper

    tt = value.type.tensor_type
    if not tt.elem_type or not tt.HasField("shape"):
        return 0
    n = 1
    for d in tt.shape.dim:
        if not d.HasField("dim_value"):
            return 0  # unknown size: not counted (the estimate is a lower bound there)
        n *= d.dim_value
    try:
        return n * np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)).itemsize
    except Exception:
        return 0


def estimate_memory(executable: Executable) -> dict[str, int]:
    """Bytes the executable needs on device: ``weights``, ``variables``, ``activations``, ``total``.

    Raises:
        nothing: a payload that does not parse counts no activations (load reports it later).
    """
    import onnx

    m = executable.metadata
    weights = sum(a.tensor_info.size_in_bytes for a in m.weights)
    variables = sum(a.tensor_info.size_in_bytes for a in m.variables)
    io = sum(a.tensor_info.size_in_bytes for a in (*m.user_inputs, *m.user_outputs))
    activations = io * max(1, m.device_iterations)
    for pid in m.program_flow.main:
        try:
            model = onnx.load_from_string(executable.program_payload(pid))
            inferred = onnx.shape_inference.infer_shapes(model)
        except Exception:
            continue
        activations += sum(_value_bytes(v) for v in inferred.graph.value_info)
    return {
        "weights": weights,
        "variables": variables,
        "activations": activations,
        "total": weights + variables + activations,
    }


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.2f} MiB"


class IpuModelBackend(CpuBackend):
    """A :class:`CpuBackend` that first checks the executable fits the simulated IPU."""

    kind = "ipu-model"

    def __init__(self, spec: DeviceSpec) -> None:
        super().__init__(spec)
        self.memory_estimate: dict[str, int] = {}

    def load(self, executable: Executable, frozen_inputs: Mapping[str, np.ndarray] | None) -> None:
        """Check memory, then load as the cpu backend does.

        Raises:
            UnsupportedExecutableError: the executable has dynamic dimensions.
            DeviceMemoryError: the executable needs more than the device's memory.
            InputValidationError / ApplicationRuntimeError: as :meth:`CpuBackend.load`.
        """
        dynamic = dynamic_dims(
            (*executable.metadata.user_inputs, *executable.metadata.user_outputs)
        )
        if dynamic:
            anchor, dim, name = dynamic[0]
            raise UnsupportedExecutableError(
                f"{self.spec.describe()}: executable {executable.metadata.model_name!r} has "
                f"dynamic dimensions ({anchor!r} dimension {dim}, {name!r}"
                + (f", and {len(dynamic) - 1} more" if len(dynamic) > 1 else "")
                + "); an IPU program is compiled for fixed shapes: compile the model with "
                "those dimensions fixed, or serve it on a cpu device"
            )
        need = estimate_memory(executable)
        have = self.spec.memory_bytes
        if need["total"] > have:
            raise DeviceMemoryError(
                f"{self.spec.describe()}: executable {executable.metadata.model_name!r} needs "
                f"{_mib(need['total'])} ({need['total']} bytes: weights {need['weights']}, "
                f"variables {need['variables']}, activations ~{need['activations']}) but the "
                f"device has {_mib(have)} ({have} bytes = {self.spec.num_ipus} x "
                f"{self.spec.tiles_per_ipu} tiles x {self.spec.memory_per_tile} bytes)"
            )
        self.memory_estimate = need
        super().load(executable, frozen_inputs)

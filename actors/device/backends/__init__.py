"""Device backends: ``cpu`` and ``ipu-model`` (a new kind is one more module here)."""

from __future__ import annotations

from actors.device.backends.base import Backend
from actors.device.backends.cpu import CpuBackend, RunAborted
from actors.device.backends.ipu_model import IpuModelBackend, estimate_memory
from actors.device.inventory import DeviceSpec
from model_runtime.errors import ConfigurationError

__all__ = [
    "Backend",
    "CpuBackend",
    "IpuModelBackend",
    "RunAborted",
    "create_backend",
    "estimate_memory",
    "make_backend",
]


def make_backend(spec: DeviceSpec) -> Backend:
    """The backend for ``spec.kind``.

    Raises:
        ConfigurationError: an unknown device kind.
    """
    if spec.kind == "cpu":
        return CpuBackend(spec)
    if spec.kind == "ipu-model":
        return IpuModelBackend(spec)
    raise ConfigurationError(f"no backend for device kind {spec.kind!r}")


#: Alias (the name the runner first used).
create_backend = make_backend

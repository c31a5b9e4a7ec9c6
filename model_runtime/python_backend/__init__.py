"""Python models as Triton's python backend runs them: each instance in a process of its own.

Child side (runs in the instance process, imports only numpy): :mod:`.stub`, :mod:`.stub_model`,
:mod:`.pb_utils` (``triton_python_backend_utils``), :mod:`.wire`, :mod:`.arena`, :mod:`.dtypes`.
Daemon side: :mod:`.instance` (one instance process), :mod:`.runner` (a model's runner).
This module imports nothing eagerly, so that the instance process stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from model_runtime.python_backend.instance import InstanceProcess as InstanceProcess
    from model_runtime.python_backend.messages import (
        PyRequest as PyRequest,
        PyResponse as PyResponse,
    )

__all__ = ["InstanceProcess", "PyRequest", "PyResponse"]

_LAZY = {
    "InstanceProcess": "model_runtime.python_backend.instance",
    "PyRequest": "model_runtime.python_backend.messages",
    "PyResponse": "model_runtime.python_backend.messages",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)

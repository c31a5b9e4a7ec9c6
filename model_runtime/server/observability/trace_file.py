"""Triton's JSON trace file (``--trace-config triton,file=PATH``).

Each trace is the objects Triton writes for it: ``{"id", "model_name", "model_version"[,
"request_id"]}`` then one ``{"id", "timestamps": [{"name", "ns"}]}`` per timestamp. With
``log-frequency`` 0 every trace is appended to ``PATH`` at once, and the file is a complete
JSON array after each write (its closing bracket rewritten). With ``log-frequency`` N, traces
wait until N are collected, or their setting's ``trace_count`` is spent, or the setting is
replaced or the daemon stops, and are then written as one array to ``PATH.<index>`` (0, 1,
...), as Triton does.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import orjson
import structlog

from model_runtime.server.observability.trace_record import RequestTrace, ordered_stamps
from model_runtime.server.tensors.datatypes import datatype_of

__all__ = ["TraceFile", "trace_objects"]

log = structlog.get_logger(__name__)


def trace_objects(trace: RequestTrace) -> list[dict[str, Any]]:
    """The JSON objects of one trace, in Triton's format."""
    head: dict[str, Any] = {
        "id": trace.id,
        "model_name": trace.model,
        "model_version": int(trace.version) if trace.version.isdigit() else -1,
    }
    if trace.request_id:
        head["request_id"] = trace.request_id
    return (
        [head]
        + [
            {"id": trace.id, "timestamps": [{"name": name, "ns": ns}]}
            for name, ns in ordered_stamps(trace)
        ]
        + [
            {"id": trace.id, "activity": activity, "tensor": _tensor(name, array)}
            for activity, name, array in trace.tensor_records
        ]
    )


def _tensor(name: str, array: Any) -> dict[str, str]:
    """A tensor as Triton's trace writes it: data and shape as comma-separated text."""
    a = np.asarray(array)
    if a.dtype == object:
        data = ",".join(v.decode(errors="replace") if isinstance(v, bytes) else str(v)
                        for v in a.ravel())  # fmt: skip
    else:
        data = ",".join(map(str, a.ravel().tolist()))
    return {
        "name": name,
        "data": data,
        "shape": ",".join(map(str, a.shape)),
        "dtype": datatype_of(a.dtype),
    }


class TraceFile:
    """The trace file at ``path`` (``""``: traces are dropped, as Triton without a file)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._waiting: list[dict[str, Any]] = []
        self._index = 0
        self._started = False
        self._count = 0  # traces waiting

    def add(self, trace: RequestTrace, log_frequency: int, spent: bool) -> None:
        """Write ``trace`` now, or keep it for its batch (see the module docstring)."""
        if not self.path:
            return
        objects = trace_objects(trace)
        try:
            if log_frequency == 0:
                self._append(objects)
                return
            self._waiting += objects
            self._count += 1
            if self._count >= log_frequency or spent:
                self.flush()
        except OSError as exc:
            log.error("trace_file_failed", path=self.path, error=str(exc))

    def _append(self, objects: list[dict[str, Any]]) -> None:
        body = b",".join(orjson.dumps(o) for o in objects)
        if not self._started:
            with open(self.path, "wb") as f:
                f.write(b"[" + body + b"]")
            self._started = True
            return
        with open(self.path, "r+b") as f:
            f.seek(-1, os.SEEK_END)  # over the closing bracket
            f.write(b"," + body + b"]")

    def flush(self) -> None:
        """Write the traces that wait to the next indexed file."""
        if not self._waiting:
            return
        objects, self._waiting, self._count = self._waiting, [], 0
        name = f"{self.path}.{self._index}"
        self._index += 1
        try:
            with open(name, "wb") as f:
                f.write(orjson.dumps(objects))
        except OSError as exc:
            log.error("trace_file_failed", path=name, error=str(exc))

"""The one connection between Triton's Python API and the instance process it runs in.

The instance process installs its :class:`Bridge` before it imports a model; the API's calls
that need the daemon (responses, BLS, logs, metrics, model loading) go through :func:`bridge`.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Protocol

__all__ = ["Bridge", "TritonModelException", "bridge", "install"]


class TritonModelException(Exception):
    """What a model raises to fail (Triton's name); the API raises it for misuse too."""


class Bridge(Protocol):
    """What the API needs of the instance process it runs in. The API's own objects cross it
    untyped here (``pb_utils`` sits above this module): ``response`` is an
    ``InferenceResponse`` or None, ``request`` an ``InferenceRequest``; ``bls`` resolves to an
    ``InferenceResponse``, ``bls_stream`` is a ``ResponseIterator``."""

    def send(self, key: int, response: Any, flags: int) -> None: ...
    def cancelled(self, key: int) -> bool: ...
    def bls(self, request: Any) -> Future[Any]: ...
    def bls_stream(self, request: Any) -> Any: ...
    def call(self, op: str, args: dict[str, Any]) -> Any: ...
    def log(self, level: str, message: str) -> None: ...
    def metric(self, op: dict[str, Any]) -> None: ...


_bridge: Bridge | None = None


def install(value: Bridge | None) -> None:
    """Connect the API to the instance process (the instance process calls this once)."""
    global _bridge
    _bridge = value


def bridge() -> Bridge:
    """Raises: TritonModelException: not inside an instance process."""
    if _bridge is None:
        raise TritonModelException("this call works only inside a python model's instance")
    return _bridge

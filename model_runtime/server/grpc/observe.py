"""Triton's logging and trace extensions over gRPC (``LogSettings``, ``TraceSetting``): the
same settings and rules as over HTTP (:mod:`~model_runtime.server.observability.logging_ext`,
:mod:`~model_runtime.server.observability.trace`), in the service's messages."""

from __future__ import annotations

from typing import Any

from model_runtime.server.answers import Code, HTTPError
from model_runtime.server.inference.plane import DataPlane
from model_runtime.server.observability.logging_ext import LOG_SETTINGS
from model_runtime.server.triton import grpc_service_pb2 as pb

__all__ = ["log_settings", "trace_setting", "traceparent_of"]


def log_settings(request: Any) -> Any:
    """Answer a ``LogSettingsRequest`` (its settings applied first).

    Raises:
        HTTPError: what the logging extension refuses (Triton's texts and codes).
    """
    doc = (
        LOG_SETTINGS.update_grpc(request.settings) if request.settings else LOG_SETTINGS.settings()
    )
    response = pb.LogSettingsResponse()
    for key, value in doc.items():
        setting = response.settings[key]
        if isinstance(value, bool):
            setting.bool_param = value
        elif isinstance(value, int):
            setting.uint32_param = value
        else:
            setting.string_param = value
    return response


def trace_setting(plane: DataPlane, request: Any) -> Any:
    """Answer a ``TraceSettingRequest`` (its settings applied first) for its model (empty:
    the global setting).

    Raises:
        HTTPError: a model that is not ready (``Request for unknown model : NAME``), or what
            the trace extension refuses (Triton's texts and codes).
    """
    model = request.model_name or None
    if model is not None:
        try:
            ready = plane.entry(model).is_ready
        except Exception:
            ready = False
        if not ready:
            raise HTTPError.triton(
                Code.INVALID_ARG, f"Request for unknown model : {model}", "unknown_model"
            )
    tracer = plane.tracer
    if request.settings:
        doc = tracer.update_grpc(model, request.settings)
    else:
        doc = tracer.settings(model)
    response = pb.TraceSettingResponse()
    for key, value in doc.items():
        response.settings[key].value.extend(value if isinstance(value, list) else [value])
    return response


def traceparent_of(context: Any) -> str | None:
    """The call's W3C ``traceparent`` metadata (None: none)."""
    for key, value in context.invocation_metadata() or ():
        if key == "traceparent":
            return str(value)
    return None

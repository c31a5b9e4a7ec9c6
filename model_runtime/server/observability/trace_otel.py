"""Traces as OpenTelemetry spans, exported with the OpenTelemetry SDK over OTLP/HTTP.

As Triton's OpenTelemetry mode: a root span ``InferRequest`` (request taken -> answer
encoded), a child span named after the model (``REQUEST_START`` -> ``REQUEST_END``, with the
timestamps as events and the attributes ``triton.model_name``, ``triton.model_version``,
``triton.trace_id``, ``triton.trace_parent_id``, ``triton.request_id``) and its child
``compute`` (``COMPUTE_START`` -> ``COMPUTE_END``) when the runner reported one. A request's
W3C ``traceparent`` makes the root span a child of the client's span (same trace id). The
spans go through the SDK's batch span processor (``bsp_*`` settings) to the OTLP/HTTP
exporter at ``url``; the daemon's own tracer provider, not the process-global one.
"""

from __future__ import annotations

import time

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from model_runtime.server.observability.trace_config import TraceConfig
from model_runtime.server.observability.trace_record import RequestTrace, ordered_stamps

__all__ = ["OtelSink"]

_BSP = {
    "bsp_max_queue_size": "max_queue_size",
    "bsp_schedule_delay": "schedule_delay_millis",
    "bsp_max_export_batch_size": "max_export_batch_size",
}


class OtelSink:
    """Exports finished traces as spans (see the module docstring)."""

    def __init__(self, config: TraceConfig) -> None:
        attributes = {"service.name": "triton-inference-server", **config.resource}
        self._provider = TracerProvider(resource=Resource.create(attributes))
        processor = BatchSpanProcessor(
            OTLPSpanExporter(endpoint=config.url),
            **{_BSP[k]: v for k, v in config.bsp.items()},  # type: ignore[arg-type]
        )
        self._provider.add_span_processor(processor)
        self._tracer = self._provider.get_tracer("triton-server")
        self._propagator = TraceContextTextMapPropagator()
        # Steady-clock stamps as wall-clock times (OpenTelemetry's times are the epoch's).
        self._offset = time.time_ns() - time.monotonic_ns()

    def emit(self, trace: RequestTrace) -> None:
        """Make and end the trace's spans (exported in the background)."""
        at = {name: ns + self._offset for name, ns in ordered_stamps(trace)}
        parent = None
        if trace.traceparent:
            parent = self._propagator.extract({"traceparent": trace.traceparent})
        start, end = at["REQUEST_START"], at["REQUEST_END"]
        root = self._tracer.start_span(
            "InferRequest", context=parent, kind=SpanKind.SERVER, start_time=start
        )
        model = self._tracer.start_span(
            trace.model,
            context=set_span_in_context(root),
            kind=SpanKind.SERVER,
            start_time=start,
            attributes={
                "triton.model_name": trace.model,
                "triton.model_version": int(trace.version) if trace.version.isdigit() else -1,
                "triton.trace_id": trace.id,
                "triton.trace_parent_id": 0,
                **({"triton.request_id": trace.request_id} if trace.request_id else {}),
            },
        )
        for name in ("REQUEST_START", "QUEUE_START"):
            if name in at:
                model.add_event(name, timestamp=at[name])
        if "COMPUTE_START" in at:
            compute = self._tracer.start_span(
                "compute",
                context=set_span_in_context(model),
                kind=SpanKind.SERVER,
                start_time=at["COMPUTE_START"],
            )
            for name in ("COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START"):
                compute.add_event(name, timestamp=at[name])
            compute.add_event("COMPUTE_END", timestamp=at["COMPUTE_END"])
            compute.end(end_time=at["COMPUTE_END"])
        model.add_event("REQUEST_END", timestamp=end)
        model.end(end_time=end)
        root.end(end_time=end)

    def close(self) -> None:
        """Export what waits and stop."""
        self._provider.shutdown()

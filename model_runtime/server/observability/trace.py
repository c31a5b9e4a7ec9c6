"""Triton's trace extension: which requests are traced, their timestamps, and where they go.

:class:`Tracer` holds the global trace settings (from ``--trace-config``,
:mod:`.trace_config`) and each model's own, changed at run time as Triton's
``/v2/trace/setting`` and gRPC ``TraceSetting`` change them: a model's setting overrides the
global one field by field, a cleared (``null``) field falls back to it, and a cleared global
field goes back to its start-up value. :meth:`Tracer.start` samples a request (every
``trace_rate``-th request of its setting, while ``trace_count`` is not spent; -1: no limit)
and gives it a :class:`RequestTrace`, or None. With every setting OFF, :attr:`Tracer.active` is
False and nothing else is looked at.

A trace collects Triton's timestamps (steady clock nanoseconds: ``time.monotonic``, the clock
of the runtime's queues): ``REQUEST_START`` (the data plane took the request),
``QUEUE_START`` (handed to the runner), ``COMPUTE_START`` / ``COMPUTE_INPUT_END`` (its batch's
run started, inputs already in the batch), ``COMPUTE_OUTPUT_START`` (the run ended),
``COMPUTE_END`` (its outputs given back) — the last four from the runner's queue
(:mod:`actors.queues.tracing`), for ONNX models — and ``REQUEST_END`` (its answer encoded).
In ``triton`` mode each trace is written to ``trace_file`` in Triton's JSON trace format
(:mod:`.trace_file`); in ``opentelemetry`` mode it becomes spans (:mod:`.trace_otel`).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from actors.queues.tracing import STATE
from model_runtime.server.answers import Code, HTTPError
from model_runtime.server.observability.trace_config import LEVELS, TraceConfig
from model_runtime.server.observability.trace_file import TraceFile
from model_runtime.server.observability.trace_record import (
    RequestTrace,
    ScopeSetting,
    SettingValues,
    TraceSink,
)

__all__ = ["Tracer"]

_FIELDS = ("trace_level", "trace_rate", "trace_count", "log_frequency")
_U32 = 2**32 - 1
_I32 = 2**31 - 1


class Tracer:
    """The daemon's trace settings and sampling (see the module docstring); ``sink``: where
    traces go (None: made from ``config`` when first needed)."""

    def __init__(self, config: TraceConfig | None = None, sink: TraceSink | None = None) -> None:
        self.config = config or TraceConfig()
        self._start = SettingValues(
            self.config.level, self.config.rate, self.config.count, self.config.log_frequency
        )
        self._global_given: dict[str, Any] = {}
        self._model_given: dict[str, dict[str, Any]] = {}
        self._global = ScopeSetting(self._start, self.reads_headers)
        self._models: dict[str, ScopeSetting] = {}
        self._ids = itertools.count(1)
        self._file = TraceFile(self.config.file) if self.config.mode == "triton" else None
        self._sink = sink
        #: False: no setting traces anything (the one check on the request path).
        self.active = False
        #: Traces begun and not finished.
        self.in_flight = 0
        #: ``active``, or a trace is still in flight (what finishing a request checks).
        self.watching = False
        self._refresh()

    @property
    def reads_headers(self) -> bool:
        """Whether requests' headers matter (``traceparent``, OpenTelemetry mode)."""
        return self.config.mode == "opentelemetry"

    def _refresh(self) -> None:
        self.active = self._global.on or any(s.on for s in self._models.values())
        self.watching = self.active or self.in_flight > 0
        STATE.on = self.watching

    # -- settings --------------------------------------------------------------------------------

    def settings(self, model: str | None = None) -> dict[str, Any]:
        """The setting of ``model`` (None: the global one), as Triton's HTTP API answers it:
        strings, ``trace_level`` a list."""
        setting = self._setting(model)
        v = setting.values
        doc: dict[str, Any] = {
            "trace_level": list(v.level) or ["OFF"],
            "trace_rate": str(v.rate),
            "trace_count": str(setting.count),
        }
        if self.config.mode == "triton":
            doc["log_frequency"] = str(v.log_frequency)
            doc["trace_file"] = self.config.file
        doc["trace_mode"] = self.config.mode
        if self.config.mode == "opentelemetry":
            doc["url"] = self.config.url
            for key, value in self.config.bsp.items():
                doc[key] = str(value)
        return doc

    def _setting(self, model: str | None) -> ScopeSetting:
        if model:
            return self._models.get(model, self._global)
        return self._global

    def update(self, model: str | None, given: Mapping[str, Any]) -> dict[str, Any]:
        """Apply checked values (``trace_level`` a tuple, the numbers ints, None: clear) to
        ``model``'s setting (None: the global one); its settings after."""
        own = self._model_given.setdefault(model, {}) if model else self._global_given
        for key, value in given.items():
            if value is None:
                own.pop(key, None)
            else:
                own[key] = value
        if not model:  # a model's update leaves the global counters as they are
            self._global = ScopeSetting(
                self._values(self._start, self._global_given), self.reads_headers
            )
        for name, fields in list(self._model_given.items()):
            if not fields:  # nothing of its own: the model follows the global setting
                del self._model_given[name]
                self._models.pop(name, None)
            elif name == model or not model:
                values = self._values(self._global.values, fields)
                self._models[name] = ScopeSetting(values, self.reads_headers)
        self._refresh()
        if self._file is not None:
            self._file.flush()  # what the replaced setting held back
        return self.settings(model)

    @staticmethod
    def _values(base: SettingValues, given: Mapping[str, Any]) -> SettingValues:
        return replace(
            base,
            level=given.get("trace_level", base.level),
            rate=given.get("trace_rate", base.rate),
            count=given.get("trace_count", base.count),
            log_frequency=given.get("log_frequency", base.log_frequency),
        )

    def update_json(self, model: str | None, doc: Any) -> dict[str, Any]:
        """Apply a ``POST .../trace/setting`` body (parsed JSON), Triton's rules and texts.

        Raises:
            HTTPError: ``trace_file`` given, or a value that does not parse; nothing changed.
        """
        if not isinstance(doc, dict):
            raise _bad("trace setting request must be a JSON object")
        if "trace_file" in doc:
            raise _file_refused()
        given: dict[str, Any] = {}
        if "trace_level" in doc:
            levels = doc["trace_level"]
            if levels is not None and not isinstance(levels, list):
                raise _bad("attempt to access JSON non-array as array for 'trace_level'")
            given["trace_level"] = None if levels is None else _levels(levels)
        for key in _FIELDS[1:]:
            if key in doc:
                value = doc[key]
                given[key] = None if value is None else _number(key, value)
        return self.update(model, given)

    def update_grpc(self, model: str | None, settings: Mapping[str, Any]) -> dict[str, Any]:
        """Apply a gRPC ``TraceSettingRequest``'s ``settings`` (each a list of strings; an
        empty list clears), Triton's rules and texts.

        Raises:
            HTTPError: ``trace_file`` given, or a value that does not parse; nothing changed.
        """
        if "trace_file" in settings:
            raise _file_refused()
        given: dict[str, Any] = {}
        if "trace_level" in settings:
            values = list(settings["trace_level"].value)
            given["trace_level"] = _levels(values) if values else None
        for key in _FIELDS[1:]:
            if key in settings:
                values = list(settings[key].value)
                if len(values) > 1:
                    raise _bad(f"expect only 1 value for '{key}'")
                given[key] = _number(key, values[0]) if values else None
        return self.update(model, given)

    # -- the request path ------------------------------------------------------------------------

    def start(
        self, model: str, version: str, request_id: str = "", traceparent: str | None = None
    ) -> RequestTrace | None:
        """A trace for a request of ``model``, if it is sampled (call only while
        :attr:`active`)."""
        setting = self._models.get(model, self._global)
        if not setting.sample(traceparent is not None):
            if not setting.on:
                self._refresh()
            return None
        self.in_flight += 1
        return RequestTrace(next(self._ids), model, version, request_id, setting, traceparent)

    def finish(self, trace: RequestTrace) -> None:
        """Stamp ``REQUEST_END`` and hand the trace on (written, or exported)."""
        trace.stamp("REQUEST_END")
        self.in_flight -= 1
        if not self.active:
            self._refresh()
        setting = trace.setting
        setting.collected += 1
        if self._file is not None:
            self._file.add(trace, setting.values.log_frequency, setting.count == 0)
        else:
            if self._sink is None:
                from model_runtime.server.observability.trace_otel import OtelSink

                self._sink = OtelSink(self.config)
            self._sink.emit(trace)

    def close(self) -> None:
        """Write what waits, and stop exporting (at the daemon's stop)."""
        if self._file is not None:
            self._file.flush()
        if self._sink is not None:
            self._sink.close()
        STATE.on = False


def _levels(values: list[Any]) -> tuple[str, ...]:
    if not all(isinstance(v, str) for v in values):
        raise _bad("attempt to access JSON non-string as string for 'trace_level'")
    if "OFF" in values:
        if len(values) != 1:
            raise _bad("Expect only one trace level 'OFF' is specified")
        return ()
    unknown = [v for v in values if v not in LEVELS]
    if unknown:
        raise _bad(f"unknown trace level {unknown[0]!r} (OFF, TIMESTAMPS, TENSORS)")
    return tuple(lv for lv in LEVELS if lv in values)


def _number(key: str, value: Any) -> int:
    """A setting's number from its string (Triton's texts for what does not parse)."""
    text = value if isinstance(value, str) else str(value)
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise _bad(f"attempt to access JSON non-string as string for '{key}'")
    try:
        number = int(text)
    except ValueError:
        raise _bad(f"Unable to parse '{key}', got: {text}") from None
    if key == "trace_count":
        if number < -1:
            raise _bad(f"Unable to parse 'trace_count'. Expecting value >= -1, got: {text}")
        if number > _I32:
            raise _bad(
                f"Unable to parse 'trace_count', value is out of range [ -1, {_I32} ], got: {text}"
            )
    elif not 0 <= number <= _U32:
        raise _bad(f"Unable to parse '{key}', value is out of range [ 0, {_U32} ], got: {text}")
    return number


def _bad(message: str) -> HTTPError:
    return HTTPError.triton(Code.INVALID_ARG, message, "bad_request")


def _file_refused() -> HTTPError:
    return HTTPError.triton(
        Code.UNSUPPORTED,
        "trace file location can not be updated through network protocol",
        "unsupported",
    )

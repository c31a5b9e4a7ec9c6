"""The trace extension's rules without a daemon: sampling by rate and count, a model's setting
over the global one, clearing, the trace context's forced sample (OpenTelemetry mode), the
switch the runtime's queues read, and Triton's trace file with ``log-frequency``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from actors.queues.tracing import STATE
from model_runtime.server.answers import HTTPError
from model_runtime.server.observability.trace import Tracer
from model_runtime.server.observability.trace_config import TraceConfig, parse_trace_config

pytestmark = pytest.mark.timeout(10)


def _traced(tracer: Tracer, n: int, model: str = "m", traceparent: str | None = None) -> list[int]:
    """Which of ``n`` requests were traced (1-based), each finished at once."""
    out = []
    for i in range(1, n + 1):
        trace = tracer.start(model, "1", traceparent=traceparent) if tracer.active else None
        if trace is not None:
            out.append(i)
            tracer.finish(trace)
    return out


def test_off_by_default_and_the_queues_switch_follows() -> None:
    tracer = Tracer()
    assert not tracer.active and not STATE.on
    tracer.update(None, {"trace_level": ("TIMESTAMPS",)})
    assert tracer.active and STATE.on
    tracer.update(None, {"trace_level": ()})
    assert not tracer.active and not STATE.on
    tracer.close()


def test_rate_and_count() -> None:
    tracer = Tracer(TraceConfig(level=("TIMESTAMPS",), rate=3, count=2))
    assert _traced(tracer, 10) == [3, 6]  # every 3rd, until two were traced
    assert tracer.settings()["trace_count"] == "0" and not tracer.active
    tracer.update(None, {"trace_count": None})  # back to the start-up value
    assert tracer.settings()["trace_count"] == "2"
    tracer.close()


def test_a_models_setting_overrides_field_by_field() -> None:
    tracer = Tracer(TraceConfig(level=("TIMESTAMPS",), rate=1))
    tracer.update("m", {"trace_rate": 2})
    assert _traced(tracer, 4, "m") == [2, 4]
    assert _traced(tracer, 2, "other") == [1, 2]  # the global setting
    tracer.update(None, {"trace_level": ("TIMESTAMPS", "TENSORS")})
    assert tracer.settings("m")["trace_level"] == ["TIMESTAMPS", "TENSORS"]  # falls back
    assert tracer.settings("m")["trace_rate"] == "2"  # its own
    tracer.update("m", {"trace_rate": None})
    assert tracer.settings("m") == tracer.settings()
    tracer.close()


def test_a_trace_context_forces_a_sample_in_opentelemetry_mode_only() -> None:
    ctx = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    otel = Tracer(TraceConfig(level=("TIMESTAMPS",), rate=0, mode="opentelemetry"), sink=_Sink())
    assert otel.active
    assert _traced(otel, 3) == []  # rate 0: none of its own choosing
    assert _traced(otel, 3, traceparent=ctx) == [1, 2, 3]
    triton = Tracer(TraceConfig(level=("TIMESTAMPS",), rate=0))
    assert not triton.active  # Triton's mode: rate 0 traces nothing
    otel.close()
    triton.close()


def test_refusals_change_nothing() -> None:
    tracer = Tracer(TraceConfig(level=("TIMESTAMPS",), rate=1))
    before = tracer.settings()
    for doc, said in [
        ({"trace_file": "x"}, "trace file location can not be updated"),
        ({"trace_rate": "1x"}, "Unable to parse 'trace_rate', got: 1x"),
        ({"trace_rate": "-1"}, "value is out of range [ 0, 4294967295 ], got: -1"),
        ({"trace_count": "-2"}, "Expecting value >= -1, got: -2"),
        ({"log_frequency": "9999999999"}, "out of range"),
        ({"trace_level": "TIMESTAMPS"}, "non-array"),
        ({"trace_level": ["OFF", "TENSORS"]}, "Expect only one trace level 'OFF'"),
        ({"trace_level": ["LOUD"]}, "unknown trace level 'LOUD'"),
    ]:
        with pytest.raises(HTTPError, match=said.replace("[", r"\[")):
            tracer.update_json(None, doc)
    assert tracer.settings() == before
    tracer.close()


def test_log_frequency_writes_indexed_files(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    tracer = Tracer(TraceConfig(level=("TIMESTAMPS",), rate=1, file=str(path), log_frequency=2))
    assert _traced(tracer, 5) == [1, 2, 3, 4, 5]
    assert not path.exists()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["trace.json.0", "trace.json.1"]  # two traces each; the 5th waits
    tracer.close()  # ... and is written at the stop
    assert sorted(p.name for p in tmp_path.iterdir())[-1] == "trace.json.2"
    first = json.loads((tmp_path / "trace.json.0").read_text())
    assert first[0] == {"id": 1, "model_name": "m", "model_version": 1}
    assert [o["id"] for o in first] == [1] * 3 + [2] * 3  # head, REQUEST_START, REQUEST_END


def test_trace_config_url_without_scheme_is_http() -> None:
    config = parse_trace_config(["opentelemetry,url=localhost:4318/v1/traces"])
    assert config.url == "http://localhost:4318/v1/traces"


class _Sink:
    def emit(self, trace: object) -> None:
        pass

    def close(self) -> None:
        pass

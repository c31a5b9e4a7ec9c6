"""Triton's logging extension on the real daemon (after Triton's qa/L0_logging): the log
settings read and changed over HTTP and gRPC, what a change does to the log, Triton's texts for
what is refused, and the ``logging`` API group's restriction."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.integration.test_daemon_support import (
    MODEL,
    Daemon,
    http,
    infer_doc,
    running,
    samples,
    start_daemon,
    stop_daemon,
)

grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = [pytest.mark.timeout(120)]

INITIAL = {
    "log_file": "",
    "log_info": True,
    "log_warning": True,
    "log_error": True,
    "log_verbose_level": 0,
    "log_format": "json",  # the harness starts the daemon with --log-format json
}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_daemon(tmp_path_factory.mktemp("logging"))
    try:
        yield d
    finally:
        stop_daemon(d)


@pytest.fixture(autouse=True)
def _reset(daemon: Daemon) -> Iterator[None]:
    yield
    reset = {k: v for k, v in INITIAL.items() if k != "log_file"}
    assert daemon.post("/v2/logging", reset) == (200, INITIAL)


def _infer(daemon: Daemon) -> None:
    pixels, _ = samples()
    assert daemon.post(f"/v2/models/{MODEL}/infer", infer_doc(pixels[:1]))[0] == 200


def _access_lines(daemon: Daemon) -> int:
    return sum(
        1
        for e in daemon.events()
        if e.get("event") == "http_request" and "infer" in str(e.get("path"))
    )


def test_http_settings_change_what_is_logged(daemon: Daemon) -> None:
    assert daemon.get("/v2/logging") == (200, INITIAL)
    assert "logging" in daemon.get("/v2")[1]["extensions"]
    _infer(daemon)
    before = _access_lines(daemon)
    assert before >= 1  # an access line at INFO per request
    status, doc = daemon.post("/v2/logging", {"log_info": False})
    assert (status, doc) == (200, INITIAL | {"log_info": False})
    _infer(daemon)
    _infer(daemon)
    assert _access_lines(daemon) == before  # INFO lines are off
    assert daemon.post("/v2/logging", {"log_info": True, "log_verbose_level": 2}) == (
        200,
        INITIAL | {"log_verbose_level": 2},
    )
    _infer(daemon)
    assert _access_lines(daemon) == before + 1  # on again
    assert daemon.post("/v2/logging", {"log_format": "ISO8601"})[1]["log_format"] == "ISO8601"
    after = INITIAL | {"log_verbose_level": 2, "log_format": "ISO8601"}
    assert daemon.post("/v2/logging", None) == (200, after)


def test_http_refusals_are_tritons(daemon: Daemon) -> None:
    expected = "log file location can not be updated through network protocol"
    assert daemon.post("/v2/logging", {"log_file": "x.log", "log_info": False}) == (
        501,
        {"error": expected},
    )
    status, doc = daemon.post("/v2/logging", {"log_info": "yes"})
    assert status == 400 and "non-boolean" in doc["error"]
    status, doc = daemon.post("/v2/logging", {"log_verbose_level": -1})
    assert status == 400 and "unsigned-integer" in doc["error"]
    assert daemon.post("/v2/logging", {"log_format": "fancy"}) == (
        503,
        {"error": "invalid argument for --log_format, got: fancy"},
    )
    assert daemon.get("/v2/logging") == (200, INITIAL)  # nothing changed


def test_grpc_settings(daemon: Daemon) -> None:
    with grpcclient.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}") as client:
        got = client.get_log_settings(as_json=True)["settings"]
        assert got["log_info"] == {"bool_param": True}
        assert got["log_file"] == {"string_param": ""}
        changed = client.update_log_settings({"log_warning": False, "log_verbose_level": 1},
                                             as_json=True)["settings"]  # fmt: skip
        assert changed["log_warning"] == {"bool_param": False}
        assert changed["log_verbose_level"] == {"uint32_param": 1}
        assert daemon.get("/v2/logging")[1]["log_warning"] is False  # one set of settings
        with pytest.raises(InferenceServerException, match="expect boolean for 'log_info'"):
            client.update_log_settings({"log_info": None})  # no value set
        with pytest.raises(InferenceServerException, match="can not be updated") as info:
            client.update_log_settings({"log_file": "x.log"})
        assert info.value.status() == "StatusCode.UNIMPLEMENTED"
        with pytest.raises(InferenceServerException, match="invalid argument for log_format"):
            client.update_log_settings({"log_format": "fancy"})


def test_logging_and_trace_groups_are_restricted(tmp_path: Path) -> None:
    # with qa/L0_logging's --log-error=false and --log-verbose=1 (the harness needs INFO lines
    # to find the ports: --log-info=false is a unit test's, tests/unit/test_triton_flags.py)
    with running(
        tmp_path,
        "--http-restricted-api=logging,trace:admin-key=s3cret",
        "--grpc-restricted-protocol=logging,trace:admin-key=s3cret",
        "--log-error=false",
        "--log-warning=false",
        "--log-verbose=1",
    ) as d:
        for path in ("/v2/logging", "/v2/trace/setting", f"/v2/models/{MODEL}/trace/setting"):
            status, doc = d.get(path)
            assert status == 403, (path, doc)
            assert doc == {"error": "This API is restricted, expecting header 'admin-key'"}
        status, doc = http_with(d, "/v2/logging", {"admin-key": "s3cret"})
        expected = INITIAL | {"log_error": False, "log_warning": False, "log_verbose_level": 1}
        assert (status, doc) == (200, expected)  # the flags are the settings at start
        assert http_with(d, "/v2/trace/setting", {"admin-key": "s3cret"})[0] == 200
        assert d.get("/v2/health/ready")[0] == 200  # other groups stay open
        with grpcclient.InferenceServerClient(f"127.0.0.1:{d.grpc_port}") as client:
            for call in (client.get_log_settings, client.get_trace_settings):
                with pytest.raises(InferenceServerException, match="expecting header") as info:
                    call()
                assert info.value.status() == str(grpc.StatusCode.UNAVAILABLE)
            headers = {"triton-grpc-protocol-admin-key": "s3cret"}
            assert client.get_log_settings(headers=headers) is not None
            assert client.get_trace_settings(headers=headers) is not None


def http_with(d: Daemon, path: str, headers: dict[str, str]) -> tuple[int, Any]:
    request = urllib.request.Request(d.url(path), headers=headers)
    with urllib.request.urlopen(request, timeout=10) as resp:
        return int(resp.status), json.loads(resp.read())


__all__ = ["http"]

"""``--reuse-port``: several daemons share one HTTP and one gRPC port (SO_REUSEPORT), the kernel
spreading connections over them; without it a port in use is an error."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient

from tests.integration.test_daemon_support import (
    MODEL,
    START_TIMEOUT,
    Daemon,
    start_daemon,
    stop_daemon,
    wait_for,
)

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(tmp_path: Path, name: str, ports: tuple[int, int], *args: str) -> Daemon:
    """A daemon on ``ports`` with device locks of its own (two daemons, two sets of devices),
    once it has loaded its model: its readiness cannot be asked through a shared port, which
    may answer from the other daemon."""
    run = tmp_path / name
    run.mkdir()
    http, grpc = ports
    daemon = start_daemon(
        run, "--port", str(http), "--grpc-port", str(grpc), *args,
        env={"MODEL_RUNTIME_DIR": str(run / "locks")}, wait_ready=False,
    )  # fmt: skip
    try:
        wait_for(
            lambda: any(e.get("event") == "model_loaded" for e in daemon.events()),
            START_TIMEOUT,
            f"daemon {name} to load its model",
        )
    except BaseException:
        stop_daemon(daemon)
        raise
    return daemon


def _answered(daemon: Daemon, path: str) -> int:
    return sum(
        1 for e in daemon.events() if e.get("event") == "http_request" and e.get("path") == path
    )


def test_two_daemons_share_one_port_and_both_serve(tmp_path: Path) -> None:
    ports = (_free_port(), _free_port())
    first = _start(tmp_path, "a", ports, "--reuse-port")
    try:
        second = _start(tmp_path, "b", ports, "--reuse-port")
        try:
            path = f"/v2/models/{MODEL}"
            for _ in range(40):  # each on a new connection: the kernel picks a daemon for each
                status, meta = first.get(path)
                assert status == 200 and meta["name"] == MODEL
            a, b = _answered(first, path), _answered(second, path)
            assert a + b == 40 and a and b, (a, b)  # both took connections (all: 2**-39)
            with grpcclient.InferenceServerClient(f"127.0.0.1:{ports[1]}") as client:
                assert client.is_model_ready(MODEL)
        finally:
            stop_daemon(second)
    finally:
        stop_daemon(first)


def test_without_it_a_port_in_use_is_an_error(tmp_path: Path) -> None:
    ports = (_free_port(), _free_port())
    first = _start(tmp_path, "a", ports, "--reuse-port")  # even a reusing first one
    try:
        with pytest.raises(AssertionError, match="address already in use"):
            _start(tmp_path, "b", ports)
    finally:
        stop_daemon(first)

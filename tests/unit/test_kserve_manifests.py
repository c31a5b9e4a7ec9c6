"""deploy/kserve/: the ServingRuntime runs the image's real entry point with real ``serve``
options on KServe's ports (HTTP 8080, gRPC 8081, models in /mnt/models), and the example
InferenceService names that runtime and a format it supports."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from actors.device.inventory import parse_devices
from model_runtime.server.daemon.options import add_serve_arguments, options_from_args

ROOT = Path(__file__).resolve().parents[2]
KSERVE = ROOT / "deploy" / "kserve"


def _load(name: str) -> dict[str, Any]:
    doc = yaml.safe_load((KSERVE / name).read_text())
    assert isinstance(doc, dict)
    return doc


def _entrypoint() -> list[str]:
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("ENTRYPOINT"):
            value: list[str] = json.loads(line.removeprefix("ENTRYPOINT"))
            return value
    raise AssertionError("the Dockerfile has no ENTRYPOINT")


def _container() -> dict[str, Any]:
    runtime = _load("servingruntime.yaml")
    assert runtime["kind"] == "ServingRuntime"
    (container,) = runtime["spec"]["containers"]
    assert container["name"] == "kserve-container"  # the name KServe merges the predictor into
    return dict(container)


def _parse(args: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="model-runtime serve", exit_on_error=False)
    add_serve_arguments(parser)
    try:
        return parser.parse_args(args)
    except (argparse.ArgumentError, SystemExit) as exc:
        pytest.fail(f"not `model-runtime serve` options: {args}: {exc}")


def test_runtime_runs_the_images_serve_command_with_real_options() -> None:
    container = _container()
    assert _entrypoint() == ["model-runtime", "serve"]
    assert "command" not in container  # keeps the image's entry point; args replace its CMD
    args = [str(a) for a in container["args"]]
    opts = options_from_args(_parse(args))  # validates values too
    assert opts.host == "0.0.0.0"
    assert opts.model_repository == Path("/mnt/models")  # KServe's storage initializer mount


def test_ports_are_kserves_and_the_daemons() -> None:
    container = _container()
    opts = options_from_args(_parse([str(a) for a in container["args"]]))
    assert (opts.port, opts.grpc_port) == (8080, 8081)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http1": opts.port}
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] == opts.port
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    annotations = _load("servingruntime.yaml")["metadata"]["annotations"]
    assert annotations["prometheus.kserve.io/port"] == str(opts.port)


def test_devices_match_the_cpu_limit() -> None:
    container = _container()
    env = {e["name"]: e["value"] for e in container["env"]}
    devices = parse_devices(env["MODEL_RUNTIME_DEVICES"])
    assert len(devices) == int(container["resources"]["limits"]["cpu"])


def test_inference_service_uses_the_runtime_over_v2() -> None:
    runtime = _load("servingruntime.yaml")
    service = _load("inferenceservice.yaml")
    assert service["kind"] == "InferenceService"
    model = service["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]
    formats = {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
    assert model["modelFormat"]["name"] in formats

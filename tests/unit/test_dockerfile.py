"""The Dockerfile runs the real daemon: its entry point is our console script's ``serve``,
every option it passes is one the ``serve`` parser knows (and parses to valid options), and it
exposes exactly the ports the daemon listens on. (The image itself is not built in CI.)"""

from __future__ import annotations

import argparse
import json
import shlex
import tomllib
from pathlib import Path

import pytest

from model_runtime.server.daemon.options import (
    DaemonOptions,
    add_serve_arguments,
    options_from_args,
)

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).resolve().parents[2]


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) for each instruction, continuation lines joined."""
    out: list[tuple[str, str]] = []
    logical = ""
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        stripped = line.strip()
        if not logical and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        logical += " " + stripped.removesuffix("\\")
        if not stripped.endswith("\\"):
            word, _, rest = logical.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
            logical = ""
    return out


def exec_form(instruction: str) -> list[str]:
    """The JSON (exec) form of the one ``instruction`` (ENTRYPOINT, CMD) in the Dockerfile."""
    found = [args for word, args in instructions() if word == instruction]
    assert len(found) == 1, f"expected one {instruction}, found {found}"
    value = json.loads(found[0])  # the shell form would run under /bin/sh and eat SIGTERM
    assert isinstance(value, list) and all(isinstance(v, str) for v in value)
    return value


def serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_serve_arguments(parser)
    return parser


def test_the_entry_point_is_the_console_scripts_serve() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    entry = exec_form("ENTRYPOINT")
    assert entry[:2] == ["model-runtime", "serve"]
    assert scripts[entry[0]] == "model_runtime.cli:main"


def test_every_option_is_a_real_serve_option_and_listens_in_the_container() -> None:
    args = exec_form("ENTRYPOINT")[2:] + exec_form("CMD")
    parser = serve_parser()
    known = {s for action in parser._actions for s in action.option_strings}
    flags = [a.split("=", 1)[0] for a in args if a.startswith("--")]
    assert flags, "the Dockerfile passes no options"
    assert set(flags) <= known, f"unknown option(s): {set(flags) - known}"
    opts = options_from_args(parser.parse_args(args))  # values valid, not only names
    assert opts.host == "0.0.0.0"  # 127.0.0.1, the default, would be unreachable from outside
    assert opts.model_repository == Path("/models")
    volumes = [json.loads(a) for w, a in instructions() if w == "VOLUME"]
    assert any("/models" in v for v in volumes)


def test_exposed_ports_are_the_daemons_ports() -> None:
    exposed = {
        int(port.split("/")[0])
        for word, rest in instructions()
        if word == "EXPOSE"
        for port in shlex.split(rest)
    }
    args = exec_form("ENTRYPOINT")[2:] + exec_form("CMD")
    opts = options_from_args(serve_parser().parse_args(args))
    defaults = DaemonOptions()
    # Metrics are served on the HTTP port (/metrics) and on Triton's metrics port.
    ports = {opts.port, opts.grpc_port, opts.triton.metrics_port}
    assert exposed == ports == {defaults.port, defaults.grpc_port, defaults.triton.metrics_port}

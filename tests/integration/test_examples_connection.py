"""Seed 004's test, ported: run examples/connection_type.py per connection type as a subprocess
and check its result and the order and counts of the ``Compiled`` / ``attached to`` log lines.
Plus seed 001: pre-compile where no device is free, then run from the same cache elsewhere.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from actors.device.locks import DeviceLock

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "connection_type.py"


def _env(tmp: Path, cache: Path | None = None, locks: str = "locks") -> dict[str, str]:
    env = dict(os.environ)
    env.pop("MODEL_RUNTIME_FLAGS", None)
    env.update(
        PYTHONPATH=str(ROOT),
        MODEL_RUNTIME_DIR=str(tmp / locks),  # a private "machine": no fight over device locks
        MODEL_RUNTIME_DEVICES="cpu:1x1",
    )
    if cache is not None:
        env["MODEL_RUNTIME_FLAGS"] = f"--executable_cache_path={cache}"
    return env


def _run(mode: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLE), "--connection_type", mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _events(stderr: str) -> list[str]:
    """The compile/attach events in order, as the seed's test reads them."""
    out = []
    for line in stderr.splitlines():
        if "Compiled" in line:
            out.append("compiled")
        elif "attached to" in line:
            out.append("attached")
    return out


@pytest.mark.parametrize(
    ("mode", "result", "events"),
    [
        ("ALWAYS", "[3.0, 8.0]", ["attached", "compiled"]),
        ("ON_DEMAND", "[3.0, 8.0]", ["compiled", "attached"]),
        ("PRE_COMPILE", "[0.0, 0.0]", ["compiled"]),
        ("NEVER", None, ["compiled"]),
    ],
)
def test_connection_type(tmp_path: Path, mode: str, result: str | None, events: list[str]) -> None:
    cache = tmp_path / "cache" if mode == "PRE_COMPILE" else None
    proc = _run(mode, _env(tmp_path, cache))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    if result is None:
        assert "[" not in proc.stdout, "NEVER must not produce a result"
    else:
        assert lines[-1] == result
    assert _events(proc.stderr) == events, proc.stderr
    if mode == "PRE_COMPILE":
        saved = [
            ln for ln in proc.stderr.splitlines() if "A pre-compiled program has been saved" in ln
        ]
        assert len(saved) == 1
        path = Path(saved[0].split("saved to ")[1].strip())
        assert path.parent == tmp_path / "cache" and path.suffix == ".mrx" and path.exists()


def test_pre_compile_without_a_cache_path_says_how_to_set_it(tmp_path: Path) -> None:
    proc = _run("PRE_COMPILE", _env(tmp_path))
    assert proc.returncode == 1
    assert "--executable_cache_path=DIR" in proc.stderr and "ConfigurationError" in proc.stderr


def test_unknown_connection_type_is_refused(tmp_path: Path) -> None:
    proc = _run("SOMETIMES", _env(tmp_path))
    assert proc.returncode == 2 and "invalid choice" in proc.stderr


def test_precompiled_where_the_device_is_held_runs_on_another_machine(tmp_path: Path) -> None:
    cache = tmp_path / "shared-cache"
    # Machine 1: its only device is held by another process (this test), so only
    # pre-compiling (or NEVER) can work there.
    held = DeviceLock.try_acquire(tmp_path / "machine1", 0)
    assert held is not None
    try:
        busy = _run("ALWAYS", _env(tmp_path, cache, locks="machine1"))
        assert busy.returncode == 1 and "DeviceUnavailableError" in busy.stderr
        pre = _run("PRE_COMPILE", _env(tmp_path, cache, locks="machine1"))
        assert pre.returncode == 0, pre.stderr
        assert pre.stdout.strip().splitlines()[-1] == "[0.0, 0.0]"
    finally:
        held.release()
    saved = sorted(cache.glob("*.mrx"))
    assert len(saved) == 1
    mtime = saved[0].stat().st_mtime_ns
    # Machine 2 (its own devices), same cache path: found in the cache, not compiled again.
    proc = _run("ALWAYS", _env(tmp_path, cache, locks="machine2"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[3.0, 8.0]"
    assert _events(proc.stderr) == ["attached"], proc.stderr
    assert "Found model 'connection_type' in the executable cache" in proc.stderr
    assert str(saved[0]) in proc.stderr and saved[0].stat().st_mtime_ns == mtime

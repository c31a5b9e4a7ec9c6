"""Seed 000's example, ported: examples/embedded_runtime.py prints the even numbers 0..30."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_embedded_runtime_example_doubles_16_calls() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "embedded_runtime.py")],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines == [str([float(2 * i)] * 4) for i in range(16)]
    assert "embedded_engine_started" in proc.stderr and "embedded_engine_stopped" in proc.stderr

"""Seed 003's ring-buffer example, ported: examples/ring_buffer.py passes data from an OS thread
to an async consumer and back the other way, and both producers stop on ``invalidate()``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(60)
def test_ring_buffer_example_thread_to_async_and_back() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "ring_buffer.py")],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert proc.stdout.splitlines() == [
        f"thread -> async: {[i * i for i in range(10)]}",
        "producer thread: stopped, the ring was invalidated",
        f"async -> thread: {[i**3 for i in range(10)]}",
        "async producer: stopped, the ring was invalidated",
    ]

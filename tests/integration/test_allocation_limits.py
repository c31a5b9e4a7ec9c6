"""A runner refuses, before building anything, a file whose metadata implies too much memory.

Issue 14, item 5: ``device_iterations=5000`` in a file with a valid hash cost gigabytes at start,
``10**6`` a bare numpy ``MemoryError``. With the default limit both are a
:class:`ResourceLimitError` from ``start()``, quickly, and nothing is left behind.
"""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

import pytest

from model_runtime.errors import ResourceLimitError
from model_runtime.runner import ModelRunner, ModelRunnerConfig
from tests.unit.test_executable_files import wide_executable_file

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("iterations", [5000, 10**6])
async def test_start_refuses_iterations_that_need_too_much_memory(
    tmp_path: Path, iterations: int
) -> None:
    path = wide_executable_file(tmp_path, iterations)
    runner = ModelRunner(path, ModelRunnerConfig())
    tracemalloc.start()
    began = time.perf_counter()
    try:
        with pytest.raises(ResourceLimitError, match=f"device_iterations {iterations} "):
            await runner.start()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - began < 5.0
    assert peak < 64 << 20, f"start allocated {peak} bytes before refusing"
    assert not runner.is_ready


async def test_replicas_count_in_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each replica has its own pool: one fits a limit that two do not. (A lowered limit, so
    that the tiny model can show it; the default is checked above.)"""
    from model_runtime.executable.limits import estimate_allocation
    from model_runtime.executable.testing import tiny_executable

    exe = tiny_executable(device_iterations=4)
    one = estimate_allocation(exe.metadata, 2, tensor_bytes=exe.total_tensor_bytes()).total
    monkeypatch.setenv("MODEL_RUNTIME_FLAGS", f"--max_allocation_bytes={one}")
    async with ModelRunner(exe, ModelRunnerConfig(replication_factor=1)) as runner:
        assert runner.is_ready
    with pytest.raises(ResourceLimitError, match="per replica x2"):
        await ModelRunner(exe, ModelRunnerConfig(replication_factor=2)).start()

"""Event-loop instructions per request, runtime against the bare batcher (needs valgrind).

Wall-clock ratios on a shared 2-core host move by 20 % from one 3 s window to the next; the
instructions the event loop's thread executes per request do not. This drives N single-sample
requests from 256 concurrent callers through the bare batcher (``bare_batcher.py``) and the
runtime (``ModelRunner``, one cpu device of one thread) on a tiny MLP (784-16-10, batch 32, so
the loop is the work), under ``valgrind --tool=callgrind``, twice per side (N = 3000 and 9000),
and prints the main thread's instructions per request from the difference (start-up cancels
out). About 4 minutes per side on the 2-core machine.

    .venv/bin/python benchmarks/loop_instructions.py [--side bare runtime]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CALLERS = 256
COUNTS = (3000, 9000)


async def drive(side: str, requests: int) -> None:
    """``requests`` single-sample requests from :data:`CALLERS` callers, nothing timed."""
    import anyio
    import numpy as np

    from actors.device.inventory import DeviceSpec
    from actors.device.manager import DeviceManager
    from benchmarks.bare_batcher import BareBatcher
    from model_runtime.compiler import CompileOptions, compile_model
    from model_runtime.executable import Executable
    from model_runtime.runner import ModelRunner, ModelRunnerConfig
    from tests.models import make_mlp

    tmp = Path(tempfile.mkdtemp())
    options = CompileOptions(batch_size=32, model_name="tiny")
    exe = compile_model(make_mlp(sizes=(784, 16, 10)), tmp / "tiny.mrx", options)
    one = {"x": np.random.default_rng(0).standard_normal((1, 784)).astype(np.float32)}
    left = requests

    async def callers(execute: Callable[[dict[str, Any]], Awaitable[Any]]) -> None:
        async def caller() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                await execute(one)

        async with anyio.create_task_group() as tg:
            for _ in range(CALLERS):
                tg.start_soon(caller)

    if side == "bare":
        async with BareBatcher(Executable.load(exe), 1, flush_s=0.002) as bare:
            await callers(bare.infer)
    else:
        manager = DeviceManager(inventory=[DeviceSpec(id=0, kind="cpu", threads=1)])
        config = ModelRunnerConfig(
            replication_factor=1, batching_dim=0, timeout=0.00001, max_retries=0
        )
        async with ModelRunner(exe, config, device_manager=manager) as runner:
            await callers(runner.execute)
    shutil.rmtree(tmp, ignore_errors=True)


def main_thread_instructions(side: str, requests: int, out: Path) -> int:
    """Instructions of the main thread of one run under callgrind."""
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--separate-threads=yes",
        f"--callgrind-out-file={out}",
        sys.executable,
        __file__,
        "--drive",
        side,
        str(requests),
    ]
    subprocess.run(cmd, check=True, capture_output=True)
    text = Path(f"{out}-01").read_text(errors="replace")
    match = re.search(r"^summary: (\d+)", text, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"no summary line in {out}-01")
    return int(match.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--side", nargs="+", choices=("bare", "runtime"), default=["bare", "runtime"]
    )
    parser.add_argument("--drive", nargs=2, metavar=("SIDE", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.drive:
        asyncio.run(drive(args.drive[0], int(args.drive[1])))
        return
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (apt-get install valgrind)")
    os.environ.setdefault("MODEL_RUNTIME_DIR", tempfile.mkdtemp(prefix="mr-loop-"))
    with tempfile.TemporaryDirectory() as tmp:
        for side in args.side:
            low, high = (
                main_thread_instructions(side, n, Path(tmp) / f"{side}.{n}") for n in COUNTS
            )
            per = (high - low) / (COUNTS[1] - COUNTS[0])
            print(f"{side:8} {per:9.0f} instructions per request on the event loop's thread")


if __name__ == "__main__":
    main()

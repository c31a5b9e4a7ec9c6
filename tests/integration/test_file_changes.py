"""A served file changed after load cannot hurt the running model (issue 14, item 4).

Each scenario runs in a child process: if the loaded model still read the file, truncation
would kill it with SIGBUS, and that must show up as this test failing, not as pytest dying.
The child serves the tiny model with the default policy plus ``auto_reset`` and a fault plan
that fails run 2 with a recoverable error, so the device is reset (and reloads the executable)
after the file changed; every answer must still be the one the original file gives.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]

_CHILD = r"""
import asyncio, os, sys
import numpy as np
from model_runtime.executable import Executable
from model_runtime.errors import PackageHashMismatchError
from model_runtime.executable.testing import tiny_executable
from model_runtime.runner import ModelRunner, ModelRunnerConfig

path, change = sys.argv[1], sys.argv[2]
original = tiny_executable(seed=1)
original.save(path)
W, b = np.array(original.tensor("W")), np.array(original.tensor("b"))
size = os.path.getsize(path)
other = path + ".other"
tiny_executable(seed=2).save(other)  # other weights, same shapes: a file of the same size
with open(other, "rb") as f:
    other_bytes = f.read()
assert len(other_bytes) == size


def change_file():
    if change == "truncate-to-zero":
        os.truncate(path, 0)
    elif change == "truncate-half":
        os.truncate(path, size // 2)
    elif change == "rewrite-same-size":
        with open(path, "r+b") as f:  # in place: same inode, no rename
            f.write(other_bytes)
        assert os.path.getsize(path) == size
    elif change == "delete":
        os.unlink(path)
    else:
        raise SystemExit(f"unknown change {change}")


async def main():
    x = np.random.default_rng(7).standard_normal((2, 4)).astype(np.float32)
    expected = x @ W + b
    config = ModelRunnerConfig(auto_reset=True, fault_plan="recoverable:at=2")
    async with ModelRunner(path, config) as runner:
        answers = [await runner.execute({"x": x})]
        change_file()
        for _ in range(3):  # run 2 fails, the device resets (reloads) and the request retries
            answers.append(await runner.execute({"x": x}))
        resets = runner.replica_states()[0].resets
        ready = runner.is_ready
    assert resets == 1, f"expected one device reset, got {resets}"
    assert ready
    for k, out in enumerate(answers):
        np.testing.assert_allclose(out["y"], expected, rtol=1e-5, err_msg=f"answer {k}")
    # An explicit reload reads the file again and verifies it again.
    if change == "rewrite-same-size":
        reloaded = Executable.load(path)
        np.testing.assert_array_equal(reloaded.tensor("W"), tiny_executable(seed=2).tensor("W"))
    print("OK", resets)


asyncio.run(main())
"""


@pytest.mark.parametrize(
    "change", ["truncate-to-zero", "truncate-half", "rewrite-same-size", "delete"]
)
def test_file_changed_after_load_then_device_reset_keeps_correct_answers(
    tmp_path: Path, change: str
) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path / "served.mrx"), change],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=100,
    )
    died = f" (killed by {signal.Signals(-proc.returncode).name})" if proc.returncode < 0 else ""
    output = f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, f"child exited {proc.returncode}{died}\n{output}"
    assert proc.stdout.split() == ["OK", "1"]


def test_tampered_rewrite_is_refused_on_explicit_reload(tmp_path: Path) -> None:
    """The running model keeps what it verified; the next explicit load verifies the file."""
    from model_runtime.errors import PackageHashMismatchError
    from model_runtime.executable import Executable
    from model_runtime.executable.testing import tiny_executable, tiny_tensors

    path = tiny_executable().save(tmp_path / "m.mrx")
    loaded = Executable.load(path)
    raw = bytearray(path.read_bytes())
    raw[raw.index(tiny_tensors()["W"].tobytes())] ^= 0xFF
    with open(path, "r+b") as f:
        f.write(raw)
    with pytest.raises(PackageHashMismatchError, match="package hash mismatch"):
        Executable.load(path)
    assert loaded.tensor("W").tobytes() == tiny_tensors()["W"].tobytes()

"""Weights released from a loaded executable are read again, verified, when asked for (issue
34): the same bytes, or a typed error that says the file changed; never other weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from model_runtime.errors import InvalidExecutableError, PackageHashMismatchError
from model_runtime.executable import Executable
from model_runtime.executable.testing import tiny_executable


def loaded(tmp_path: Path, seed: int = 1) -> tuple[Executable, Path]:
    path = tiny_executable(seed=seed).save(tmp_path / "m.mrx")
    return Executable.load(path), path


def test_released_tensors_are_read_again_verified(tmp_path: Path) -> None:
    exe, _ = loaded(tmp_path)
    want = np.array(exe.tensor("W"))
    before = exe.total_tensor_bytes()
    assert exe.release(["W"]) == want.nbytes
    assert exe.released == {"W"}
    assert exe.total_tensor_bytes() == before - want.nbytes  # what is held, not what was
    assert "W" in exe.tensor_names
    np.testing.assert_array_equal(exe.tensor("W"), want)
    again = tmp_path / "again.mrx"
    exe.save(again)  # a released executable still saves whole
    np.testing.assert_array_equal(Executable.load(again).tensor("W"), want)


def test_kept_tensors_no_longer_share_the_file_buffer(tmp_path: Path) -> None:
    exe, _ = loaded(tmp_path)
    base = exe.tensor("W").base
    exe.release(["W"])
    b = exe.tensor("b")
    assert not np.shares_memory(b, base), "a kept tensor still holds the released buffer"
    assert not b.flags.writeable


@pytest.mark.parametrize("change", ["rewrite", "truncate", "delete"])
def test_a_changed_file_is_a_typed_error_never_other_weights(tmp_path: Path, change: str) -> None:
    exe, path = loaded(tmp_path, seed=1)
    exe.release(["W"])
    if change == "rewrite":  # another executable of the same size, in place
        other = tiny_executable(seed=2).save(tmp_path / "other.mrx").read_bytes()
        path.write_bytes(other)
        with pytest.raises(PackageHashMismatchError, match="another executable"):
            exe.tensor("W")
    else:
        if change == "truncate":
            path.write_bytes(path.read_bytes()[:100])
        else:
            path.unlink()
        with pytest.raises(InvalidExecutableError, match="released after load"):
            exe.tensor("W")
    np.testing.assert_array_equal(exe.tensor("b"), tiny_executable(seed=1).tensor("b"))


def test_an_executable_built_in_memory_releases_nothing() -> None:
    exe = tiny_executable()
    assert exe.release(["W"]) == 0
    assert exe.released == frozenset()
    assert exe.tensor("W") is not None

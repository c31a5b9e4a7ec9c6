"""Property tests: a damaged .mrx either loads as a usable executable or raises a typed error.

Never another exception, never a hang: each example has a deadline, and the runs are
derandomized so CI sees the same examples every time.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from model_runtime.errors import ModelRuntimeError
from model_runtime.executable import Executable
from model_runtime.executable.summary import format_summary, summarize
from model_runtime.executable.testing import tiny_executable, tiny_onnx

FUZZ = settings(
    max_examples=300,
    deadline=1000,  # ms; a real load takes ~1 ms, so only a hang (or worse) trips this
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


@pytest.fixture(scope="module")
def valid(workdir: Path) -> bytes:
    return tiny_executable().save(workdir / "valid.mrx").read_bytes()


def _load_or_typed_error(path: Path, data: bytes, check_hash: bool) -> None:
    path.write_bytes(data)
    try:
        exe = Executable.load(path, check_package_hash=check_hash)
    except ModelRuntimeError:
        return
    # It loaded: it must be usable, down to every byte of every mapped tensor.
    for name in exe.tensor_names:
        np.asarray(exe.tensor(name)).sum()
    assert summarize(exe)["model_name"] == exe.metadata.model_name
    assert format_summary(exe)


def _header_len(valid: bytes) -> int:
    return 8 + int.from_bytes(valid[:8], "little")


@FUZZ
@given(data=st.data(), check_hash=st.booleans())
def test_flipped_bytes(workdir: Path, valid: bytes, data: st.DataObject, check_hash: bool) -> None:
    # Aim at the header (the safetensors parser and metadata decoder) and at the ONNX payload
    # (the protobuf parser and checker, reached when the hash check is off), not only at random.
    payload = tiny_onnx()
    at = valid.index(payload)
    lo, hi = data.draw(
        st.sampled_from([(0, _header_len(valid)), (at, at + len(payload)), (0, len(valid))])
    )
    flips = data.draw(
        st.lists(st.tuples(st.integers(lo, hi - 1), st.integers(1, 255)), min_size=1, max_size=4)
    )
    mutated = bytearray(valid)
    for at, xor in flips:
        mutated[at] ^= xor
    _load_or_typed_error(workdir / "flip.mrx", bytes(mutated), check_hash)


@FUZZ
@given(data=st.data(), check_hash=st.booleans())
def test_truncated(workdir: Path, valid: bytes, data: st.DataObject, check_hash: bool) -> None:
    at = data.draw(st.integers(0, len(valid) - 1))
    _load_or_typed_error(workdir / "cut.mrx", valid[:at], check_hash)


@FUZZ
@given(data=st.data(), check_hash=st.booleans())
def test_inserted_bytes(workdir: Path, valid: bytes, data: st.DataObject, check_hash: bool) -> None:
    at = data.draw(st.integers(0, len(valid)))
    extra = data.draw(st.binary(min_size=1, max_size=16))
    _load_or_typed_error(workdir / "ins.mrx", valid[:at] + extra + valid[at:], check_hash)


@FUZZ
@given(header=st.binary(max_size=64), tail=st.binary(max_size=64))
def test_arbitrary_bytes(workdir: Path, header: bytes, tail: bytes) -> None:
    _load_or_typed_error(
        workdir / "any.mrx", len(header).to_bytes(8, "little") + header + tail, True
    )

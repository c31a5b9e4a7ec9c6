"""A loaded executable owns its data, and what a file makes us allocate is bounded (issue 14).

Item 4: after load, the file may be rewritten, truncated or deleted; the executable keeps the
bytes it verified. Item 5 (memory): the bytes a file's metadata implies (tensors at load; ring
pools, run outputs and device copies at start) are checked against the allocation limit before
anything is allocated, and refused with a typed error.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from model_runtime.errors import ConfigurationError, InvalidExecutableError, ResourceLimitError
from model_runtime.executable import Executable, compute_package_hash
from model_runtime.executable.codec import metadata_to_json
from model_runtime.executable.container import METADATA_KEY
from model_runtime.executable.limits import (
    DEFAULT_MEMORY_FRACTION,
    check_allocation,
    default_limit_bytes,
    estimate_allocation,
    process_memory_bytes,
)
from model_runtime.executable.model import (
    Anchor,
    AnchorRole,
    AnchorType,
    ExecutableMetadata,
    Program,
    ProgramFlow,
    ProgramKind,
    Target,
    TensorInfo,
)
from model_runtime.executable.safetensors_io import open_safetensors
from model_runtime.executable.testing import MAIN_PAYLOAD, tiny_executable, tiny_onnx
from model_runtime.flags import parse_flags

REPO = Path(__file__).resolve().parents[2]
F32 = np.dtype(np.float32)
#: features of the wide model: one row of ``x`` is 64 MiB, a batch of 2 is 128 MiB
WIDE = 1 << 24


@contextmanager
def _peak_bytes() -> Iterator[list[int]]:
    """Trace Python/numpy allocations in the block; the list gets the peak (always stopped)."""
    tracemalloc.start()
    peak: list[int] = []
    try:
        yield peak
        peak.append(tracemalloc.get_traced_memory()[1])
    finally:
        tracemalloc.stop()


def _all_tensors(exe: Executable) -> dict[str, np.ndarray]:
    return {n: exe.tensor(n) for n in exe.tensor_names}


# -- item 4: the file cannot change a loaded executable -----------------------------------------


def test_same_size_rewrite_in_place_after_load_changes_nothing(tmp_path: Path) -> None:
    path = tiny_executable(seed=1).save(tmp_path / "m.mrx")
    loaded = Executable.load(path)
    before = {n: np.array(a) for n, a in _all_tensors(loaded).items()}
    replacement = tiny_executable(seed=2).save(tmp_path / "other.mrx").read_bytes()
    assert len(replacement) == path.stat().st_size
    with open(path, "r+b") as f:  # same inode, no rename: what an editor or `cp` does
        f.write(replacement)
    for name, value in _all_tensors(loaded).items():
        np.testing.assert_array_equal(value, before[name])
    # What runs is what was verified: the held bytes still hash to the stored hash.
    assert compute_package_hash(loaded.metadata, _all_tensors(loaded)) == loaded.package_hash
    reloaded = Executable.load(path)  # an explicit reload reads the new file
    assert reloaded.package_hash != loaded.package_hash


_TRUNCATE_CHILD = r"""
import os, sys
from pathlib import Path
import numpy as np
from model_runtime.executable import Executable, compute_package_hash
from model_runtime.executable.testing import tiny_executable

built = tiny_executable()
prog, weights = built.save_split(Path(sys.argv[1]) / "p.mrx", Path(sys.argv[1]) / "w.mrx")
single = built.save(Path(sys.argv[1]) / "m.mrx")
for paths in ([single], [prog, weights]):
    exe = Executable.load(paths)
    for p in paths:
        os.truncate(p, 0)
    tensors = {n: exe.tensor(n) for n in exe.tensor_names}
    for n, a in tensors.items():
        np.testing.assert_array_equal(a, built.tensor(n))  # reads every byte of every tensor
    assert compute_package_hash(exe.metadata, tensors) == built.package_hash
    assert exe.program_payload(1) == built.program_payload(1)
print("OK")
"""


def test_truncation_after_load_neither_kills_nor_changes_the_executable(tmp_path: Path) -> None:
    # In a child: reading a truncated file's shared mapping dies of SIGBUS, which must fail
    # this test, not end pytest.
    proc = subprocess.run(
        [sys.executable, "-c", _TRUNCATE_CHILD, str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "OK", (proc.returncode, proc.stderr)


def _open_or_mapped(path: Path) -> bool:
    """Whether this process has ``path`` open or memory-mapped (Linux /proc)."""
    if str(path) in Path("/proc/self/maps").read_text():
        return True
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                return True
        except OSError:  # the listing's own descriptor, closed by now
            pass
    return False


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux /proc")
def test_load_keeps_the_file_neither_open_nor_mapped(tmp_path: Path) -> None:
    built = tiny_executable()
    paths = [
        *built.save_split(tmp_path / "p.mrx", tmp_path / "w.mrx"),
        built.save(tmp_path / "m.mrx"),
    ]
    exes = [Executable.load(paths[:2]), Executable.load(paths[2])]
    assert not any(_open_or_mapped(p) for p in paths)
    for p in paths:
        p.unlink()
    assert all(exe.program_payload(1) == tiny_onnx() for exe in exes)


@pytest.mark.parametrize(
    ("change", "match"),
    [("truncate", "file ended while reading the tensor data"), ("append", "changed size")],
)
def test_a_file_that_changes_size_while_being_read_is_invalid(
    tmp_path: Path, change: str, match: str
) -> None:
    path = tiny_executable().save(tmp_path / "m.mrx")
    size = path.stat().st_size
    with open_safetensors(path) as f:  # header read and checked; the data not yet
        if change == "truncate":
            os.truncate(path, size - 4)
        else:
            with open(path, "ab") as out:
                out.write(b"\0" * 4)
        with pytest.raises(InvalidExecutableError, match=match):
            f.read_tensors()


# -- item 5: memory the file implies is bounded ------------------------------------------------


def _wide_metadata(device_iterations: int, batch: int = 2) -> ExecutableMetadata:
    """A model whose user input row is 64 MiB: ``y = ReduceSum(x, axis 1)``, no weights."""

    def anchor(name: str, shape: tuple[int, ...], t: AnchorType, role: AnchorRole) -> Anchor:
        return Anchor(name, name, TensorInfo(shape, F32), t, role, (0,), batch_dim=0)

    return ExecutableMetadata(
        model_name="wide",
        target=Target(),
        batch_size=batch,
        anchors=(
            anchor("x", (batch, WIDE), AnchorType.INPUT, AnchorRole.USER_INPUT),
            anchor("y", (batch, 1), AnchorType.OUTPUT, AnchorRole.USER_OUTPUT),
        ),
        programs=(Program(0, "main", ProgramKind.MAIN, MAIN_PAYLOAD),),
        program_flow=ProgramFlow(main=(0,)),
        device_iterations=device_iterations,
    )


def _wide_onnx(batch: int = 2) -> np.ndarray:
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)],
        "wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, WIDE])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 1])],
        initializer=[helper.make_tensor("axes", TensorProto.INT64, [1], [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return np.frombuffer(model.SerializeToString(), np.uint8)


def wide_executable_file(folder: Path, device_iterations: int) -> Path:
    """A sealed file (valid hash) of the wide model with ``device_iterations``."""
    built = Executable.build(_wide_metadata(device_iterations), {MAIN_PAYLOAD: _wide_onnx()})
    return built.save(folder / f"wide-{device_iterations}.mrx")


@pytest.mark.parametrize("iterations", [5000, 10**6])
def test_device_iterations_from_a_sealed_file_are_refused_before_allocating(
    tmp_path: Path, iterations: int
) -> None:
    exe = Executable.load(wide_executable_file(tmp_path, iterations))  # the hash is valid
    start = time.perf_counter()
    with (
        _peak_bytes() as peak,
        pytest.raises(ResourceLimitError, match=r"'wide' would hold .* over the allocation limit"),
    ):
        check_allocation(exe.metadata, 2, tensor_bytes=exe.total_tensor_bytes())
    elapsed = time.perf_counter() - start
    assert elapsed < 0.5 and peak[0] < 1 << 20, (elapsed, peak)


def test_the_refusal_says_what_and_how_much() -> None:
    with pytest.raises(ResourceLimitError) as info:
        check_allocation(_wide_metadata(5000), 2)
    err = info.value
    pool = 2 * 5000 * 2 * WIDE * 4
    assert err.needed >= pool > err.limit == default_limit_bytes()[0]
    assert isinstance(err, InvalidExecutableError)
    for part in ("device_iterations 5000", "ring_buffer_size_multiplier 2", "--max_allocation"):
        assert part in str(err)


def test_estimate_counts_pools_outputs_device_copies_and_tensors() -> None:
    meta = tiny_executable(device_iterations=3).metadata  # x f32[2,4]; y f32[2,3] + counter
    est = estimate_allocation(meta, 4, replicas=2, tensor_bytes=1000)
    assert est.pool == 4 * 3 * (2 * 4 * 4)
    assert est.outputs == 3 * (2 * 3 * 4 + 4)
    assert est.device == (4 * 3 + 3 + 1) * 4  # W, b, counter
    assert est.tensors == 1000
    assert est.total == 1000 + 2 * (est.pool + est.outputs + est.device)
    assert estimate_allocation(meta, 4).tensors == est.device  # metadata alone: no payloads


def test_the_limit_is_inclusive() -> None:
    meta = tiny_executable().metadata
    need = estimate_allocation(meta, 2, replicas=3).total
    assert check_allocation(meta, 2, need, replicas=3).total == need
    with pytest.raises(ResourceLimitError):
        check_allocation(meta, 2, need - 1, replicas=3)


def test_a_real_model_fits_the_default_limit() -> None:
    exe = tiny_executable(device_iterations=100)
    est = check_allocation(exe.metadata, 2, tensor_bytes=exe.total_tensor_bytes())
    assert 0 < est.total < default_limit_bytes()[0]


def test_default_limit_is_half_the_memory_and_the_flag_overrides_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    memory = process_memory_bytes()
    assert memory is not None and memory > 0
    assert default_limit_bytes()[0] == int(memory * DEFAULT_MEMORY_FRACTION)
    monkeypatch.setenv("MODEL_RUNTIME_FLAGS", "--max_allocation_bytes=1KiB")
    assert default_limit_bytes()[0] == 1024
    # A tiny model with many iterations passes the default but not a 1 KiB limit.
    with pytest.raises(ResourceLimitError, match=r"1\.0 KiB .*--max_allocation_bytes"):
        check_allocation(tiny_executable(device_iterations=100).metadata, 2)


@pytest.mark.parametrize(
    ("text", "value"),
    [("8589934592", 8 << 30), ("8GiB", 8 << 30), ("512M", 512 << 20), ("3 kb", 3072)],
)
def test_max_allocation_bytes_flag_parses(text: str, value: int) -> None:
    assert parse_flags(f"--max_allocation_bytes='{text}'").max_allocation_bytes == value
    assert parse_flags("").max_allocation_bytes is None


@pytest.mark.parametrize("text", ["0", "-1", "1.5G", "GiB", "lots", "9" * 30])
def test_bad_max_allocation_bytes_names_the_flag(text: str) -> None:
    with pytest.raises(ConfigurationError, match="--max_allocation_bytes must be a positive"):
        parse_flags(f"--max_allocation_bytes={text}")


def _sparse_file(path: Path, data_bytes: int) -> Path:
    """A file with the tiny model's metadata and one tensor of ``data_bytes`` zeros (sparse on
    disk: nothing is written). Its header is valid; only the size is absurd."""
    meta = {METADATA_KEY: metadata_to_json(tiny_executable().metadata, include_hash=True)}
    rows = data_bytes // (1 << 20)
    header = {"__metadata__": meta, "big": {"dtype": "U8", "shape": [rows, 1 << 20],
                                            "data_offsets": [0, rows << 20]}}  # fmt: skip
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + (rows << 20))
    return path


def test_tensor_bytes_over_the_limit_are_refused_before_reading(tmp_path: Path) -> None:
    tiny = tiny_executable().save(tmp_path / "tiny.mrx")
    with open_safetensors(tiny) as f:
        data = f.data_bytes
    assert Executable.load(tiny, limit_bytes=data).package_hash
    with (
        _peak_bytes() as peak,
        pytest.raises(ResourceLimitError, match="loading the tensors needs"),
    ):
        Executable.load(tiny, limit_bytes=data - 1)
    assert peak[0] < 1 << 20


_SPARSE_CHILD = r"""
import resource, sys, time, tracemalloc
from pathlib import Path
from model_runtime.errors import ResourceLimitError
from model_runtime.executable import Executable

# A cap on the address space, so that reading 1 TiB is a quick MemoryError, never a machine
# that swaps or an OOM kill, if the limit check were missing.
with open("/proc/self/status") as f:
    vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize"))
resource.setrlimit(resource.RLIMIT_AS, (vm + (2 << 30), resource.RLIM_INFINITY))
tracemalloc.start()
start = time.perf_counter()
try:
    Executable.load(Path(sys.argv[1]))
except ResourceLimitError as exc:
    _, peak = tracemalloc.get_traced_memory()
    assert "loading the tensors needs 1.0 TiB" in str(exc), str(exc)
    assert time.perf_counter() - start < 2.0 and peak < 1 << 20, peak
    print("OK")
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_a_terabyte_file_under_the_default_limit_fails_fast(tmp_path: Path) -> None:
    path = _sparse_file(tmp_path / "huge.mrx", 1 << 40)
    proc = subprocess.run(
        [sys.executable, "-c", _SPARSE_CHILD, str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "OK", (proc.returncode, proc.stderr)

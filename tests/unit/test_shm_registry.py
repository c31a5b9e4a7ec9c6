"""The system shared memory registry (model_runtime/server/tensors/shm.py) on real POSIX shared
memory
objects: what it registers and refuses (hypothesis-fuzzed offsets, sizes and keys), the bounds
of every request's lease, regions unregistered or removed while in use, and register,
unregister and leases from several threads at once. Every object a test makes is unlinked."""

from __future__ import annotations

import _posixshmem  # type: ignore[import-not-found]
import itertools
import os
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from model_runtime.errors import (
    CudaSharedMemoryError,
    SharedMemoryArgumentError,
    SharedMemoryDisabledError,
    SharedMemoryExistsError,
    SharedMemoryNotFoundError,
    SharedMemoryOpenError,
    SharedMemoryShrunkError,
)
from model_runtime.server.tensors.shm import (
    DISABLED,
    SIZE_MAX,
    Lease,
    RegionStatus,
    SharedMemoryRegistry,
    ShmLimits,
)

pytestmark = pytest.mark.timeout(120)
_count = itertools.count()
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _raises(cls: type[Exception], message: str, call: Callable[[], object]) -> None:
    with pytest.raises(cls) as info:
        call()
    assert str(info.value) == message


@contextmanager
def shm_object(size: int) -> Iterator[tuple[str, bytes]]:
    """A fresh POSIX shared memory object of ``size`` bytes of known content: (key,
    content); unlinked at the end, pass or fail."""
    key = f"/mrt_unit_{os.getpid()}_{next(_count)}"
    fd = _posixshmem.shm_open(key, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    content = bytes(i * 7 % 251 for i in range(size))
    try:
        os.ftruncate(fd, size)
        os.pwrite(fd, content, 0)
        os.close(fd)
        yield key, content
    finally:
        try:
            _posixshmem.shm_unlink(key)
        except FileNotFoundError:
            pass


@contextmanager
def registry(**kwargs: object) -> Iterator[SharedMemoryRegistry]:
    """A registry whose regions are all dropped at the end, and that leaks no descriptor."""
    before = _fds()
    reg = SharedMemoryRegistry(**kwargs)  # type: ignore[arg-type]
    try:
        yield reg
    finally:
        reg.close()
    assert _fds() == before


def test_a_registered_region_is_listed_and_its_bytes_are_the_objects() -> None:
    with shm_object(3 * 4096 + 5) as (key, content), registry() as reg:
        reg.register("r", key, 4096 + 3, 4096)  # an offset off a page boundary
        assert reg.status() == [RegionStatus("r", key, 4096 + 3, 4096)]
        assert reg.status("r") == reg.status()
        lease = reg.lease("r", 10, 100)
        assert lease.read() == content[4096 + 13 : 4096 + 113]
        lease.write(memoryview(b"abc"))  # outputs are written through to the object
        lease.release()
        fd = _posixshmem.shm_open(key, os.O_RDONLY, 0)
        assert os.pread(fd, 3, 4096 + 13) == b"abc"
        os.close(fd)
        reg.unregister("r")
        assert reg.status() == []


@FUZZ
@given(
    size=st.integers(1, 3 * 4096),
    offset=st.integers(0, 7 * 4096),
    byte_size=st.integers(0, 7 * 4096),
)
def test_register_takes_exactly_what_lies_within_the_object(
    size: int, offset: int, byte_size: int
) -> None:
    with shm_object(size) as (key, content), registry() as reg:
        if byte_size == 0 or offset + byte_size > size:
            with pytest.raises(SharedMemoryArgumentError) as info:
                reg.register("r", key, offset, byte_size)
            assert str(info.value).startswith(
                "failed to register shared memory region 'r': invalid args"
            )
            assert reg.status() == []
            return
        reg.register("r", key, offset, byte_size)
        lease = reg.lease("r", 0, byte_size)
        assert lease.read() == content[offset : offset + byte_size]
        lease.release()


@FUZZ
@given(offset=st.integers(0, 2**65), byte_size=st.integers(0, 2**65))
def test_every_lease_lies_within_its_region(offset: int, byte_size: int) -> None:
    region = 4096
    with shm_object(2 * region) as (key, content), registry() as reg:
        reg.register("r", key, 100, region)
        try:
            lease = reg.lease("r", offset, byte_size)
        except SharedMemoryArgumentError as exc:
            if offset >= region:
                assert str(exc) == "Invalid offset for shared memory region: 'r'"
            elif byte_size > SIZE_MAX - offset:
                assert str(exc).startswith("Integer overflow detected: byte_size")
            else:
                assert offset + byte_size > region
                assert str(exc) == "Invalid offset + byte size for shared memory region: 'r'"
            return
        assert offset < region and offset + byte_size <= region
        assert lease.read() == content[100 + offset : 100 + offset + byte_size]
        lease.release()


_KEY = re.compile(r"/*[A-Za-z0-9._-]{1,255}")


@FUZZ
@given(
    key=st.one_of(
        st.text(alphabet="/._-aZ9\\\0 é~", max_size=12),
        st.sampled_from(["/..", "/.", ".", "..", "/dev/shm/x", "/tmp/../x", "a/b", "/" * 5]),
        st.just("/" + "k" * 256),
    )
)
def test_a_key_is_one_shared_memory_name_never_a_path(key: str) -> None:
    with registry() as reg:
        try:
            reg.register("r", key, 0, 1)
        except SharedMemoryOpenError as exc:
            # Only a well-formed name reaches shm_open (none of these exists).
            assert _KEY.fullmatch(key) and key.lstrip("/") not in (".", "..")
            assert str(exc) == f"Unable to open shared memory region: '{key}'"
        except SharedMemoryArgumentError as exc:
            assert not _KEY.fullmatch(key) or key.lstrip("/") in (".", "..")
            assert str(exc) == f"cannot register shared memory region 'r' - invalid shm key '{key}'"
        else:
            raise AssertionError(f"{key!r} was registered")


@pytest.mark.parametrize(
    "key", ["triton_python_backend_shm_region_1", "///triton_python_backend_shm_region_"]
)
def test_triton_s_reserved_prefix_is_refused_with_its_text(key: str) -> None:
    with registry() as reg, pytest.raises(SharedMemoryArgumentError) as info:
        reg.register("mine", key, 0, 8)
    assert str(info.value) == (
        f"cannot register shared memory region 'mine' with key '{key}' as the key contains the "
        "reserved prefix 'triton_python_backend_shm_region_'"
    )


def test_names_once_unknown_names_and_an_empty_name_answer_as_triton() -> None:
    with shm_object(64) as (key, _), registry() as reg:
        reg.register("r", key, 0, 64)
        exists = "shared memory region 'r' already in manager"
        _raises(SharedMemoryExistsError, exists, lambda: reg.register("r", key, 0, 8))
        unknown = "Unable to find system shared memory region: 'x'"
        _raises(SharedMemoryNotFoundError, unknown, lambda: reg.status("x"))
        unknown = "Unable to find shared memory region: 'x'"
        _raises(SharedMemoryNotFoundError, unknown, lambda: reg.lease("x", 0, 1))
        nameless = "'region name' is necessary to register system shared memory region"
        _raises(SharedMemoryArgumentError, nameless, lambda: reg.register("", key, 0, 8))
        reg.unregister("x")  # not registered: no error, as Triton
        assert [s.name for s in reg.status()] == ["r"]


def test_limits_bound_how_many_regions_and_bytes_clients_register() -> None:
    limits = ShmLimits(max_regions=2, max_bytes=5000)
    with shm_object(4096) as (key, _), registry(limits=limits) as reg:
        reg.register("a", key, 0, 2000)
        too_big = (
            "failed to register shared memory region 'b': invalid args (the registered regions "
            "would hold 5001 bytes, past the server's limit of 5000)"
        )
        _raises(SharedMemoryArgumentError, too_big, lambda: reg.register("b", key, 0, 3001))
        reg.register("b", key, 0, 3000)
        too_many = (
            "failed to register shared memory region 'c': invalid args (2 regions are "
            "registered, the server's limit)"
        )
        _raises(SharedMemoryArgumentError, too_many, lambda: reg.register("c", key, 0, 1))
        reg.unregister("a")
        reg.register("c", key, 0, 1)


def test_a_region_unregistered_while_in_use_stays_until_its_last_request_finishes() -> None:
    with shm_object(4096) as (key, content), registry() as reg:
        reg.register("r", key, 0, 4096)
        first = reg.lease("r", 0, 64)
        reg.unregister()
        # Triton's rule: listed, its name taken, and usable until the requests finish.
        assert [s.name for s in reg.status()] == ["r"]
        with pytest.raises(SharedMemoryExistsError):
            reg.register("r", key, 0, 8)
        second = reg.lease("r", 64, 64)
        assert first.read() == content[:64]
        first.release()
        first.release()  # idempotent: one request, one release
        assert [s.name for s in reg.status()] == ["r"]
        second.release()
        assert reg.status() == []
        with pytest.raises(ValueError):  # released: its descriptor is closed
            first.read()
        reg.register("r", key, 0, 8)  # the name is free again


def test_an_object_the_client_removes_serves_on_and_one_it_shrinks_is_refused() -> None:
    with shm_object(8192) as (key, content), registry() as reg:
        reg.register("r", key, 4096, 4096)
        _posixshmem.shm_unlink(key)  # removed: the descriptor holds its memory
        lease = reg.lease("r", 0, 4096)
        assert lease.read() == content[4096:]
        lease.release()
    with shm_object(8192) as (key, content), registry() as reg:
        reg.register("r", key, 4096, 4096)
        fd = _posixshmem.shm_open(key, os.O_RDWR, 0)
        os.ftruncate(fd, 4096)  # were the region mapped, reading it now would be a SIGBUS
        os.close(fd)
        with pytest.raises(SharedMemoryShrunkError) as info:
            reg.lease("r", 0, 8)
        assert str(info.value) == (
            f"shared memory region 'r' shrank: its object '{key}' holds 4096 bytes now, less "
            "than the 8192 it was registered with"
        )


def _truncate(key: str, size: int) -> None:
    fd = _posixshmem.shm_open(key, os.O_RDWR, 0)
    os.ftruncate(fd, size)
    os.close(fd)


def _size(key: str) -> int:
    fd = _posixshmem.shm_open(key, os.O_RDONLY, 0)
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


@pytest.mark.parametrize("left", [0, 4096 + 100, 8191])
def test_an_object_shrunk_under_a_lease_fails_its_read_and_write_and_is_not_grown(
    left: int,
) -> None:
    """A client shrinks its object after the request leased the region: the read finds the
    end (a short read) and fails; the write finds the object short and writes nothing (a
    write past the end would grow the client's object)."""
    with shm_object(8192) as (key, content), registry() as reg:
        reg.register("r", key, 4096, 4096)
        lease = reg.lease("r", 0, 4096)
        _truncate(key, left)
        shrank = (
            f"shared memory region 'r' shrank: its object '{key}' holds {left} bytes now, "
            "less than the 8192 it was registered with"
        )
        _raises(SharedMemoryShrunkError, shrank, lease.read)
        _raises(SharedMemoryShrunkError, shrank, lambda: lease.write(memoryview(b"x" * 8)))
        assert _size(key) == left
        # Bytes the shrunk object still holds read as before (the shrink cut only the rest).
        if left > 4096 + 8:
            small = bytearray(8)
            lease.readinto(memoryview(small))
            assert small == content[4096 : 4096 + 8]
        lease.release()
        _truncate(key, 8192)  # the client gives the bytes back (as zeros): served again
        lease = reg.lease("r", 0, 4096)
        lease.write(memoryview(b"abc"))
        assert lease.read()[:3] == b"abc"
        lease.release()


def test_client_shared_memory_off_refuses_register_and_unregister_with_triton_s_text() -> None:
    with registry(enabled=False) as reg:
        for call in (lambda: reg.register("r", "/k", 0, 8), reg.unregister, reg.cuda_unregister):
            with pytest.raises(SharedMemoryDisabledError) as info:
                call()
            assert str(info.value) == DISABLED
        assert reg.status() == []


def test_cuda_regions_are_refused_as_by_triton_without_gpus() -> None:
    with shm_object(64) as (key, _), registry() as reg:
        reg.register("sys", key, 0, 64)
        assert reg.cuda_status() == []
        no_gpus = "failed to register CUDA shared memory region: 'g', GPUs not supported"
        _raises(CudaSharedMemoryError, no_gpus, lambda: reg.cuda_register("g"))
        unknown = "Unable to find cuda shared memory region: 'g'"
        _raises(SharedMemoryNotFoundError, unknown, lambda: reg.cuda_status("g"))
        system = (
            "The region named 'sys' is registered as system shared memory, not CUDA shared memory"
        )
        _raises(SharedMemoryNotFoundError, system, lambda: reg.cuda_status("sys"))
        reg.cuda_unregister("sys")  # not a CUDA region: nothing happens
        assert [s.name for s in reg.status()] == ["sys"]


class RegionsInUse(RuleBasedStateMachine):
    """Register, lease, release and unregister in any order: the registry lists exactly the
    regions registered and not yet gone (unregistered ones go with their last lease), every
    lease reads its bytes, and nothing leaks."""

    leases = Bundle("leases")

    def __init__(self) -> None:
        super().__init__()
        self._object = shm_object(4 * 4096)
        self.key, self.content = self._object.__enter__()
        self.fds = _fds()
        self.reg = SharedMemoryRegistry()
        #: name -> [offset, users, unregistered]
        self.model: dict[str, list[int]] = {}
        self.held: list[Lease] = []

    @rule(name=st.sampled_from("abc"), offset=st.integers(0, 3 * 4096))
    def register(self, name: str, offset: int) -> None:
        if name in self.model:
            with pytest.raises(SharedMemoryExistsError):
                self.reg.register(name, self.key, offset, 4096)
            return
        self.reg.register(name, self.key, offset, 4096)
        self.model[name] = [offset, 0, 0]

    @rule(target=leases, name=st.sampled_from("abc"), at=st.integers(0, 4095))
    def lease(self, name: str, at: int) -> tuple[str, Lease | None]:
        if name not in self.model:
            with pytest.raises(SharedMemoryNotFoundError):
                self.reg.lease(name, at, 1)
            return name, None
        lease = self.reg.lease(name, at, 4096 - at)
        self.model[name][1] += 1
        base = self.model[name][0]
        assert lease.read() == self.content[base + at : base + 4096]
        self.held.append(lease)
        return name, lease

    @rule(held=consumes(leases))
    def release(self, held: tuple[str, Lease | None]) -> None:
        name, lease = held
        if lease is None:
            return
        lease.release()
        self.held.remove(lease)
        entry = self.model[name]
        entry[1] -= 1
        if entry[1] == 0 and entry[2]:
            del self.model[name]

    @rule(name=st.sampled_from(["a", "b", "c", ""]))
    def unregister(self, name: str) -> None:
        self.reg.unregister(name)
        for each in [name] if name else list(self.model):
            entry = self.model.get(each)
            if entry is None:
                continue
            if entry[1]:
                entry[2] = 1
            else:
                del self.model[each]

    @invariant()
    def listed_as_modelled(self) -> None:
        assert [s.name for s in self.reg.status()] == sorted(self.model)

    def teardown(self) -> None:
        self.reg.close()
        for lease in self.held:  # the requests still running finish after the close
            lease.release()
        assert self.reg.status() == []
        assert _fds() == self.fds
        self._object.__exit__(None, None, None)


RegionsInUse.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
test_regions_in_use = RegionsInUse.TestCase


def test_register_unregister_and_leases_from_many_threads_at_once() -> None:
    with shm_object(4 * 4096) as (key, content), registry() as reg:
        errors: list[BaseException] = []
        start = threading.Barrier(4)

        def work(seed: int) -> None:
            rng = np.random.default_rng(seed)
            held: list[Lease] = []
            try:
                start.wait()
                for _ in range(400):
                    name = "abc"[rng.integers(3)]
                    op = rng.integers(4)
                    try:
                        if op == 0:
                            reg.register(name, key, 4096, 4096)
                        elif op == 1:
                            lease = reg.lease(name, 0, 4096)
                            head = bytearray(16)
                            lease.readinto(memoryview(head))
                            assert head == content[4096 : 4096 + 16]
                            held.append(lease)
                        elif op == 2 and held:
                            held.pop(int(rng.integers(len(held)))).release()
                        else:
                            reg.unregister(name if rng.integers(2) else "")
                    except (SharedMemoryExistsError, SharedMemoryNotFoundError):
                        pass  # another thread got there first
                for lease in held:
                    lease.release()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        reg.unregister()
        assert reg.status() == []  # every lease released: every region gone

"""Shared test setup: every test gets its own device lock directory and a known inventory."""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--long", action="store_true", default=False, help="run long soak tests (tests/faults)"
    )


def pytest_configure(config: pytest.Config) -> None:
    """This test process's own device lock directory, for what starts before a test's own
    (module-scoped daemons): parallel workers, and other test runs on the machine, never take
    each other's devices."""
    lock_dir = tempfile.mkdtemp(prefix="model-runtime-test-devices-")
    os.environ["MODEL_RUNTIME_DIR"] = lock_dir
    config.add_cleanup(lambda: shutil.rmtree(lock_dir, ignore_errors=True))


#: Tests that measure how fast the daemon serves a well-behaved client (attacks, overload,
#: perf_analyzer's load, speed ratios): ``make test`` runs them alone, after the rest has run
#: on parallel workers (``-m "not serial"``, then ``-m serial``), so that another test's load
#: is never what they measure. This list is the only source of the ``serial`` marker: under
#: exactly ``-m serial`` or ``-m "not serial"`` a module of the other kind is not even
#: imported (:func:`pytest_ignore_collect`), and a test marked ``serial`` by hand elsewhere
#: is refused (it would run in neither phase).
SERIAL = (
    "tests/attack/",
    "tests/integration/test_perf_analyzer.py",
    "tests/integration/test_compiled_speed.py",
    "tests/integration/test_daemon_overload.py",
    # Orders of requests sent 0.1 s apart: another worker's load can blur them.
    "tests/integration/test_triton_model_queue.py",
)


#: The modules that take longest, slowest first (``--durations=0`` of a whole ``make test``,
#: summed by module): ``make test`` hands whole modules to its workers in collection order
#: (``--dist loadfile --no-loadscope-reorder``), so these start early and never leave one
#: worker running a long module while the others have nothing left to do. The rest follow by
#: their number of tests, most first.
LONGEST_FIRST = (
    # A loopback Ray cluster of three nodes and Serve, started once for the module.
    "tests/integration/test_ray_serve.py",
    "tests/integration/test_daemon_repository.py",
    "tests/integration/test_access_control.py",
    "tests/integration/test_light_models.py",
    "tests/unit/test_server_codec.py",
    "tests/integration/test_ensembles.py",
    "tests/integration/test_fast_path_attack.py",
    "tests/integration/test_daemon_lifecycle.py",
    "tests/integration/test_generate_endpoint.py",
    "tests/faults/test_fault_injection.py",
    "tests/integration/test_python_models.py",
    "tests/integration/test_triton_flags_daemon.py",
    "tests/integration/test_sequence_flows.py",
    # Few tests, each long: by their count they would come last.
    "tests/integration/test_reuse_port.py",
    "tests/integration/test_closed_loop_slow_model.py",
)


def _is_serial(root: Path, path: Path) -> bool:
    try:
        return path.relative_to(root).as_posix().startswith(SERIAL)
    except ValueError:  # outside the repository
        return False


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under ``-m serial`` (or ``-m "not serial"``) a test module of the other kind is not
    collected: each xdist worker and the serial run import only the modules they may run
    (importing them all costs ~10 s of CPU per process: Ray, scikit-learn, the attack wire)."""
    markexpr = config.getoption("markexpr", "")
    if markexpr not in ("serial", "not serial"):
        return None
    if collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None  # a directory (tests/integration holds both kinds), conftest.py, a helper
    if _is_serial(config.rootpath, collection_path) != (markexpr == "serial"):
        return True
    return None


def _longest_first(root: Path, items: list[pytest.Item]) -> None:
    """Sort ``items`` in place, module by module (see :data:`LONGEST_FIRST`); the tests of a
    module keep their order."""
    paths = {id(item): item.path.relative_to(root).as_posix() for item in items}
    sizes: dict[str, int] = {}
    for path in paths.values():
        sizes[path] = sizes.get(path, 0) + 1
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: (rank.get(paths[id(item)], len(rank)), -sizes[paths[id(item)]]))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = config.rootpath
    for item in items:
        if _is_serial(root, item.path):
            item.add_marker(pytest.mark.serial)
        elif item.get_closest_marker("serial") is not None:
            raise pytest.UsageError(
                f"{item.nodeid} is marked serial by hand: add its module to SERIAL in "
                "tests/conftest.py instead (make test's phases collect by that list)"
            )
    _longest_first(root, items)
    if config.getoption("--long"):
        return
    skip = pytest.mark.skip(reason="soak run: pass --long")
    for item in items:
        if "long" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _isolated_devices(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    """Device locks in a private directory, and four 1-thread cpu devices, unless a test says
    otherwise: tests never contend with each other or with a daemon running on the machine."""
    lock_dir = tmp_path_factory.mktemp("devices")
    monkeypatch.setenv("MODEL_RUNTIME_DIR", str(lock_dir))
    monkeypatch.setenv("MODEL_RUNTIME_DEVICES", "cpu:4x1")
    monkeypatch.delenv("MODEL_RUNTIME_FLAGS", raising=False)
    monkeypatch.delenv("MODEL_RUNTIME_CONFIG", raising=False)
    yield lock_dir


def _uses_gevent_clients(module: object) -> bool:
    names = vars(module).values()
    return any(getattr(v, "__name__", "").startswith("tritonclient.http") for v in names)


@pytest.fixture(autouse=True, scope="module")
def _collect_gevent_clients_of_the_module(request: pytest.FixtureRequest) -> Iterator[None]:
    """After the module (its own module-scoped fixtures torn down first), the heap its tests
    froze (:func:`_collect_gevent_clients`) is thawed and collected, here, on this thread."""
    yield
    if _uses_gevent_clients(request.module):
        gc.unfreeze()
        gc.collect()


@pytest.fixture(autouse=True)
def _collect_gevent_clients(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test of a module that uses tritonclient.http (whose clients run on gevent), collect
    garbage on this thread: a client left in a reference cycle (an exception's traceback) and
    collected later in another test's worker thread raises gevent's InvalidThreadUseError
    there (seen in test_blocking after test_access_control).

    What survives is frozen (``gc.freeze``), so the next test's collection scans only what was
    made since, not the whole worker's heap again: a full collection took 0.1 s in a module run
    alone but 1-4 s late in a worker's session (Ray, scikit-learn, ... imported), ~150 s of the
    parallel phase's ~850 s of tests. A frozen object is collected by no thread until the
    module's end (:func:`_collect_gevent_clients_of_the_module`), on this one."""
    yield
    if _uses_gevent_clients(request.module):
        gc.collect()
        gc.freeze()

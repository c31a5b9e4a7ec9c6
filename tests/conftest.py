"""Shared test setup: every test gets its own device lock directory and a known inventory."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--long", action="store_true", default=False, help="run long soak tests (tests/faults)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
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


@pytest.fixture(autouse=True)
def _collect_gevent_clients(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test of a module that uses tritonclient.http (whose clients run on gevent), collect
    garbage on this thread: a client left in a reference cycle (an exception's traceback) and
    collected later in another test's worker thread raises gevent's InvalidThreadUseError
    there (seen in test_blocking after test_access_control)."""
    yield
    names = vars(request.module).values()
    if any(getattr(v, "__name__", "").startswith("tritonclient.http") for v in names):
        gc.collect()

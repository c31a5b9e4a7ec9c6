"""Imports point one way only, lowest layer first (DESIGN.md §1): the tiers below never import
the ones above, so the actors never reach for the runner and the tree never for the daemon.

Every ``import`` in the source is checked, those under ``TYPE_CHECKING`` included (a type may
name a lower layer only, too).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Lowest first. A module may import its own layer and the layers before it.
LAYERS: list[tuple[str, ...]] = [
    (
        "model_runtime.errors",
        "model_runtime.flags",
        "model_runtime.executable",
        "model_runtime.custom_ops",
        "model_runtime.compiler",
        "model_runtime.io",
        "model_runtime.demo",
        "model_runtime.logs",
    ),
    ("actors",),
    ("supervisor",),
    (
        "model_runtime.runner",
        "model_runtime.runner_config",
        "model_runtime.runner_info",
        "model_runtime.runner_requests",
        "model_runtime.deadlines",
        "model_runtime.queue_policy",
        "model_runtime.replicas",
        "model_runtime.placement",
        "model_runtime.sequences",
        "model_runtime.stats",
        "model_runtime.lowlevel",
        "model_runtime.python_backend",
    ),
    (
        "model_runtime.blocking",
        "model_runtime.embedded",
        "model_runtime.connection",
        "model_runtime.server",
        "model_runtime.ray",
    ),
    ("model_runtime.cli", "model_runtime.__main__"),
]


def layer_of(module: str) -> int | None:
    """The layer of a dotted module name (None: outside the project, or the package itself,
    whose ``__init__`` re-exports lazily and so sits above everything)."""
    best: tuple[int, int] | None = None
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            matches = module == prefix or module.startswith(prefix + ".")
            if matches and (best is None or len(prefix) > best[1]):
                best = (index, len(prefix))
    return None if best is None else best[0]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            # `from model_runtime import custom_ops` imports the submodule
            found.extend((node.lineno, f"{node.module}.{a.name}") for a in node.names)
    return found


SOURCES = sorted(
    p
    for pattern in ("actors/**/*.py", "model_runtime/**/*.py", "supervisor.py")
    for p in ROOT.glob(pattern)
)


def test_every_source_module_has_a_layer() -> None:
    missing = [module_name(p) for p in SOURCES if module_name(p) != "model_runtime"]
    assert [m for m in missing if layer_of(m) is None] == []


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_point_down_the_layers(path: Path) -> None:
    own = layer_of(module_name(path))
    if own is None:
        return  # the package's lazy __init__
    upward = [
        f"line {line}: {name}"
        for line, name in imports(path)
        if (other := layer_of(name)) is not None and other > own
    ]
    assert upward == [], f"{module_name(path)} (layer {own}) imports a higher layer"


#: Inside the daemon (``model_runtime/server/``), lowest first, as for :data:`LAYERS`: the
#: wire-neutral leaves (tensors and their codecs, the answer table, the runner protocol), Triton's
#: model configuration, ensembles' scheduling (handed their step caller), the repository and
#: the security rules, observability, the data plane, the two front ends, and the daemon that
#: wires them.
SERVER_LAYERS: list[tuple[str, ...]] = [
    (
        "model_runtime.server.answers",
        "model_runtime.server.serving",
        "model_runtime.server.tensors",
    ),
    ("model_runtime.server.triton",),
    ("model_runtime.server.ensemble",),
    ("model_runtime.server.repository", "model_runtime.server.security"),
    ("model_runtime.server.observability",),
    ("model_runtime.server.inference",),
    ("model_runtime.server.http", "model_runtime.server.grpc"),
    ("model_runtime.server.daemon",),
]
#: The front ends: each is handed the data plane and never imports the other.
FRONT_ENDS = ("model_runtime.server.http", "model_runtime.server.grpc")


def server_layer_of(module: str) -> int | None:
    """The layer of a module of the daemon in :data:`SERVER_LAYERS` (None: not one)."""
    for index, prefixes in enumerate(SERVER_LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return index
    return None


def _front_end(module: str) -> str | None:
    return next((f for f in FRONT_ENDS if module == f or module.startswith(f + ".")), None)


SERVER_SOURCES = [
    p
    for p in SOURCES
    if module_name(p).startswith("model_runtime.server.")
    and module_name(p) != "model_runtime.server.__main__"
]


def test_every_module_of_the_daemon_has_a_layer() -> None:
    names = [module_name(p) for p in SERVER_SOURCES]
    assert [n for n in names if server_layer_of(n) is None] == []


@pytest.mark.parametrize("path", SERVER_SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_daemon_imports_point_down_and_front_ends_not_across(path: Path) -> None:
    name = module_name(path)
    own, front = server_layer_of(name), _front_end(name)
    assert own is not None
    wrong = [
        f"line {line}: {other}"
        for line, other in imports(path)
        if ((layer := server_layer_of(other)) is not None and layer > own)
        or (front is not None and _front_end(other) not in (None, front))
    ]
    assert wrong == [], f"{name} (daemon layer {own}) imports a higher layer or another front end"

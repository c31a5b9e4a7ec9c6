"""Which custom op libraries may be imported (the allow-list), and importing them.

A library is imported only if its module name is on the allow-list: names given to
:func:`set_allowed_libraries` (``model_runtime.configure(custom_op_libraries=[...])``) and those in
``MODEL_RUNTIME_CUSTOM_OP_ALLOW=mod1,mod2``. Names come from the user, never from a model or an
executable file: a file can only *name* a library, and a name that is not allowed is refused
before anything is imported. The runtime's own expression op library is always allowed.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from model_runtime.custom_ops.api import CustomOp
from model_runtime.errors import ConfigurationError, CustomOpError

__all__ = [
    "ALLOW_ENV",
    "BUILTIN_LIBRARIES",
    "Library",
    "allowed_libraries",
    "load_library",
    "set_allowed_libraries",
]

ALLOW_ENV = "MODEL_RUNTIME_CUSTOM_OP_ALLOW"

#: Libraries that ship with the runtime (always allowed).
BUILTIN_LIBRARIES = frozenset({"model_runtime.custom_ops.expression"})

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_lock = threading.Lock()
_configured: frozenset[str] = frozenset()


def _check_names(names: Iterable[str], source: str) -> frozenset[str]:
    out = set()
    for name in names:
        if not isinstance(name, str) or not _NAME.match(name):
            raise ConfigurationError(
                f"{source}: {name!r} is not a Python module name (expected e.g. 'my_pkg.my_ops')"
            )
        out.add(name)
    return frozenset(out)


def set_allowed_libraries(names: Iterable[str]) -> None:
    """Replace the process-wide allow-list set in code (the environment's list still applies).

    Raises:
        ConfigurationError: a name is not a dotted Python module name.
    """
    global _configured
    checked = _check_names(list(names), "custom_op_libraries")
    with _lock:
        _configured = checked


def allowed_libraries(environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """The allow-list now: configured names, ``MODEL_RUNTIME_CUSTOM_OP_ALLOW`` and built-ins.

    Raises:
        ConfigurationError: the environment variable holds a name that is not a module name.
    """
    env = os.environ if environ is None else environ
    raw = [n.strip() for n in env.get(ALLOW_ENV, "").split(",") if n.strip()]
    return _configured | _check_names(raw, ALLOW_ENV) | BUILTIN_LIBRARIES


@dataclass(frozen=True, slots=True)
class Library:
    """An imported custom op library: its name, ops and source hash."""

    name: str
    ops: Mapping[str, CustomOp]
    hash: str

    def op(self, op_name: str, where: str) -> CustomOp:
        """The op ``op_name``.

        Raises:
            CustomOpError: the library does not declare it (the message lists what it has).
        """
        op = self.ops.get(op_name)
        if op is None:
            have = ", ".join(sorted(self.ops)) or "none"
            raise CustomOpError(
                f"{where}: custom op library {self.name!r} declares no op {op_name!r} "
                f"(it declares: {have}); add it to the library's OPS mapping"
            )
        return op


def library_hash(module: ModuleType) -> str:
    """SHA-256 of the library's source file (``""`` when it has none, e.g. a namespace)."""
    file = getattr(module, "__file__", None)
    if not file:
        return ""
    return hashlib.sha256(Path(file).read_bytes()).hexdigest()


def _not_allowed(name: str, where: str) -> CustomOpError:
    return CustomOpError(
        f"{where}: custom op library {name!r} is not on the allow-list, so it was not imported. "
        f"Allow it with model_runtime.configure(custom_op_libraries=[{name!r}]) or "
        f"{ALLOW_ENV}={name}"
    )


def load_library(
    name: str, where: str, allowed: Iterable[str] | None = None, expected_hash: str | None = None
) -> Library:
    """Import the allowed library ``name`` and read its ``OPS``.

    ``allowed`` overrides the process allow-list (built-ins stay allowed). With
    ``expected_hash`` the library's source must hash to it (the executable was compiled with it).

    Raises:
        CustomOpError: not allowed, not importable, no valid ``OPS`` mapping, or changed since
            the executable was compiled; the message says what to do.
        ConfigurationError: the allow-list environment variable is malformed.
    """
    allow = allowed_libraries() if allowed is None else frozenset(allowed) | BUILTIN_LIBRARIES
    if name not in allow:
        raise _not_allowed(name, where)
    try:
        module = importlib.import_module(name)
    except Exception as exc:
        raise CustomOpError(
            f"{where}: custom op library {name!r} is allowed but cannot be imported: "
            f"{type(exc).__name__}: {exc}. Make sure it is installed / on sys.path"
        ) from exc
    ops = getattr(module, "OPS", None)
    if not isinstance(ops, Mapping) or not ops:
        raise CustomOpError(
            f"{where}: custom op library {name!r} has no OPS mapping; declare "
            "OPS = {'OpName': CustomOp(build=...)} at module level"
        )
    for op_name, op in ops.items():
        if not isinstance(op, CustomOp) or not callable(op.build):
            raise CustomOpError(
                f"{where}: custom op library {name!r}: OPS[{op_name!r}] is not a CustomOp with a "
                "callable build function; declare it as CustomOp(build=my_build, ...)"
            )
    digest = library_hash(module)
    if expected_hash is not None and digest != expected_hash:
        raise CustomOpError(
            f"{where}: custom op library {name!r} changed since the executable was compiled "
            f"(source hash {digest[:12]}, compiled with {expected_hash[:12]}); recompile the model"
        )
    return Library(name=name, ops=dict(ops), hash=digest)

"""``MODEL_RUNTIME_FLAGS``: process-wide flags from the environment (seed: ``TF_POPLAR_FLAGS``).

The value is a shell-like list of ``--name=value`` (or ``--name value``) flags, e.g.
``MODEL_RUNTIME_FLAGS="--executable_cache_path=/tmp/cachedir --max_allocation_bytes=8GiB"``.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from model_runtime.errors import ConfigurationError

__all__ = ["ENV_VAR", "RuntimeFlags", "get_flags", "parse_flags"]

ENV_VAR = "MODEL_RUNTIME_FLAGS"


@dataclass(frozen=True, slots=True)
class RuntimeFlags:
    """Flags set through ``MODEL_RUNTIME_FLAGS``.

    ``executable_cache_path``: directory of the executable cache (``None``: no cache).
    ``max_allocation_bytes``: the most memory one executable may make the runtime allocate up
    front (tensors, ring pools, device copies; see :mod:`model_runtime.executable.limits`),
    in bytes, optionally with a binary suffix (``KiB``, ``MiB``, ``GiB``, ``TiB``; ``K``, ``M``,
    ``G``, ``T`` and ``KB``... mean the same). ``None``: half the memory this process may use.
    """

    executable_cache_path: str | None = None
    max_allocation_bytes: int | None = None


_KNOWN = tuple(f.name for f in fields(RuntimeFlags))
_BYTES = re.compile(r"([0-9]{1,20})\s*(?:([KMGT])(?:iB|B)?|B)?", re.IGNORECASE)


def _byte_count(name: str, value: str) -> int:
    match = _BYTES.fullmatch(value.strip())
    if match is None or int(match[1]) <= 0:
        raise ConfigurationError(
            f"{ENV_VAR}: flag --{name} must be a positive number of bytes "
            f"(e.g. 8589934592 or 8GiB), got {value!r}"
        )
    scale = 1 << (10 * (" KMGT".index(match[2].upper()))) if match[2] else 1
    return int(match[1]) * scale


_CONVERT: dict[str, Callable[[str, str], Any]] = {"max_allocation_bytes": _byte_count}


def parse_flags(text: str) -> RuntimeFlags:
    """Parse a ``MODEL_RUNTIME_FLAGS`` value.

    Raises:
        ConfigurationError: a token is not a ``--flag``, a flag is unknown, has no value or a
            value of the wrong kind; the message names the flag.
    """
    try:
        tokens = shlex.split(text)
    except ValueError as exc:
        raise ConfigurationError(f"{ENV_VAR} does not parse: {exc}") from exc
    values: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("--") or token == "--":
            raise ConfigurationError(f"{ENV_VAR}: expected a --flag, got {token!r}")
        name, eq, value = token[2:].partition("=")
        if name not in _KNOWN:
            raise ConfigurationError(
                f"{ENV_VAR}: unknown flag --{name} (known: {', '.join('--' + k for k in _KNOWN)})"
            )
        if not eq:
            if i + 1 >= len(tokens) or tokens[i + 1].startswith("--"):
                raise ConfigurationError(f"{ENV_VAR}: flag --{name} needs a value")
            i += 1
            value = tokens[i]
        if not value:
            raise ConfigurationError(f"{ENV_VAR}: flag --{name} needs a value")
        convert = _CONVERT.get(name)
        values[name] = value if convert is None else convert(name, value)
        i += 1
    return RuntimeFlags(**values)


def get_flags(environ: Mapping[str, str] | None = None) -> RuntimeFlags:
    """The flags in ``environ`` (default: ``os.environ``), read afresh on every call.

    Raises:
        ConfigurationError: as :func:`parse_flags`.
    """
    env = os.environ if environ is None else environ
    return parse_flags(env.get(ENV_VAR, ""))

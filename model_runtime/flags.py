"""``MODEL_RUNTIME_FLAGS``: process-wide flags from the environment (seed: ``TF_POPLAR_FLAGS``).

The value is a shell-like list of ``--name=value`` (or ``--name value``) flags, e.g.
``MODEL_RUNTIME_FLAGS="--executable_cache_path=/tmp/cachedir"``.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, fields

from model_runtime.errors import ConfigurationError

__all__ = ["ENV_VAR", "RuntimeFlags", "get_flags", "parse_flags"]

ENV_VAR = "MODEL_RUNTIME_FLAGS"


@dataclass(frozen=True, slots=True)
class RuntimeFlags:
    """Flags set through ``MODEL_RUNTIME_FLAGS``.

    ``executable_cache_path``: directory of the executable cache (``None``: no cache).
    """

    executable_cache_path: str | None = None


_KNOWN = tuple(f.name for f in fields(RuntimeFlags))


def parse_flags(text: str) -> RuntimeFlags:
    """Parse a ``MODEL_RUNTIME_FLAGS`` value.

    Raises:
        ConfigurationError: a token is not a ``--flag``, a flag is unknown, or has no value;
            the message names the flag.
    """
    try:
        tokens = shlex.split(text)
    except ValueError as exc:
        raise ConfigurationError(f"{ENV_VAR} does not parse: {exc}") from exc
    values: dict[str, str] = {}
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
        values[name] = value
        i += 1
    return RuntimeFlags(**values)


def get_flags(environ: Mapping[str, str] | None = None) -> RuntimeFlags:
    """The flags in ``environ`` (default: ``os.environ``), read afresh on every call.

    Raises:
        ConfigurationError: as :func:`parse_flags`.
    """
    env = os.environ if environ is None else environ
    return parse_flags(env.get(ENV_VAR, ""))

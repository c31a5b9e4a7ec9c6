"""Triton's response cache (``--cache-config local,size=BYTES``, ``response_cache { enable:
true }`` in a model's config): a request equal to an earlier one is answered with the earlier
one's outputs, without running the model.

Equal means the same model name and version, the same runner (a reload or an unload starts
afresh: entries are keyed by the runner that computed them, dropped when it retires, and a
result computed by a runner already swapped out is never stored), the same inputs (name,
datatype, shape and bytes), the same custom parameters and the same requested outputs. A
request's scheduling and encoding parameters (``timeout``, ``priority``, ``binary_data*``) do
not change its outputs and are not part of it. The key is a 128-bit BLAKE2b digest (Triton's is
a 64-bit hash; the same limitation, a collision serves another request's outputs, at far lower
odds).

One cache serves every model, bounded by its size in bytes (the outputs' bytes plus a fixed
overhead per entry and per tensor): storing past the size evicts the least recently used
entries; outputs larger than the whole cache are not stored (Triton's "Failed to insert key").
Stored outputs are copies, read-only, shared by every response they answer.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from model_runtime.errors import ConfigurationError
from model_runtime.server.tensors.request import InferRequest

__all__ = [
    "CacheSettings",
    "CachedOutputs",
    "ResponseCache",
    "parse_cache_config",
    "request_key",
]

#: Bytes each entry and each of its tensors is counted for beside the tensors' own bytes.
ENTRY_OVERHEAD = 128
TENSOR_OVERHEAD = 64
#: Request parameters that change how a request is scheduled or encoded, not its outputs.
_NOT_KEYED = frozenset(
    {"timeout", "priority", "binary_data_output", "binary_data", "binary_data_size"}
)


class CachedOutputs(dict[str, np.ndarray]):
    """Outputs answered from the cache: the model did not run for them (Triton does not count
    such a request's samples in ``inference_count``)."""


@dataclass(frozen=True, slots=True)
class CacheSettings:
    """``--cache-config``: the cache implementation (only ``local``) and its size in bytes."""

    size: int
    implementation: str = "local"


def parse_cache_config(values: list[str], byte_size: int | None = None) -> CacheSettings | None:
    """The cache Triton's ``--cache-config CACHE,KEY=VALUE`` flags (repeatable) and the
    deprecated ``--response-cache-byte-size N`` ask for (None: no cache).

    Raises:
        ConfigurationError: a malformed value, another implementation than ``local``, several
            implementations, both flags, or a size that is not a whole number of bytes.
    """
    if byte_size is not None and values:
        raise ConfigurationError(
            "--response-cache-byte-size and --cache-config are incompatible flags: give "
            "--cache-config local,size=BYTES only"
        )
    if byte_size is not None:
        values = [f"local,size={byte_size}"]
    settings: dict[str, dict[str, str]] = {}
    for value in values:
        cache, _, rest = value.partition(",")
        key, eq, setting = rest.partition("=")
        if not cache or not key or not eq:
            raise ConfigurationError(
                f"--cache-config {value!r}: expected CACHE,KEY=VALUE (local,size=BYTES)"
            )
        settings.setdefault(cache, {})[key] = setting
    if not settings:
        return None
    if len(settings) > 1:
        raise ConfigurationError(
            f"--cache-config: multiple cache configurations ({', '.join(sorted(settings))}): "
            "give one"
        )
    ((cache, keys),) = settings.items()
    if cache != "local":
        raise ConfigurationError(
            f"--cache-config {cache}: only the 'local' cache is built in (local,size=BYTES)"
        )
    unknown = sorted(set(keys) - {"size"})
    if unknown:
        raise ConfigurationError(f"--cache-config local: unknown setting(s) {unknown} (size)")
    size = keys.get("size", "")
    if not size.isdigit():
        raise ConfigurationError(f"--cache-config local,size={size}: give a size in bytes")
    return CacheSettings(int(size))


def request_key(model: str, version: str, runner: object, request: InferRequest) -> bytes:
    """The cache key of ``request`` to ``model`` ``version`` run by ``runner`` (module
    docstring: what makes two requests equal)."""
    h = hashlib.blake2b(digest_size=16)

    def text(value: str) -> None:
        data = value.encode()
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)

    text(model)
    text(version)
    h.update(id(runner).to_bytes(8, "little"))
    for name in sorted(request.inputs):
        array = request.inputs[name]
        text(name)
        text(array.dtype.str)
        h.update(len(array.shape).to_bytes(8, "little"))
        for d in array.shape:
            h.update(int(d).to_bytes(8, "little"))
        if array.dtype == object:
            for item in array.ravel():
                data = item if isinstance(item, bytes) else str(item).encode()
                h.update(len(data).to_bytes(8, "little"))
                h.update(data)
        else:
            h.update(np.ascontiguousarray(array).data)
    params = {k: v for k, v in request.parameters.items() if k not in _NOT_KEYED}
    text(repr(sorted(params.items())))
    text(repr(sorted((o.name, o.class_count) for o in request.outputs)))
    return h.digest()


def _nbytes(array: np.ndarray) -> int:
    if array.dtype == object:
        return sum(len(x) if isinstance(x, bytes | str) else 8 for x in array.ravel())
    return int(array.nbytes)


@dataclass(slots=True)
class _Entry:
    model: str
    version: str
    outputs: CachedOutputs
    size: int


class ResponseCache:
    """The daemon's response cache (module docstring): least recently used first out."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.used = 0
        self.evictions = 0
        self.insert_failures = 0
        self.lookups = 0
        self.hits = 0
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes) -> CachedOutputs | None:
        """The outputs stored under ``key`` (now the most recently used), or None."""
        self.lookups += 1
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry.outputs

    def put(self, key: bytes, model: str, version: str, outputs: Mapping[str, Any]) -> bool:
        """Store copies of ``outputs`` under ``key``, evicting the least recently used entries
        as the size needs; False (nothing stored) when they alone pass the cache's size."""
        stored = CachedOutputs()
        size = ENTRY_OVERHEAD
        for name, value in outputs.items():
            array = np.array(value, copy=True)
            array.flags.writeable = False
            stored[name] = array
            size += TENSOR_OVERHEAD + len(name) + _nbytes(array)
        if size > self.size:
            self.insert_failures += 1
            return False
        old = self._entries.pop(key, None)
        if old is not None:
            self.used -= old.size
        while self.used + size > self.size:
            _, evicted = self._entries.popitem(last=False)
            self.used -= evicted.size
            self.evictions += 1
        self._entries[key] = _Entry(model, version, stored, size)
        self.used += size
        return True

    def drop(self, model: str, version: str) -> int:
        """Forget every entry of ``model`` ``version`` (its runner retires); how many."""
        keys = [k for k, e in self._entries.items() if e.model == model and e.version == version]
        for key in keys:
            self.used -= self._entries.pop(key).size
        return len(keys)

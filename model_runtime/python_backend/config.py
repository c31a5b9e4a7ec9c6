"""A python model's configuration, from Triton's JSON form (what ``config.pbtxt`` parses into).

Only what the runner acts on is read; the whole dict still reaches the model (``args
["model_config"]``). Dims are per request without the batch dimension when ``max_batch_size`` is
above 0, as in Triton; -1 is any size.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from model_runtime.errors import ConfigurationError
from model_runtime.python_backend.dtypes import numpy_of

__all__ = ["PythonModelConfig", "TensorConfig"]


@dataclass(frozen=True, slots=True)
class TensorConfig:
    name: str
    datatype: str  #: Triton's, without ``TYPE_`` (``FP32``, ``BYTES``)
    dtype: np.dtype[Any]
    dims: tuple[int, ...]
    optional: bool = False


@dataclass(frozen=True, slots=True)
class PythonModelConfig:
    """The parts of a python model's config the runner needs."""

    name: str
    max_batch_size: int
    inputs: tuple[TensorConfig, ...]
    outputs: tuple[TensorConfig, ...]
    instance_count: int
    instance_kind: str
    decoupled: bool
    dynamic_batching: bool
    max_queue_delay_s: float
    preferred_batch_sizes: tuple[int, ...]
    raw: Mapping[str, Any]

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> PythonModelConfig:
        """Raises: ConfigurationError: a field of the wrong type, an unknown data type, a
        negative max_batch_size or instance count (the text names the field)."""
        name = str(config.get("name", ""))
        try:
            mbs = int(config.get("max_batch_size", 0))
            inputs = tuple(_tensor(t, "input") for t in config.get("input", []))
            outputs = tuple(_tensor(t, "output") for t in config.get("output", []))
            count, kind = 0, "KIND_CPU"
            for group in config.get("instance_group", []) or [{}]:
                count += int(group.get("count", 1))
                kind = str(group.get("kind", kind))
            dynamic = config.get("dynamic_batching")
            delay_us = int((dynamic or {}).get("max_queue_delay_microseconds", 0))
            preferred = tuple(int(p) for p in (dynamic or {}).get("preferred_batch_size", []))
            policy = config.get("model_transaction_policy") or {}
            decoupled = bool(policy.get("decoupled", False))
        except (TypeError, ValueError, AttributeError) as exc:
            raise ConfigurationError(f"model {name!r}: the config does not parse: {exc}") from exc
        if mbs < 0 or count < 1 or delay_us < 0:
            raise ConfigurationError(
                f"model {name!r}: max_batch_size ({mbs}), instance count ({count}) and "
                f"max_queue_delay_microseconds ({delay_us}) must not be negative (count >= 1)"
            )
        return cls(
            name, mbs, inputs, outputs, count, kind, decoupled, dynamic is not None,
            delay_us / 1e6, preferred, config,
        )  # fmt: skip


def _tensor(entry: Mapping[str, Any], what: str) -> TensorConfig:
    name = str(entry["name"])
    datatype = str(entry.get("data_type", "TYPE_INVALID"))
    try:
        dtype = numpy_of(datatype)
    except ValueError as exc:
        raise ConfigurationError(f"{what} {name!r}: {exc}") from exc
    plain = datatype.removeprefix("TYPE_")
    plain = "BYTES" if plain == "STRING" else plain
    dims = tuple(int(d) for d in entry.get("dims", []))
    return TensorConfig(name, plain, dtype, dims, bool(entry.get("optional", False)))

"""``dynamic_batching`` of a Triton model configuration -> the model's settings: the batch
timeout, preferred batch sizes, priority levels and the queue policy per level
(:mod:`model_runtime.queue_policy`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from model_runtime.errors import ConfigurationError
from model_runtime.queue_policy import LevelPolicy, QueuePolicy
from model_runtime.server.tensors.parameters import execute_priority
from model_runtime.server.triton import model_config_pb2 as pb

__all__ = ["dynamic_batching"]


def _fail(source: Path | str, field: str, why: str) -> ConfigurationError:
    return ConfigurationError(f"{source}: {field}: {why}")


def dynamic_batching(db: pb.ModelDynamicBatching, where: Path | str, mbs: int) -> dict[str, Any]:
    """``ModelSettings``' fields from ``dynamic_batching`` (``mbs``: the max batch size).

    Raises:
        ConfigurationError: a value we do not serve, naming ``where`` and the field.
    """
    out: dict[str, Any] = {"timeout": max(db.max_queue_delay_microseconds, 1) / 1e6}
    for size in db.preferred_batch_size:
        if not 0 < size <= mbs:
            raise _fail(
                where,
                "dynamic_batching.preferred_batch_size",
                f"{size} must be in 1..max_batch_size ({mbs})",
            )
    if db.preferred_batch_size:
        out["preferred_batch_sizes"] = tuple(sorted(set(db.preferred_batch_size)))
    if db.priority_levels:
        if not 1 <= db.default_priority_level <= db.priority_levels:
            raise _fail(
                where,
                "dynamic_batching.default_priority_level",
                f"must be in 1..priority_levels ({db.priority_levels})",
            )
        out["priority_levels"] = db.priority_levels
        out["default_priority_level"] = db.default_priority_level
    elif db.default_priority_level:
        raise _fail(where, "dynamic_batching.default_priority_level", "needs priority_levels")
    levels = db.priority_levels
    for key in db.priority_queue_policy:
        if not 1 <= key <= levels:
            raise _fail(
                where,
                "dynamic_batching.priority_queue_policy",
                f"level {key} is not one of the priority levels (1..{levels})",
            )
    if db.HasField("default_queue_policy") or db.priority_queue_policy:
        default = _level_policy(db.default_queue_policy)
        by_level = {
            execute_priority(key, levels=levels, default_level=db.default_priority_level): (
                _level_policy(policy)
            )
            for key, policy in db.priority_queue_policy.items()
        }
        if not levels and default.max_queue_size is not None:
            # One level: the model's bound (it replaces the latency budget).
            out["max_queue_size"] = default.max_queue_size
            default = replace(default, max_queue_size=None)
        out["queue_policy"] = QueuePolicy(default, by_level)
    return out


def _level_policy(policy: pb.ModelQueuePolicy) -> LevelPolicy:
    """A ``ModelQueuePolicy`` as :class:`~model_runtime.queue_policy.LevelPolicy` (0: none)."""
    return LevelPolicy(
        delay=policy.timeout_action == pb.ModelQueuePolicy.DELAY,
        default_timeout=policy.default_timeout_microseconds / 1e6 or None,
        allow_timeout_override=policy.allow_timeout_override,
        max_queue_size=policy.max_queue_size or None,
    )

"""Triton's model configuration helpers for ``model.py``, and ``ModelConfig`` for
``auto_complete_config`` (what it may change, and the conflicts it refuses, as Triton does)."""

from __future__ import annotations

import json
from typing import Any

__all__ = [
    "ModelConfig",
    "get_input_config_by_name",
    "get_output_config_by_name",
    "using_decoupled_model_transaction_policy",
]


def _by_name(model_config: dict[str, Any], key: str, name: str) -> dict[str, Any] | None:
    for entry in model_config.get(key, []):
        if entry.get("name") == name:
            return entry  # type: ignore[no-any-return]
    return None


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The config of input ``name`` (a dict), or None."""
    return _by_name(model_config, "input", name)


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The config of output ``name`` (a dict), or None."""
    return _by_name(model_config, "output", name)


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    """Whether the config sets ``model_transaction_policy { decoupled: true }``."""
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


class ModelConfig:
    """The model configuration as ``auto_complete_config`` sees and completes it.

    Only ``max_batch_size``, ``input``, ``output``, ``dynamic_batching`` and
    ``model_transaction_policy`` can be set; what contradicts the given config raises
    ``ValueError`` with Triton's reasons.
    """

    def __init__(self, model_config: str | dict[str, Any]) -> None:
        config = json.loads(model_config) if isinstance(model_config, str) else model_config
        config.setdefault("input", [])
        config.setdefault("output", [])
        config.setdefault("max_batch_size", 0)
        config.setdefault("name", "")
        self._config: dict[str, Any] = config

    def as_dict(self) -> dict[str, Any]:
        return self._config

    def max_batch_size(self) -> int:
        return int(self._config["max_batch_size"])

    def _model(self) -> str:
        return f"model '{self._config['name']}'"

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """Raises: ValueError: the config sets a larger non-zero max_batch_size."""
        given = int(self._config["max_batch_size"])
        if given > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {given}, but in auto-complete-config "
                f"function for {self._model()} specified max_batch_size {max_batch_size}"
            )
        self._config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        """Raises: ValueError: the config schedules by sequence batching or an ensemble."""
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{other}', but "
                    f"auto-complete-config function for {self._model()} tries to set "
                    "scheduling_choice as 'dynamic_batching'"
                )
        self._config.setdefault("dynamic_batching", {})

    def _add(self, key: str, tensor: dict[str, Any], allowed: tuple[str, ...]) -> None:
        what = key  # "input" / "output"
        extra = [p for p in tensor if p not in allowed]
        if extra:
            raise ValueError(
                f"{what} '{tensor.get('name')}' in auto-complete-config function for "
                f"{self._model()} contains property other than {', '.join(allowed)}: {extra}"
            )
        for prop in ("name", "data_type", "dims"):
            if prop not in tensor:
                raise ValueError(
                    f"{what} '{tensor.get('name', '')}' in auto-complete-config function for "
                    f"{self._model()} is missing '{prop}' property."
                )
        for current in self._config[key]:
            if current.get("name") != tensor["name"]:
                continue
            dtype = current.get("data_type", "TYPE_INVALID")
            if dtype != "TYPE_INVALID" and dtype != tensor["data_type"]:
                raise ValueError(
                    f"unable to load {self._model()}, configuration expects datatype {dtype} "
                    f"for {what} '{tensor['name']}', model provides {tensor['data_type']}"
                )
            dims = current.get("dims")
            if dims and list(dims) != list(tensor["dims"]):
                raise ValueError(
                    f"{self._model()}, tensor '{tensor['name']}': the model expects dims "
                    f"{list(tensor['dims'])} but the model configuration specifies dims {dims}"
                )
            if current.get("optional", tensor.get("optional")) != tensor.get(
                "optional", current.get("optional")
            ):
                raise ValueError(
                    f"{self._model()}, tensor '{tensor['name']}': the model expects optional "
                    f"{tensor['optional']} but the model configuration specifies optional "
                    f"{current['optional']}"
                )
            current.update(tensor)
            return
        self._config[key].append(dict(tensor))

    def add_input(self, input: dict[str, Any]) -> None:
        """Raises: ValueError: an unknown or missing property, or a conflict with the config."""
        self._add("input", input, ("name", "data_type", "dims", "optional"))

    def add_output(self, output: dict[str, Any]) -> None:
        """Raises: ValueError: an unknown or missing property, or a conflict with the config."""
        self._add("output", output, ("name", "data_type", "dims"))

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        """Raises: ValueError: a property other than ``decoupled``, or a change of it."""
        extra = [p for p in transaction_policy_dict if p != "decoupled"]
        if extra:
            raise ValueError(
                f"model transaction property in auto-complete-config function for "
                f"{self._model()} contains property other than 'decoupled'."
            )
        policy = self._config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            new = bool(transaction_policy_dict["decoupled"])
            if "decoupled" in policy and bool(policy["decoupled"]) != new:
                raise ValueError(
                    f"trying to change decoupled property in auto-complete-config for "
                    f"{self._model()}, which is already set to '{policy['decoupled']}'."
                )
            policy["decoupled"] = new

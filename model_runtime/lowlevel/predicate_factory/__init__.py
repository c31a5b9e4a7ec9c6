"""Predefined predicates (seed ``predicate_factory``): :mod:`.anchor_callbacks` decides what
callback to bind to an anchor, :mod:`.popef_data_usage` whether stored data feeds it."""

from model_runtime.lowlevel.predicate_factory import anchor_callbacks, popef_data_usage

__all__ = ["anchor_callbacks", "popef_data_usage"]

"""Predefined PopEF data usage predicates (seed ``predicate_factory::popef_data_usage``).

Each builder returns a predicate: anchor -> ``accept_policy`` if the anchor matches,
else ``reject_policy`` (defaults: ``USE_USER_DATA``, ``USE_POPEF_DATA_IF_ANY``).
An anchor is "owned" by the programs listed in ``Anchor.programs``. The builders are one
:class:`~._generic.Namespace`'s.
"""

from __future__ import annotations

from model_runtime.lowlevel.policies import PopefDataUsagePolicy
from model_runtime.lowlevel.predicate_factory._generic import Namespace

__all__ = [
    "and_bind",
    "or_bind",
    "pred_anchors_policies",
    "pred_non_scalar_type",
    "pred_program_flow_load",
    "pred_program_flow_main",
    "pred_program_flow_save",
    "pred_program_indexes",
    "pred_program_not_assigned",
]

ACCEPT = PopefDataUsagePolicy.USE_USER_DATA
REJECT = PopefDataUsagePolicy.USE_POPEF_DATA_IF_ANY
_NAMESPACE = Namespace(PopefDataUsagePolicy, ACCEPT, REJECT)

pred_program_flow_load = _NAMESPACE.pred_program_flow_load
pred_program_flow_main = _NAMESPACE.pred_program_flow_main
pred_program_flow_save = _NAMESPACE.pred_program_flow_save
pred_program_not_assigned = _NAMESPACE.pred_program_not_assigned
pred_non_scalar_type = _NAMESPACE.pred_non_scalar_type
pred_program_indexes = _NAMESPACE.pred_program_indexes
pred_anchors_policies = _NAMESPACE.pred_anchors_policies
and_bind = _NAMESPACE.and_bind
or_bind = _NAMESPACE.or_bind

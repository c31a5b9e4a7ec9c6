"""Predefined anchor callback predicates (seed ``predicate_factory::anchor_callbacks``).

Each builder returns a predicate: anchor -> ``accept_policy`` if the anchor matches,
else ``reject_policy`` (defaults: ``BIND_USER_CB``, ``BIND_EMPTY_CB``).
An anchor is "owned" by the programs listed in ``Anchor.programs``. The builders are one
:class:`~._generic.Namespace`'s.
"""

from __future__ import annotations

from model_runtime.lowlevel.policies import AnchorCallbackPolicy
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

ACCEPT = AnchorCallbackPolicy.BIND_USER_CB
REJECT = AnchorCallbackPolicy.BIND_EMPTY_CB
_NAMESPACE = Namespace(AnchorCallbackPolicy, ACCEPT, REJECT)

pred_program_flow_load = _NAMESPACE.pred_program_flow_load
pred_program_flow_main = _NAMESPACE.pred_program_flow_main
pred_program_flow_save = _NAMESPACE.pred_program_flow_save
pred_program_not_assigned = _NAMESPACE.pred_program_not_assigned
pred_non_scalar_type = _NAMESPACE.pred_non_scalar_type
pred_program_indexes = _NAMESPACE.pred_program_indexes
pred_anchors_policies = _NAMESPACE.pred_anchors_policies
and_bind = _NAMESPACE.and_bind
or_bind = _NAMESPACE.or_bind

"""Predefined anchor callback predicates (seed ``predicate_factory::anchor_callbacks``).

Each returns a predicate: anchor -> ``accept_policy`` if the anchor matches, else
``reject_policy``. An anchor is "owned" by the programs listed in ``Anchor.programs``.
"""

from __future__ import annotations

from collections.abc import Sequence

from model_runtime.executable.model import ProgramFlow
from model_runtime.lowlevel.policies import (
    AnchorCallbackPolicy,
    AnchorCallbackPredicate,
    AnchorWithPolicy,
    ProgramsWithPolicy,
)
from model_runtime.lowlevel.predicate_factory import _generic as g

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

_P = AnchorCallbackPolicy
ACCEPT = AnchorCallbackPolicy.BIND_USER_CB
REJECT = AnchorCallbackPolicy.BIND_EMPTY_CB


def pred_program_flow_load(
    flow: ProgramFlow, accept_policy: _P = ACCEPT, reject_policy: _P = REJECT
) -> AnchorCallbackPredicate:
    """Match anchors owned by any load program of ``flow``.

    Raises:
        InputValidationError: ``flow`` is no ProgramFlow, or a policy of the wrong type.
    """
    return g.owned_by(g.flow_programs(flow, "load"), accept_policy, reject_policy, _P)


def pred_program_flow_main(
    flow: ProgramFlow, accept_policy: _P = ACCEPT, reject_policy: _P = REJECT
) -> AnchorCallbackPredicate:
    """Match anchors owned by a main program of ``flow``.

    Raises:
        InputValidationError: ``flow`` is no ProgramFlow, or a policy of the wrong type.
    """
    return g.owned_by(g.flow_programs(flow, "main"), accept_policy, reject_policy, _P)


def pred_program_flow_save(
    flow: ProgramFlow, accept_policy: _P = ACCEPT, reject_policy: _P = REJECT
) -> AnchorCallbackPredicate:
    """Match anchors owned by any save program of ``flow``.

    Raises:
        InputValidationError: ``flow`` is no ProgramFlow, or a policy of the wrong type.
    """
    return g.owned_by(g.flow_programs(flow, "save"), accept_policy, reject_policy, _P)


def pred_program_not_assigned(
    accept_policy: _P = ACCEPT, reject_policy: _P = REJECT
) -> AnchorCallbackPredicate:
    """Match anchors that no program owns.

    Raises:
        InputValidationError: a policy of the wrong type.
    """
    return g.not_assigned(accept_policy, reject_policy, _P)


def pred_non_scalar_type(
    accept_policy: _P = ACCEPT, reject_policy: _P = REJECT
) -> AnchorCallbackPredicate:
    """Match anchors that are not scalars (a scalar: a tensor of exactly one element).

    Raises:
        InputValidationError: a policy of the wrong type.
    """
    return g.non_scalar(accept_policy, reject_policy, _P)


def pred_program_indexes(
    program_indexes: Sequence[int] | Sequence[ProgramsWithPolicy[_P]],
    accept_policy: _P = ACCEPT,
    reject_policy: _P = REJECT,
) -> AnchorCallbackPredicate:
    """Match anchors owned by any of ``program_indexes``.

    Given :class:`ProgramsWithPolicy` groups instead (the seed's second overload), an anchor
    gets the policy of the first group owning it, else ``reject_policy`` (``accept_policy`` is
    then unused).

    Raises:
        InputValidationError: a mix of ids and groups, or a policy of the wrong type.
    """
    return g.program_indexes(program_indexes, accept_policy, reject_policy, _P)


def pred_anchors_policies(
    accepted_anchors_policies: Sequence[AnchorWithPolicy[_P]], reject_policy: _P = REJECT
) -> AnchorCallbackPredicate:
    """Give each listed anchor (by name) its policy; every other anchor ``reject_policy``.

    Raises:
        InputValidationError: a policy of the wrong type.
    """
    return g.anchors_policies(accepted_anchors_policies, reject_policy, _P)


def and_bind(
    accept_policy: _P, reject_policy: _P, *pred: AnchorCallbackPredicate
) -> AnchorCallbackPredicate:
    """Conjunction: ``accept_policy`` when every predicate answers ``accept_policy``.

    Raises:
        InputValidationError: no predicate, or a policy of the wrong type.
    """
    return g.combine(accept_policy, reject_policy, pred, _P, all_=True)


def or_bind(
    accept_policy: _P, reject_policy: _P, *pred: AnchorCallbackPredicate
) -> AnchorCallbackPredicate:
    """Disjunction: ``accept_policy`` when any predicate answers ``accept_policy``.

    Raises:
        InputValidationError: no predicate, or a policy of the wrong type.
    """
    return g.combine(accept_policy, reject_policy, pred, _P, all_=False)

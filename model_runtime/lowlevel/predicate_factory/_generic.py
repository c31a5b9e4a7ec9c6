"""The predicate builders, generic over the policy enum (both namespaces share them)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from model_runtime.errors import InputValidationError
from model_runtime.executable.model import Anchor, ProgramFlow
from model_runtime.lowlevel.policies import (
    AnchorCallbackPolicy,
    AnchorWithPolicy,
    PopefDataUsagePolicy,
    ProgramsWithPolicy,
)

P = TypeVar("P", AnchorCallbackPolicy, PopefDataUsagePolicy)
Pred = Callable[[Anchor], P]


def _check(policy_type: type[P], *policies: P) -> None:
    for p in policies:
        if not isinstance(p, policy_type):
            raise InputValidationError(f"{p!r} is not a {policy_type.__name__}")


def owned_by(
    programs: Iterable[int], accept: P, reject: P, policy_type: type[P]
) -> Callable[[Anchor], P]:
    _check(policy_type, accept, reject)
    wanted = frozenset(int(p) for p in programs)

    def pred(anchor: Anchor) -> P:
        return accept if wanted.intersection(anchor.programs) else reject

    return pred


def flow_programs(flow: ProgramFlow, part: str) -> tuple[int, ...]:
    if not isinstance(flow, ProgramFlow):
        raise InputValidationError(f"expected a ProgramFlow, got {type(flow).__name__}")
    programs: tuple[int, ...] = getattr(flow, part)
    return programs


def not_assigned(accept: P, reject: P, policy_type: type[P]) -> Callable[[Anchor], P]:
    _check(policy_type, accept, reject)
    return lambda anchor: reject if anchor.programs else accept


def non_scalar(accept: P, reject: P, policy_type: type[P]) -> Callable[[Anchor], P]:
    _check(policy_type, accept, reject)
    return lambda anchor: accept if anchor.tensor_info.num_elements > 1 else reject


def program_indexes(
    programs: Sequence[int] | Sequence[ProgramsWithPolicy[P]],
    accept: P,
    reject: P,
    policy_type: type[P],
) -> Callable[[Anchor], P]:
    if all(isinstance(p, ProgramsWithPolicy) for p in programs) and programs:
        groups = [p for p in programs if isinstance(p, ProgramsWithPolicy)]
        _check(policy_type, reject, *(g.policy for g in groups))
        table = [(frozenset(g.programs_indexes), g.policy) for g in groups]

        def grouped(anchor: Anchor) -> P:
            for ids, policy in table:
                if ids.intersection(anchor.programs):
                    return policy
            return reject

        return grouped
    if any(isinstance(p, ProgramsWithPolicy) for p in programs):
        raise InputValidationError("mix of program ids and ProgramsWithPolicy")
    return owned_by((int(p) for p in programs if not isinstance(p, ProgramsWithPolicy)),
                    accept, reject, policy_type)  # fmt: skip


def anchors_policies(
    accepted: Sequence[AnchorWithPolicy[P]], reject: P, policy_type: type[P]
) -> Callable[[Anchor], P]:
    _check(policy_type, reject, *(a.policy for a in accepted))
    table = {a.name: a.policy for a in accepted}
    return lambda anchor: table.get(anchor.name, reject)


def combine(
    accept: P,
    reject: P,
    preds: Sequence[Callable[[Anchor], P]],
    policy_type: type[P],
    *,
    all_: bool,
) -> Callable[[Anchor], P]:
    _check(policy_type, accept, reject)
    if not preds:
        raise InputValidationError("a combinator needs at least one predicate")
    parts = tuple(preds)
    test = all if all_ else any

    def pred(anchor: Anchor) -> P:
        return accept if test(p(anchor) is accept for p in parts) else reject

    return pred

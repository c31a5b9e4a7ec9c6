"""The predicate builders, generic over the policy enum: :class:`Namespace` is one seed
namespace (``anchor_callbacks``, ``popef_data_usage``) with its policy type and defaults."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Generic, TypeVar

from model_runtime.errors import InputValidationError
from model_runtime.executable.model import Anchor, ProgramFlow
from model_runtime.lowlevel.policies import (
    AnchorCallbackPolicy,
    AnchorWithPolicy,
    PopefDataUsagePolicy,
    ProgramsWithPolicy,
)

P = TypeVar("P", AnchorCallbackPolicy, PopefDataUsagePolicy)
Pred = Callable[[Anchor], P]  #: a predicate answering policies of type P


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


def by_program_indexes(
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


class Namespace(Generic[P]):
    """The seed's nine predicate builders for one policy type, ``accept`` and ``reject`` the
    defaults. Each builder returns a predicate: anchor -> ``accept_policy`` if the anchor
    matches, else ``reject_policy``; an anchor is "owned" by the programs in
    ``Anchor.programs``. Every builder raises :class:`InputValidationError` for a policy of
    the wrong type."""

    def __init__(self, policy_type: type[P], accept: P, reject: P) -> None:
        self._type: type[P] = policy_type
        self.accept: P = accept
        self.reject: P = reject

    def pred_program_flow_load(
        self, flow: ProgramFlow, accept_policy: P | None = None, reject_policy: P | None = None
    ) -> Pred[P]:
        """Match anchors owned by any load program of ``flow`` (InputValidationError: ``flow``
        is no ProgramFlow)."""
        return self._owned(flow, "load", accept_policy, reject_policy)

    def pred_program_flow_main(
        self, flow: ProgramFlow, accept_policy: P | None = None, reject_policy: P | None = None
    ) -> Pred[P]:
        """Match anchors owned by a main program of ``flow`` (InputValidationError: ``flow``
        is no ProgramFlow)."""
        return self._owned(flow, "main", accept_policy, reject_policy)

    def pred_program_flow_save(
        self, flow: ProgramFlow, accept_policy: P | None = None, reject_policy: P | None = None
    ) -> Pred[P]:
        """Match anchors owned by any save program of ``flow`` (InputValidationError: ``flow``
        is no ProgramFlow)."""
        return self._owned(flow, "save", accept_policy, reject_policy)

    def pred_program_not_assigned(
        self, accept_policy: P | None = None, reject_policy: P | None = None
    ) -> Pred[P]:
        """Match anchors that no program owns."""
        return not_assigned(*self._pair(accept_policy, reject_policy), self._type)

    def pred_non_scalar_type(
        self, accept_policy: P | None = None, reject_policy: P | None = None
    ) -> Pred[P]:
        """Match anchors that are not scalars (a scalar: a tensor of exactly one element)."""
        return non_scalar(*self._pair(accept_policy, reject_policy), self._type)

    def pred_program_indexes(
        self,
        program_indexes: Sequence[int] | Sequence[ProgramsWithPolicy[P]],
        accept_policy: P | None = None,
        reject_policy: P | None = None,
    ) -> Pred[P]:
        """Match anchors owned by any of ``program_indexes``.

        Given :class:`ProgramsWithPolicy` groups instead (the seed's second overload), an
        anchor gets the policy of the first group owning it, else ``reject_policy``
        (``accept_policy`` is then unused). A mix of ids and groups: InputValidationError.
        """
        accept, reject = self._pair(accept_policy, reject_policy)
        return by_program_indexes(program_indexes, accept, reject, self._type)

    def pred_anchors_policies(
        self,
        accepted_anchors_policies: Sequence[AnchorWithPolicy[P]],
        reject_policy: P | None = None,
    ) -> Pred[P]:
        """Give each listed anchor (by name) its policy; every other anchor ``reject_policy``."""
        reject = self.reject if reject_policy is None else reject_policy
        return anchors_policies(accepted_anchors_policies, reject, self._type)

    def and_bind(self, accept_policy: P, reject_policy: P, *pred: Pred[P]) -> Pred[P]:
        """Conjunction: ``accept_policy`` when every predicate answers ``accept_policy`` (no
        predicate: InputValidationError)."""
        return combine(accept_policy, reject_policy, pred, self._type, all_=True)

    def or_bind(self, accept_policy: P, reject_policy: P, *pred: Pred[P]) -> Pred[P]:
        """Disjunction: ``accept_policy`` when any predicate answers ``accept_policy`` (no
        predicate: InputValidationError)."""
        return combine(accept_policy, reject_policy, pred, self._type, all_=False)

    def _pair(self, accept: P | None, reject: P | None) -> tuple[P, P]:
        if accept is None:
            accept = self.accept
        return accept, self.reject if reject is None else reject

    def _owned(self, flow: ProgramFlow, part: str, accept: P | None, reject: P | None) -> Pred[P]:
        return owned_by(flow_programs(flow, part), *self._pair(accept, reject), self._type)

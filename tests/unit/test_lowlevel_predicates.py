"""predicate_factory (anchor callbacks and PopEF data usage), ring size multiplier factories,
and SessionConfig validation: each predicate selects exactly the anchors it names."""

from __future__ import annotations

import pytest

from model_runtime.errors import ConfigurationError, InputValidationError
from model_runtime.executable.testing import tiny_executable
from model_runtime.lowlevel import (
    AnchorCallbackPolicy as A,
    AnchorWithPolicy,
    PopefDataUsagePolicy,
    ProgramsWithPolicy,
    SessionConfig,
    ring_size_multiplier_factory,
)
from model_runtime.lowlevel.predicate_factory import anchor_callbacks as ac, popef_data_usage as pd

EXE = tiny_executable()
META = EXE.metadata
FLOW = META.program_flow


def accepted(pred: object, accept: object = A.BIND_USER_CB) -> set[str]:
    return {a.name for a in META.anchors if pred(a) is accept}  # type: ignore[operator]


def test_program_flow_predicates_select_owned_anchors() -> None:
    # tiny: x, y main only; W, b load+main; counter load+main+save; counter_out main
    assert accepted(ac.pred_program_flow_load(FLOW)) == {"W", "b", "counter"}
    main = {"x", "y", "W", "b", "counter", "counter_out"}
    assert accepted(ac.pred_program_flow_main(FLOW)) == main
    assert accepted(ac.pred_program_flow_save(FLOW)) == {"counter"}
    save = ac.pred_program_flow_save(FLOW)
    rejected = {a.name for a in META.anchors if save(a) is A.BIND_EMPTY_CB}
    assert rejected == {"x", "y", "W", "b", "counter_out"}


def test_custom_policies_not_assigned_non_scalar_and_indexes() -> None:
    save = ac.pred_program_flow_save(FLOW, A.SKIP_CB, A.BIND_USER_CB)
    assert accepted(save, A.SKIP_CB) == {"counter"}
    assert accepted(ac.pred_program_not_assigned()) == set()
    assert accepted(ac.pred_non_scalar_type()) == {"x", "y", "W", "b"}
    assert accepted(ac.pred_program_indexes([2])) == {"counter"}
    grouped = ac.pred_program_indexes(
        [ProgramsWithPolicy((2,), A.SKIP_CB), ProgramsWithPolicy((1,), A.BIND_USER_CB)],
        reject_policy=A.BIND_EMPTY_CB,
    )
    assert accepted(grouped, A.SKIP_CB) == {"counter"}
    assert accepted(grouped) == {"x", "y", "W", "b", "counter_out"}
    by_anchor = ac.pred_anchors_policies([AnchorWithPolicy("y", A.SKIP_CB)])
    assert accepted(by_anchor, A.SKIP_CB) == {"y"}
    assert accepted(by_anchor, A.BIND_EMPTY_CB) == {a.name for a in META.anchors} - {"y"}


def test_and_or_combinators() -> None:
    main_non_scalar = ac.and_bind(
        A.BIND_USER_CB, A.SKIP_CB, ac.pred_program_flow_main(FLOW), ac.pred_non_scalar_type()
    )
    assert accepted(main_non_scalar) == {"x", "y", "W", "b"}
    save_or_x = ac.or_bind(
        A.BIND_USER_CB,
        A.SKIP_CB,
        ac.pred_program_flow_save(FLOW),
        ac.pred_anchors_policies([AnchorWithPolicy("x", A.BIND_USER_CB)]),
    )
    assert accepted(save_or_x) == {"counter", "x"}


def test_popef_data_usage_predicates() -> None:
    pred = pd.pred_program_flow_load(FLOW)
    assert accepted(pred, PopefDataUsagePolicy.USE_USER_DATA) == {"W", "b", "counter"}
    both = pd.or_bind(
        PopefDataUsagePolicy.USE_USER_DATA,
        PopefDataUsagePolicy.USE_POPEF_DATA_IF_ANY,
        pd.pred_anchors_policies([AnchorWithPolicy("W", PopefDataUsagePolicy.USE_USER_DATA)]),
        pd.pred_program_flow_save(FLOW),
    )
    assert accepted(both, PopefDataUsagePolicy.USE_USER_DATA) == {"W", "counter"}


def test_bad_predicate_arguments_are_typed_errors() -> None:
    with pytest.raises(InputValidationError):
        ac.pred_program_flow_load(FLOW, PopefDataUsagePolicy.USE_USER_DATA)  # type: ignore[arg-type]
    with pytest.raises(InputValidationError):
        ac.and_bind(A.BIND_USER_CB, A.SKIP_CB)
    with pytest.raises(InputValidationError):
        ac.pred_program_flow_main("not a flow")  # type: ignore[arg-type]


def test_ring_size_multiplier_factories() -> None:
    by_main = ring_size_multiplier_factory.ring_size_mult_for_main_progs(EXE, 4)
    assert {a.name: by_main(a) for a in META.anchors if a.name in ("x", "counter")} == {
        "x": 4,
        "counter": 4,  # counter is owned by the main program too
    }
    by_save = ring_size_multiplier_factory.ring_size_mult_for_progs([2], 3, 1)
    assert by_save(META.anchor("counter")) == 3 and by_save(META.anchor("x")) == 1
    with pytest.raises(ConfigurationError):
        ring_size_multiplier_factory.ring_size_mult_for_progs([1], 0)


def test_session_config_look_ahead() -> None:
    assert SessionConfig().look_ahead == float("inf")
    assert SessionConfig(max_look_ahead="3").look_ahead == 3.0
    for bad in ("-1", "lots", -2, True):
        with pytest.raises(ConfigurationError):
            SessionConfig(max_look_ahead=bad)

"""Fault-plan windows (``from=``/``until=``) and one injector shared across device restarts."""

from __future__ import annotations

import threading

import pytest

from actors.device.faults import FaultInjector, FaultKind, FaultPlan, FaultRule
from model_runtime.errors import FaultPlanError, RecoveryAction


def _fired(inj: FaultInjector, n: int) -> list[int]:
    """The run numbers (from the injector's next run on) on which some rule fires, of ``n``."""
    out = []
    for _ in range(n):
        if inj.next_run() is not None:
            out.append(inj.iteration)
    return out


def _kinds(plan: FaultPlan, n: int, replica: int = 0) -> list[str | None]:
    inj = plan.for_replica(replica)
    return [(r.kind.value if (r := inj.next_run()) else None) for _ in range(n)]


# -- parse / str ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "recoverable:every=2:from=100:until=140",
        "fatal:every=1:from=10",
        "hang:at=5:until=9",
        "app_error:p=0.25:from=3:until=3",
        "slow:every=4:from=2:until=8:seconds=0.5:replica=1",
        "recoverable:at=7:from=7:until=7:action=LINK_RESET:replica=0;crash:every=3:until=12",
    ],
)
def test_windows_round_trip_through_the_string_form(text: str) -> None:
    plan = FaultPlan.parse(text, seed=5)
    assert str(plan) == text
    assert FaultPlan.parse(str(plan), seed=5) == plan


def test_window_keys_map_to_start_and_until_fields() -> None:
    plan = FaultPlan.parse(" recoverable : every=2 : until=140 : from=100 ; fatal:every=1:from=10")
    assert plan.rules == (
        FaultRule(FaultKind.RECOVERABLE, every=2, start=100, until=140),
        FaultRule(FaultKind.FATAL, every=1, start=10),
    )
    # the string form writes from= before until=, whatever order they were given in
    assert str(plan) == "recoverable:every=2:from=100:until=140;fatal:every=1:from=10"
    built = FaultRule(
        FaultKind.RECOVERABLE, at=4, start=2, until=6, action=RecoveryAction.FULL_RESET
    )
    assert str(built) == "recoverable:at=4:from=2:until=6:action=FULL_RESET"
    assert FaultPlan.parse(str(FaultPlan([built], seed=9)), seed=9) == FaultPlan([built], seed=9)
    assert FaultRule(FaultKind.HANG, every=3).start is None
    assert FaultRule(FaultKind.HANG, every=3).until is None


# -- which runs fire --------------------------------------------------------------------------


def test_every_fires_on_absolute_runs_inside_the_window_only() -> None:
    inj = FaultPlan.parse("recoverable:every=2:from=100:until=140").for_replica(0)
    assert _fired(inj, 300) == list(range(100, 141, 2))
    odd = FaultPlan.parse("recoverable:every=2:from=101:until=139").for_replica(0)
    assert _fired(odd, 300) == list(range(102, 139, 2))  # both ends odd: neither fires


def test_window_bounds_are_inclusive_at_both_ends() -> None:
    inj = FaultPlan.parse("app_error:every=1:from=3:until=5").for_replica(0)
    assert _fired(inj, 10) == [3, 4, 5]
    one = FaultPlan.parse("app_error:every=1:from=4:until=4").for_replica(0)
    assert _fired(one, 10) == [4]


def test_open_ended_windows() -> None:
    assert _fired(FaultPlan.parse("fatal:every=1:from=10").for_replica(0), 20) == list(
        range(10, 21)
    )
    assert _fired(FaultPlan.parse("hang:every=3:until=10").for_replica(0), 30) == [3, 6, 9]


def test_at_inside_its_window_fires_once() -> None:
    inj = FaultPlan.parse("hang:at=7:from=5:until=9").for_replica(0)
    assert _fired(inj, 50) == [7]
    assert _fired(FaultPlan.parse("hang:at=5:from=5").for_replica(0), 20) == [5]
    assert _fired(FaultPlan.parse("hang:at=9:until=9").for_replica(0), 20) == [9]


def test_a_window_that_ends_leaves_later_runs_clean() -> None:
    plan = FaultPlan.parse("recoverable:every=1:from=3:until=6;app_error:p=1.0:until=8", seed=2)
    kinds = _kinds(plan, 40)
    assert kinds[:8] == [
        "app_error",
        "app_error",
        "recoverable",  # first rule in the plan wins while both fire
        "recoverable",
        "recoverable",
        "recoverable",
        "app_error",
        "app_error",
    ]
    assert kinds[8:] == [None] * 32


def test_p_rules_draw_on_every_run_so_windows_never_shift_the_draws() -> None:
    n = 400
    plain = FaultPlan.parse("app_error:p=0.3", seed=4).for_replica(0)
    hits = _fired(plain, n)
    assert 60 <= len(hits) <= 180  # sanity: p=0.3 of 400
    windowed = FaultPlan.parse("app_error:p=0.3:from=100:until=250", seed=4).for_replica(0)
    # same draws, filtered by the window: the runs before it consumed their draws too
    assert _fired(windowed, n) == [i for i in hits if 100 <= i <= 250]
    # a windowed p= rule earlier in the plan draws on every run, so the rule after it sees the
    # same draws as behind a rule that never draws at all (it fires where the first does not)
    lead = FaultPlan.parse("recoverable:p=0.5:from=1:until=2;app_error:p=0.3", seed=4)
    ref = FaultPlan.parse("recoverable:every=100000;app_error:p=0.3", seed=4)
    ref_hits = [i for i, r in enumerate(_kinds(ref, n), 1) if r == "app_error"]
    lead_hits = [i for i, r in enumerate(_kinds(lead, n), 1) if r == "app_error"]
    assert [i for i in lead_hits if i > 2] == [i for i in ref_hits if i > 2]


def test_p_window_with_replica_filter_is_deterministic_per_replica() -> None:
    plan = FaultPlan.parse("app_error:p=0.5:from=10:until=60;hang:every=5:replica=1", seed=8)
    a = _kinds(plan, 100, replica=0)
    assert a == _kinds(plan, 100, replica=0)
    assert all(k is None for k in a[:9] + a[60:])
    assert any(k == "app_error" for k in a[9:60])
    b = _kinds(plan, 100, replica=1)
    assert [i for i, k in enumerate(b, 1) if k == "hang"] == [
        i for i in range(5, 101, 5) if not (10 <= i <= 60 and b[i - 1] == "app_error")
    ]


# -- validation -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "bad"),
    [
        ("recoverable:every=2:from=0", "from= must be >= 1"),
        ("recoverable:every=2:from=-3", "from= must be >= 1"),
        ("recoverable:every=2:until=0", "until= must be >= 1"),
        ("recoverable:every=2:from=10:until=9", "until= must be >= from="),
        ("hang:at=4:from=5", "at= must lie within"),
        ("hang:at=10:until=9", "at= must lie within"),
        ("hang:at=3:from=4:until=8", "at= must lie within"),
        ("hang:at=9:from=4:until=8", "at= must lie within"),
        ("fatal:every=1:from=x", "bad value for from"),
        ("fatal:every=1:until=1.5", "bad value for until"),
        ("fatal:every=1:from=2:from=3", "from= given twice"),
        ("fatal:every=1:until=2:until=3", "until= given twice"),
        ("fatal:every=1:start=2", "unknown key 'start'"),
        ("fatal:every=1:from", "'from' is not KEY=VALUE"),
    ],
)
def test_bad_windows_raise_naming_the_rule(text: str, bad: str) -> None:
    with pytest.raises(FaultPlanError, match=bad) as err:
        FaultPlan.parse(f"crash:at=1;{text}")
    assert repr(text) in str(err.value)  # names the rule, not the plan


def test_unknown_key_message_lists_the_window_keys() -> None:
    with pytest.raises(FaultPlanError, match=r"known: every, at, p, from, until, replica"):
        FaultPlan.parse("fatal:at=1:colour=red")


@pytest.mark.parametrize(
    ("kw", "bad"),
    [
        ({"every": 1, "start": 0}, "from= must be >= 1"),
        ({"every": 1, "until": 0}, "until= must be >= 1"),
        ({"every": 1, "start": 5, "until": 4}, "until= must be >= from="),
        ({"at": 1, "start": 2}, "at= must lie within"),
    ],
)
def test_bad_windows_raise_from_the_dataclass_too(kw: dict[str, int], bad: str) -> None:
    with pytest.raises(FaultPlanError, match=bad) as err:
        FaultRule(FaultKind.HANG, **kw)  # type: ignore[arg-type]
    assert "fault rule hang:" in str(err.value)


# -- one injector per replica, across device restarts -----------------------------------------


def test_one_injector_shared_across_restarts_fires_at_once() -> None:
    plan = FaultPlan.parse("hang:at=3;recoverable:every=1:from=6:until=7", seed=1)
    inj = plan.for_replica(2)
    assert inj.plan is plan and inj.replica == 2
    # first Device: runs 1..3, the hang fires on run 3, then the device is restarted
    assert [r.kind.value if r else None for r in (inj.next_run() for _ in range(3))] == [
        None,
        None,
        "hang",
    ]
    # the next Device keeps the same injector: counting goes on, at=3 never fires again
    later = [(inj.iteration, r.kind.value) for _ in range(20) if (r := inj.next_run())]
    assert later == [(6, "recoverable"), (7, "recoverable")]
    assert inj.iteration == 23


def test_next_run_is_thread_safe_across_overlapping_workers() -> None:
    plan = FaultPlan.parse("app_error:at=500;slow:p=0.1", seed=3)
    inj = plan.for_replica(0)
    fired: list[FaultRule | None] = []
    lock = threading.Lock()

    def worker() -> None:
        got = [inj.next_run() for _ in range(250)]
        with lock:
            fired.extend(got)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert inj.iteration == 1000
    assert sum(1 for r in fired if r is not None and r.kind is FaultKind.APP_ERROR) == 1
    serial = plan.for_replica(0)
    assert sum(1 for _ in range(1000) if serial.next_run() is not None) == sum(
        1 for r in fired if r is not None
    )

"""Wait configs, inventory parsing (env and TOML) and fault plan parsing: good and bad input."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from actors.device.faults import FaultKind, FaultPlan, FaultRule
from actors.device.inventory import (
    DeviceSpec,
    default_inventory,
    inventory_from_toml,
    load_inventory,
    parse_devices,
)
from actors.device.wait import DeviceConstraints, DeviceWaitConfig, DeviceWaitStrategy
from model_runtime.errors import ConfigurationError, FaultPlanError, RecoveryAction


def test_wait_config_defaults_are_the_seeds() -> None:
    c = DeviceWaitConfig()
    assert (c.strategy, c.timeout, c.sleep_time) == (DeviceWaitStrategy.NO_WAIT, 0.0, 15.0)
    t = DeviceWaitConfig.with_timeout(30)
    assert (t.strategy, t.timeout, t.sleep_time) == (DeviceWaitStrategy.WAIT_WITH_TIMEOUT, 30, 15)
    assert not DeviceConstraints() and DeviceConstraints(True)


@pytest.mark.parametrize(
    "kw", [{"timeout": -1.0}, {"sleep_time": -0.5}, {"timeout": math.nan}, {"sleep_time": math.inf}]
)
def test_negative_or_absurd_durations_are_configuration_errors(kw: dict[str, float]) -> None:
    with pytest.raises(ConfigurationError, match=r"timeout|sleep_time"):
        DeviceWaitConfig(DeviceWaitStrategy.WAIT_WITH_TIMEOUT, **kw)


def test_devices_env_groups() -> None:
    assert parse_devices("cpu:2x1") == [DeviceSpec(0, "cpu", 1), DeviceSpec(1, "cpu", 1)]
    specs = parse_devices("cpu:1x2, cpu:1x1,ipu-model:1")
    assert [(s.id, s.kind, s.threads) for s in specs] == [
        (0, "cpu", 2),
        (1, "cpu", 1),
        (2, "ipu-model", 1),
    ]
    assert specs[2].tiles_per_ipu == 1472 and specs[2].memory_per_tile == 624 * 1024


@pytest.mark.parametrize(
    ("text", "bad"),
    [
        ("cpu", "'cpu'"),
        ("cpu:2x1,gpu:1x1", "gpu"),
        ("cpu:0x1", "count"),
        ("cpu:1x0", "threads"),
        ("cpu:two", "'cpu:two'"),
        (",", "no device groups"),
        ("cpu:2x1:shared", "'cpu:2x1:shared'"),
    ],
)
def test_malformed_devices_env_names_the_bad_part(text: str, bad: str) -> None:
    with pytest.raises(ConfigurationError, match=bad):
        parse_devices(text)


def test_env_wins_over_config_file_and_default_is_one_device_per_core(tmp_path: Path) -> None:
    cfg = tmp_path / "rt.toml"
    cfg.write_text(
        '[[devices]]\nkind = "cpu"\ncount = 3\nthreads = 2\n\n'
        '[[devices]]\nkind = "ipu-model"\nipu_version = 1\n'
    )
    specs = load_inventory({"MODEL_RUNTIME_CONFIG": str(cfg)})
    assert [(s.kind, s.threads) for s in specs] == [("cpu", 2)] * 3 + [("ipu-model", 1)]
    assert specs[3].tiles_per_ipu == 1216 and specs[3].memory_per_tile == 256 * 1024
    env = {"MODEL_RUNTIME_CONFIG": str(cfg), "MODEL_RUNTIME_DEVICES": "cpu:1x1"}
    assert len(load_inventory(env)) == 1
    default = load_inventory({})
    assert default == default_inventory() and all(s.threads == 1 for s in default)
    assert len(default) >= 1


@pytest.mark.parametrize(
    ("text", "bad"),
    [
        ('[[devices]]\nkind = "tpu"\n', "tpu"),
        ('[[devices]]\nkind = "cpu"\ncolour = 1\n', "colour"),
        ('[[devices]]\nkind = "ipu-model"\nipu_version = 7\n', "version 7"),
        ('[[devices]]\nkind = "ipu-model"\nexclusive = false\n', "always exclusive"),
        ('[[devices]]\nkind = "cpu"\nexclusive = "yes"\n', "exclusive must be true or false"),
        ("[[devices]\n", "not valid TOML"),
    ],
)
def test_malformed_config_file(tmp_path: Path, text: str, bad: str) -> None:
    cfg = tmp_path / "rt.toml"
    cfg.write_text(text)
    with pytest.raises(ConfigurationError, match=bad):
        inventory_from_toml(cfg)
    with pytest.raises(ConfigurationError, match="cannot read"):
        inventory_from_toml(tmp_path / "missing.toml")


def test_cpu_devices_are_shareable_unless_exclusive_and_ipu_models_never(tmp_path: Path) -> None:
    assert all(s.shareable and not s.exclusive for s in default_inventory())
    specs = parse_devices("cpu:1x1,cpu:2x1:exclusive,ipu-model:1:exclusive,ipu-model:1")
    assert [(s.kind, s.exclusive, s.shareable) for s in specs] == [
        ("cpu", False, True),
        ("cpu", True, False),
        ("cpu", True, False),
        ("ipu-model", False, False),
        ("ipu-model", False, False),
    ]
    assert specs[1].describe() == "device 1 (cpu, 1 thread, exclusive)"
    cfg = tmp_path / "rt.toml"
    cfg.write_text('[[devices]]\ncount = 2\nexclusive = true\n\n[[devices]]\nkind = "cpu"\n')
    assert [s.shareable for s in inventory_from_toml(cfg)] == [False, False, True]


def test_fault_plan_parses_and_round_trips() -> None:
    text = (
        "recoverable:every=50;hang:at=120;app_error:p=0.01;slow:every=10:seconds=0.05;"
        "recoverable:every=7:action=LINK_RESET:replica=1"
    )
    plan = FaultPlan.parse(text, seed=3)
    assert [r.kind for r in plan.rules] == [
        FaultKind.RECOVERABLE,
        FaultKind.HANG,
        FaultKind.APP_ERROR,
        FaultKind.SLOW,
        FaultKind.RECOVERABLE,
    ]
    assert plan.rules[4] == FaultRule(
        FaultKind.RECOVERABLE, every=7, action=RecoveryAction.LINK_RESET, replica=1
    )
    assert str(plan) == text
    assert FaultPlan.parse(str(plan), seed=3) == plan
    assert FaultPlan.parse("") == FaultPlan() and not FaultPlan()


@pytest.mark.parametrize(
    ("text", "bad"),
    [
        ("explode:every=3", "explode"),
        ("hang", "exactly one"),
        ("hang:every=2:at=3", "exactly one"),
        ("app_error:every=0", "every= must be"),
        ("app_error:p=1.5", "p= must be"),
        ("recoverable:every=2:action=REBOOT", "action"),
        ("hang:at=2:seconds=1", "seconds= only applies"),
        ("slow:every=x", "bad value for every"),
        ("crash:at=1;slow:every", "'slow:every'"),
        ("fatal:at=1:colour=red", "unknown key"),
    ],
)
def test_malformed_fault_strings_name_the_bad_rule(text: str, bad: str) -> None:
    with pytest.raises(FaultPlanError, match=bad):
        FaultPlan.parse(text)


def test_fault_injector_every_at_p_and_replica_filter_are_deterministic() -> None:
    plan = FaultPlan.parse("app_error:every=3;hang:at=4;recoverable:every=2:replica=1", seed=7)
    fired0 = [(r.kind.value if r else None) for r in _run(plan, 0, 6)]
    assert fired0 == [None, None, "app_error", "hang", None, "app_error"]
    fired1 = [(r.kind.value if r else None) for r in _run(plan, 1, 6)]
    # first matching rule in plan order wins: run 4 hangs, though every=2 matches too
    assert fired1 == [None, "recoverable", "app_error", "hang", None, "app_error"]
    p = FaultPlan.parse("app_error:p=0.2", seed=11)
    a = [i for i, r in enumerate(_run(p, 0, 500), 1) if r]
    assert a == [i for i, r in enumerate(_run(p, 0, 500), 1) if r]  # same seed, same runs
    assert 60 <= len(a) <= 140
    assert a != [i for i, r in enumerate(_run(p, 1, 500), 1) if r]  # another replica differs
    other = FaultPlan.parse("app_error:p=0.2", seed=12)
    assert a != [i for i, r in enumerate(_run(other, 0, 500), 1) if r]


def _run(plan: FaultPlan, replica: int, n: int) -> list[FaultRule | None]:
    inj = plan.for_replica(replica)
    return [inj.next_run() for _ in range(n)]

"""Replicas on devices that compute on this host's cores share them with the event loop: one
whose device's threads do not fit in the cores left stands by (``host_standby``), and
``pick`` gives it a request only while no other replica is in service.

On a 2-core host a second cpu device beside the first and the loop made three threads for two
cores, and served less than one device (docs/architecture.md, "Replicas and the host's
cores")."""

from __future__ import annotations

import pytest
from test_routing_fill import _replicas

from actors.clock import FakeClock
from actors.device.inventory import DeviceSpec
from actors.session.state import ReplicaStatus
from model_runtime.errors import ConfigurationError
from model_runtime.placement import JOIN_HOPS, host_standby
from model_runtime.runner_config import ModelRunnerConfig


def cpu(threads: int = 1, kind: str = "cpu") -> DeviceSpec:
    return DeviceSpec(id=0, kind=kind, threads=threads)


@pytest.mark.parametrize(
    ("specs", "cores", "standby"),
    [
        ([cpu(), cpu()], 2, {1}),  # the loop's core and replica 0's
        ([cpu(), cpu()], 3, set()),
        ([cpu(), cpu(), cpu()], 3, {2}),
        ([cpu(2), cpu(2)], 4, {1}),  # 3 cores left: 2 for replica 0, 1 < 2
        ([cpu(2), cpu(1)], 4, set()),
        ([cpu(4), cpu()], 2, {1}),  # the first is always served, even past the cores
        ([cpu()], 1, set()),
        ([cpu(), cpu(kind="ipu-model")], 2, {1}),  # an ipu-model computes on the host too
        ([cpu(kind="ipu-model"), cpu(), cpu()], 3, {2}),
    ],
)
def test_replicas_past_the_cores_the_loop_leaves_stand_by(
    specs: list[DeviceSpec], cores: int, standby: set[int]
) -> None:
    mask = host_standby(specs, cores)
    assert {r for r in range(len(specs)) if mask >> r & 1} == standby


def test_a_device_computing_elsewhere_takes_no_core() -> None:
    gpu = DeviceSpec(id=0, kind="cuda", threads=1)  # (no such kind yet: the rule's gate)
    assert host_standby([gpu, gpu, cpu()], 1) == 0


def test_the_replica_standing_by_takes_requests_only_while_the_other_is_out() -> None:
    clock = FakeClock()
    rs, queues = _replicas(2, clock)
    rs.stand_by(0b10)
    assert rs.sole() == 0 and rs.standing_by(1) and not rs.standing_by(0)
    assert {rs.pick(None) for _ in range(20)} == {0}
    queues[0].busy = True  # every buffer of replica 0 in use: still no second device
    assert {rs.pick(None) for _ in range(20)} == {0}
    # Out of service (a reset), hung, or failed: replica 1 serves; back in service: replica 0.
    for status in (ReplicaStatus.RESETTING, ReplicaStatus.FAILED):
        rs.states[0].status = status
        assert rs.pick(None) == 1
        rs.states[0].status = ReplicaStatus.READY
        assert rs.pick(None) == 0
    rs.states[0].hung_after = clock.monotonic()
    assert rs.pick(None) == 1
    rs.states[0].hung_after = float("inf")
    assert rs.pick(None) == 0
    # A request that failed on replica 0 goes to replica 1; one named by replica_id goes there.
    assert rs.pick(None, avoid=0b01) == 1
    assert rs.pick(1) == 1


def test_while_batches_are_heavy_the_replica_past_the_cores_serves() -> None:
    """Whole batches of many hand-offs each leave the loop idle most of the time: a second
    device pays even without a core to itself."""
    rs, queues = _replicas(2, FakeClock())
    rs.stand_by(0b10)
    rs.states[0].batch_hops = JOIN_HOPS  # measured on the replica in service
    queues[0].batches = 1  # running: the idle one takes the next request
    assert rs.pick(None) == 1
    for state in rs.states:
        state.seconds_per_sample = 0.001
    queues[0].pending_samples = 100
    assert rs.backlog_seconds(0) == pytest.approx(0.05)  # both serve
    rs.states[0].batch_hops = JOIN_HOPS / 2  # light again: replica 1 stands by
    assert rs.pick(None) == 0
    assert rs.backlog_seconds(0) == pytest.approx(0.1)


def test_with_every_replica_in_service_none_stands_by() -> None:
    rs, queues = _replicas(2, FakeClock())
    rs.stand_by(0)
    assert rs.sole() == -1
    queues[0].busy = queues[1].busy = False
    queues[0].batches = 1  # replica 0 running: the idle one takes the next request
    assert rs.pick(None) == 1
    rs.stand_by(0b11)  # every replica standing by: the first serves all the same
    assert rs.sole() == 0 and not rs.standing_by(0)


def test_admission_prices_work_at_the_rate_of_the_replicas_in_service() -> None:
    rs, queues = _replicas(2, FakeClock())
    for state in rs.states:
        state.seconds_per_sample = 0.001
    queues[0].pending_samples = 100
    assert rs.backlog_seconds(0) == pytest.approx(0.05)  # both serve: 2000 samples/s
    rs.stand_by(0b10)
    assert rs.backlog_seconds(0) == pytest.approx(0.1)  # replica 0 alone
    rs.states[0].status = ReplicaStatus.RESETTING
    assert rs.backlog_seconds(0) == pytest.approx(0.1)  # replica 1 alone


@pytest.mark.parametrize("cores", [0, -1, 1.5, True, "2"])
def test_host_cores_must_be_a_count_of_cores(cores: object) -> None:
    with pytest.raises(ConfigurationError, match="host_cores"):
        ModelRunnerConfig(host_cores=cores).validate()  # type: ignore[arg-type]

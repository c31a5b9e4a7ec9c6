"""Triton's ``L0_model_queue`` (and ``L0_http`` ``test_descriptive_status_code``) against the
daemon, over HTTP and gRPC: a model's queue policy per priority level. Past its level's timeout
a request still waiting is rejected in Triton's words (REJECT, 503 / UNAVAILABLE) or waits on
behind the requests of its level that are still on time (DELAY); a request's own timeout counts
only where ``allow_timeout_override`` says so; ``priority_levels`` order the queue and each
level bounds its own queue (``max_queue_size``, "Exceeds maximum queue size").

Triton's tests hold requests in its dynamic batcher with a model that sleeps, and with
``max_queue_delay`` waits, since its batcher waits for a preferred batch size even on an idle
instance. Ours runs a lone request at once on an idle device, so requests queue here behind a
busy device: every batch takes 0.5 s longer (the fault plan's ``slow``), and each case first
sends ``X``, a request that keeps the device busy while the others arrive. The models are
Triton's ``custom_zero_1_float32`` as ONNX identities (FP32 ``[-1]``, batched), each with the
case's ``dynamic_batching``. Triton's ensemble variant is out of reach here (another helper
builds ensembles).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.integration.test_daemon_support import Daemon, start_daemon, stop_daemon
from tests.triton_qa_models import write_identity

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

#: Every batch runs this much longer: the device stays busy while a case's requests arrive
#: (0.1 s or more apart, so that they arrive in order on a busy host). Under the 1 s floor of
#: the execution deadline, past which a run counts as hung.
SLOW = 0.5
_BATCHING = "preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 2000000"
MODELS = {
    "delay": "default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 100000 }",
    "reject": "default_queue_policy { default_timeout_microseconds: 100000 }",
    "no_override": "default_queue_policy { default_timeout_microseconds: 5000000 }",
    "override": (
        "default_queue_policy { allow_timeout_override: true "
        "default_timeout_microseconds: 5000000 }"
    ),
    "priority": "priority_levels: 2 default_priority_level: 2",
    "priority_bounded": (
        "priority_levels: 2 default_priority_level: 2 default_queue_policy { max_queue_size: 1 }"
    ),
    "priority_policy": (
        "priority_levels: 2 default_priority_level: 2 "
        "default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 100000 } "
        "priority_queue_policy { key: 1 value: { default_timeout_microseconds: 100000 } }"
    ),
}


def _write(repo: Path, name: str, batching: str) -> None:
    made = write_identity(repo, "onnx", 1, np.float32, [-1], 8)
    (repo / made).rename(repo / name)
    config = repo / name / "config.pbtxt"
    config.write_text(config.read_text() + f"dynamic_batching {{ {batching} }}\n")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("model_queue")
    repo = tmp / "models"
    repo.mkdir()
    for name, policy in MODELS.items():
        _write(repo, name, f"{_BATCHING} {policy}")
    # Triton's onnx_zero_1_float32_queue (L0_http): a queue of one
    _write(
        repo,
        "onnx_zero_1_float32_queue",
        "max_queue_delay_microseconds: 1000000 preferred_batch_size: [ 8 ] "
        "default_queue_policy { max_queue_size: 1 }",
    )
    d = start_daemon(
        tmp, "--model-repository", str(repo), "--fault-plan", f"slow:every=1:seconds={SLOW}"
    )
    yield d
    stop_daemon(d)


#: A request's answer: (status or gRPC code, seconds from the case's start, text)
Answer = tuple[str, float, str]


def _http(client: requests.Session, url: str, rows: int, priority: int, timeout_us: int) -> Answer:
    doc: dict[str, Any] = {
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [rows, 16], "data": [1.0] * 16 * rows}
        ]
    }
    parameters = {k: v for k, v in (("priority", priority), ("timeout", timeout_us)) if v}
    if parameters:
        doc["parameters"] = parameters
    r = client.post(url, json=doc)
    return str(r.status_code), 0.0, r.text


def _grpc(
    client: grpcclient.InferenceServerClient, model: str, rows: int, priority: int, timeout_us: int
) -> Answer:
    tensor = grpcclient.InferInput("INPUT0", [rows, 16], "FP32")
    tensor.set_data_from_numpy(np.ones((rows, 16), np.float32))
    try:
        client.infer(model, [tensor], priority=priority, timeout=timeout_us)
    except InferenceServerException as exc:
        return str(exc.status()), 0.0, str(exc.message())
    return "200", 0.0, ""


def _case(
    daemon: Daemon, model: str, protocol: str, calls: list[tuple[str, float, int, int, int]]
) -> dict[str, Answer]:
    """Send ``calls`` (name, when in seconds, rows, priority, timeout in µs) to ``model``, each
    from a thread and a connection of its own (connected before the case starts); their
    answers by name. ``X`` (one row, sent first) keeps the device busy."""
    calls = [("X", 0.0, 1, 0, 0), *calls]
    senders: list[Any] = []
    for _ in calls:
        if protocol == "http":
            session = requests.Session()
            session.get(f"http://127.0.0.1:{daemon.port}/v2/health/live")
            url = f"http://127.0.0.1:{daemon.port}/v2/models/{model}/infer"
            senders.append(lambda *a, s=session, u=url: _http(s, u, *a))
        else:
            client = grpcclient.InferenceServerClient(f"127.0.0.1:{daemon.grpc_port}")
            client.is_server_live()
            senders.append(lambda *a, c=client: _grpc(c, model, *a))
    answers: dict[str, Answer] = {}
    start = time.monotonic()

    def one(send: Any, name: str, rows: int, priority: int, timeout_us: int) -> None:
        status, _, text = send(rows, priority, timeout_us)
        answers[name] = (status, time.monotonic() - start, text)

    threads = []
    for send, (name, when, rows, priority, timeout_us) in zip(senders, calls, strict=True):
        time.sleep(max(0.0, start + when - time.monotonic()))
        t = threading.Thread(target=one, args=(send, name, rows, priority, timeout_us))
        t.start()
        threads.append(t)
    for t in threads:
        t.join(60)
    return answers


OK = "200"
UNAVAILABLE = {"http": "503", "grpc": "StatusCode.UNAVAILABLE"}
PROTOCOLS = ["http", "grpc"]


def _ok(answer: Answer) -> bool:
    return answer[0] == OK


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_policy_delay_waits_behind_the_requests_on_time(daemon: Daemon, protocol: str) -> None:
    """Triton's test_policy_delay: A waits past its 0.1 s and is delayed, not rejected: B and
    C, sent after it, fill the next batch (4 rows) and A runs after them. (In arrival order A
    would ride with B and half of C, and C would wait a batch longer.)"""
    got = _case(
        daemon,
        "delay",
        protocol,
        [("A", 0.15, 1, 0, 0), ("B", 0.35, 2, 0, 0), ("C", 0.35, 2, 0, 0)],
    )
    assert all(_ok(a) for a in got.values()), got
    assert max(got["B"][1], got["C"][1]) + SLOW / 2 < got["A"][1], got


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_policy_reject_answers_a_request_past_its_wait_in_tritons_words(
    daemon: Daemon, protocol: str
) -> None:
    """Triton's test_policy_reject: A, still waiting 0.1 s after it came, is refused at once
    (503 / UNAVAILABLE, "Request timeout expired"); X, already running, is not: the policy's
    timeout bounds the wait in the queue, as Triton's does. B and C are served."""
    got = _case(
        daemon,
        "reject",
        protocol,
        [("A", 0.15, 1, 0, 0), ("B", 0.35, 2, 0, 0), ("C", 0.35, 2, 0, 0)],
    )
    status, when, text = got["A"]
    assert status == UNAVAILABLE[protocol] and "Request timeout expired" in text, got
    assert when < SLOW, got  # at its timeout, not when the device came free
    assert _ok(got["X"]) and _ok(got["B"]) and _ok(got["C"]), got


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_requests_own_timeout_counts_only_where_the_policy_allows_it(
    daemon: Daemon, protocol: str
) -> None:
    """Triton's test_timeout_override: with ``allow_timeout_override: false`` (the default) a
    request's own timeout is ignored and it waits its turn; with it true, a shorter one of its
    own holds and it is rejected once it waited that long; a longer one does not extend the
    level's (5 s here, not reached)."""
    got = _case(daemon, "no_override", protocol, [("A", 0.15, 1, 0, 100_000)])
    assert _ok(got["A"]) and got["A"][1] > SLOW, got
    got = _case(
        daemon, "override", protocol, [("A", 0.15, 1, 0, 100_000), ("B", 0.15, 1, 0, 10_000_000)]
    )
    status, when, text = got["A"]
    assert status == UNAVAILABLE[protocol] and "Request timeout expired" in text, got
    assert when < SLOW and _ok(got["B"]), got


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_priority_levels_order_the_queue(daemon: Daemon, protocol: str) -> None:
    """Triton's test_priority_levels (2 levels, the default level 2): C, sent last at level 1,
    goes first, with A, which came before B (both at the default level): C and A fill the next
    batch of 4, B runs after them. A priority past the levels is the default level (Triton's
    ``SetPriority``), as in test_max_priority_levels."""
    got = _case(
        daemon,
        "priority",
        protocol,
        [("A", 0.1, 2, 0, 0), ("B", 0.2, 1, 0, 0), ("C", 0.3, 2, 1, 0)],
    )
    assert all(_ok(a) for a in got.values()), got
    assert max(got["A"][1], got["C"][1]) + SLOW / 2 < got["B"][1], got
    got = _case(
        daemon,
        "priority",
        protocol,
        [("A", 0.1, 2, 0, 0), ("B", 0.2, 1, 2**32, 0), ("C", 0.3, 2, 1, 0)],
    )
    assert all(_ok(a) for a in got.values()), got
    assert max(got["A"][1], got["C"][1]) + SLOW / 2 < got["B"][1], got


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_max_queue_size_bounds_each_priority_level(daemon: Daemon, protocol: str) -> None:
    """Triton's test_max_queue_size, per level: with one request waiting at the default level,
    the next at that level is refused ("Exceeds maximum queue size", 503 / UNAVAILABLE); one
    at level 1 has a queue of its own and is taken."""
    got = _case(
        daemon,
        "priority_bounded",
        protocol,
        [("A", 0.1, 1, 0, 0), ("B", 0.2, 1, 0, 0), ("C", 0.3, 1, 1, 0)],
    )
    status, _, text = got["B"]
    assert status == UNAVAILABLE[protocol] and "Exceeds maximum queue size" in text, got
    assert _ok(got["X"]) and _ok(got["A"]) and _ok(got["C"]), got


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_each_priority_level_has_its_own_policy(daemon: Daemon, protocol: str) -> None:
    """Triton's test_priority_with_policy: level 1 rejects past 0.1 s of waiting, the default
    level (2) delays. A (level 1) is rejected; D (level 2) is delayed behind E and F, sent
    after it at its level, and still served."""
    calls = [
        ("A", 0.15, 1, 1, 0),
        ("D", 0.15, 1, 2, 0),
        ("E", 0.35, 2, 2, 0),
        ("F", 0.35, 2, 2, 0),
    ]
    got = _case(daemon, "priority_policy", protocol, calls)
    status, _, text = got["A"]
    assert status == UNAVAILABLE[protocol] and "Request timeout expired" in text, got
    assert _ok(got["D"]) and _ok(got["E"]) and _ok(got["F"]), got
    assert max(got["E"][1], got["F"][1]) + SLOW / 2 < got["D"][1], got


def test_descriptive_status_code(daemon: Daemon) -> None:
    """L0_http's test_descriptive_status_code: a raw binary request to a model whose queue
    holds one, while one waits, is refused with the status its error means: 503 (Triton's
    UNAVAILABLE), "Exceeds maximum queue size"."""
    url = f"http://127.0.0.1:{daemon.port}/v2/models/onnx_zero_1_float32_queue/infer"
    body = np.arange(8, dtype=np.float32).tobytes()
    answers: dict[str, requests.Response] = {}

    def send(name: str) -> None:
        answers[name] = requests.post(
            url, data=body, headers={"Inference-Header-Content-Length": "0"}
        )

    threads = []
    for name in ("running", "waiting", "refused"):
        threads.append(threading.Thread(target=send, args=(name,)))
        threads[-1].start()
        time.sleep(0.1)
    for t in threads:
        t.join(30)
    assert answers["running"].status_code == 200 and answers["waiting"].status_code == 200
    refused = answers["refused"]
    assert refused.status_code == 503 and "Exceeds maximum queue size" in refused.text
    out = answers["waiting"]
    start = int(out.headers["Inference-Header-Content-Length"])
    assert out.content[start:] == body

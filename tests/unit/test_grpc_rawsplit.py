"""A big ModelInfer request decoded without copying its tensors (:mod:`.rawsplit`): the same
request protobuf reads, its raw contents views of the received bytes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from model_runtime.server.grpc.budget import CallBudget
from model_runtime.server.grpc.framing import MessageReader, frame
from model_runtime.server.grpc.rawsplit import split_raw_inputs
from model_runtime.server.triton import grpc_service_pb2 as pb

pytestmark = pytest.mark.timeout(10)


def _request() -> pb.ModelInferRequest:
    tensor = pb.ModelInferRequest.InferInputTensor
    return pb.ModelInferRequest(
        model_name="m",
        id="r1",
        inputs=[tensor(name="a", datatype="FP32", shape=[1, 3]), tensor(name="b", shape=[2])],
        raw_input_contents=[b"\x01" * 12, b"\x02" * 300],
        parameters={"priority": pb.InferParameter(int64_param=3)},
    )


def test_the_rest_is_protobufs_and_the_raw_contents_are_views_in_order() -> None:
    data = bytearray(_request().SerializeToString())
    split = split_raw_inputs(pb.ModelInferRequest(), data)
    assert split is not None
    message, raws = split
    expected = _request()
    del expected.raw_input_contents[:]
    assert message == expected
    assert [bytes(r) for r in raws] == [b"\x01" * 12, b"\x02" * 300]
    data[-1] = 7  # views of the received bytes, not copies
    assert raws[1][-1] == 7


def test_fields_in_any_order_are_read_as_protobuf_reads_them() -> None:
    first = pb.ModelInferRequest(raw_input_contents=[b"x"], model_name="m").SerializeToString()
    later = pb.ModelInferRequest(raw_input_contents=[b"yz"], id="i").SerializeToString()
    split = split_raw_inputs(pb.ModelInferRequest(), first + later)  # concatenation = merge
    assert split is not None
    message, raws = split
    assert (message.model_name, message.id, [bytes(r) for r in raws]) == ("m", "i", [b"x", b"yz"])


@pytest.mark.parametrize("cut", [1, 5, 20])
def test_a_message_that_does_not_walk_is_left_to_protobuf(cut: int) -> None:
    data = _request().SerializeToString()
    assert split_raw_inputs(pb.ModelInferRequest(), data[:-cut]) is None


def test_a_message_across_chunks_is_read_into_one_buffer_counted_until_its_call_ends() -> None:
    payload = _request().SerializeToString() + b""
    big = pb.ModelInferRequest(raw_input_contents=[b"z" * (200 << 10)]).SerializeToString()
    data = frame(big) + frame(payload)
    chunks = [data[i : i + 7000] for i in range(0, len(data), 7000)]
    budget = CallBudget(write_timeout=10, max_calls=10, max_bytes=1 << 20)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": chunks.pop(0), "more_body": bool(chunks)}

    def admit(size: int) -> Any:
        assert budget.hold_message("p", size) is None
        return lambda: budget.drop_message(size)

    async def main() -> None:
        reader = MessageReader(receive, 1 << 20, None, admit)
        first = await reader.next()
        assert first is not None and bytes(first) == big
        assert reader.counted and budget.bytes == len(big)  # counted while its call runs
        second = await reader.next()  # the next one: the first's bytes are given back
        assert second is not None and bytes(second) == payload and budget.bytes == 0
        reader.close()
        assert await reader.next() is None

    asyncio.run(main())


def test_past_the_budget_a_big_message_is_refused_even_on_a_quiet_connection() -> None:
    budget = CallBudget(write_timeout=10, max_calls=10, max_bytes=100 << 10)
    assert budget.hold_message("a", 150 << 10) is None  # nothing in flight: admitted
    budget.drop_message(150 << 10)
    assert budget.hold_message("a", 60 << 10) is None
    # Past the budget: refused, though connection "b" has nothing else in flight.
    assert budget.hold_message("b", 60 << 10) is not None
    budget.drop_message(60 << 10)
    assert budget.hold_message("b", 60 << 10) is None

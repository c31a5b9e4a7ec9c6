"""Dynamic dimensions besides the batch (DESIGN.md §4, §6): compiled, stored, validated,
batched by shape and answered exactly."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from test_queue_support import F32, running, settle, submit

from actors.clock import FakeClock
from actors.device.backends.ipu_model import IpuModelBackend
from actors.device.inventory import DeviceSpec
from actors.queues import shapes
from actors.queues.actor import Queue
from actors.queues.config import QueueConfig
from actors.queues.pool import Layout
from actors.queues.request import Request
from model_runtime import ModelRunner, ModelRunnerConfig
from model_runtime.compiler import CompileOptions, compile_executable
from model_runtime.errors import (
    InputValidationError,
    InvalidExecutableError,
    UnsupportedExecutableError,
)
from model_runtime.executable import Executable
from model_runtime.executable.codec import metadata_from_json, metadata_to_json
from model_runtime.executable.model import (
    Anchor,
    AnchorRole,
    AnchorType,
    ExecutableMetadata,
    Program,
    ProgramFlow,
    ProgramKind,
    Target,
    TensorInfo,
)
from model_runtime.executable.validate import validate_structure
from model_runtime.io import request_shapes, validate_inputs
from tests.models import make_text_classifier

LENGTHS = (1, 4, 16, 33, 64)


@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("dyn") / "text.mrx"
    compile_executable(make_text_classifier(), CompileOptions(batch_size=8)).save(path)
    return path


def _reference(ids: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(
        make_text_classifier().SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return list(session.run(None, {"ids": ids}))


# -- compile and format ------------------------------------------------------------------------


def test_the_sequence_axis_stays_dynamic_and_is_stored_as_minus_one(classifier: Path) -> None:
    exe = Executable.load(classifier)
    m = exe.metadata
    assert m.format_version == 3 and m.is_dynamic
    assert m.anchor("ids").shape == (8, -1) and m.anchor("ids").dim_names == ("", "seq")
    assert m.anchor("logits").shape == (8, 4) and m.anchor("logits").dim_names == ()
    assert m.anchor("hidden").shape == (8, -1, 16)
    assert m.batch_sizes == (1, 2, 4, 8)  # the batch stays bucketed beside the dynamic axis
    assert m.run_sizes == tuple(range(1, 9))  # and, dynamic, runs at any size up to 8


def _dynamic_meta(shape: tuple[int, ...], names: tuple[str, ...], version: int = 3) -> str:
    anchor = Anchor(
        "x",
        "x",
        TensorInfo(shape, F32),
        AnchorType.INPUT,
        AnchorRole.USER_INPUT,
        (1,),
        batch_dim=0,
        dim_names=names,
    )
    meta = ExecutableMetadata(
        model_name="m",
        target=Target(),
        batch_size=2,
        anchors=(anchor,),
        programs=(Program(1, "main", ProgramKind.MAIN, payload="p"),),
        program_flow=ProgramFlow(main=(1,)),
        format_version=version,
    )
    return metadata_to_json(meta, include_hash=False)


@pytest.mark.parametrize(
    ("shape", "names", "version", "message"),
    [
        ((2, -1), ("", "seq"), 2, r"shape\[1\]"),  # -1 is not an integer >= 0 before format 3
        ((2, -1), (), 3, "dim_names has 0 entries"),
        ((2, -1), ("", ""), 3, "dimension 1 is -1 but its dim_names entry is ''"),
        ((2, 5), ("", "seq"), 3, "dimension 1 is 5 but its dim_names entry is 'seq'"),
        ((-1, 5), ("b", ""), 3, "batch dimension 0 cannot be dynamic"),
        ((2, -2), ("", "x"), 3, r"shape\[1\]"),
    ],
)
def test_a_dynamic_dimension_that_does_not_add_up_is_refused(
    shape: tuple[int, ...], names: tuple[str, ...], version: int, message: str
) -> None:
    with pytest.raises(InvalidExecutableError, match=message):
        meta = metadata_from_json(_dynamic_meta(shape, names, version), where="f")
        validate_structure(meta, {"p": np.ones(4, np.uint8)}, where="f")


def test_the_static_ipu_model_refuses_a_dynamic_executable_naming_the_dimension(
    classifier: Path,
) -> None:
    backend = IpuModelBackend(
        DeviceSpec(id=0, kind="ipu-model", tiles_per_ipu=1216, memory_per_tile=1 << 20)
    )
    with pytest.raises(UnsupportedExecutableError, match=r"'ids' dimension 1, 'seq'"):
        backend.load(Executable.load(classifier), None)


# -- validation --------------------------------------------------------------------------------


def test_any_size_along_a_dynamic_dimension_and_shared_names_agree() -> None:
    anchors = tuple(
        Anchor(
            n,
            n,
            TensorInfo((4, -1), np.dtype(np.int64)),
            AnchorType.INPUT,
            AnchorRole.USER_INPUT,
            (1,),
            batch_dim=0,
            dim_names=("", "seq"),
        )
        for n in ("ids", "mask")
    )
    shapes = request_shapes(anchors, 0, where="m")
    ok = {"ids": np.zeros((3, 7), np.int64), "mask": np.ones((3, 7), np.int64)}
    assert validate_inputs(ok, shapes, 4, True)[1] == 3
    with pytest.raises(InputValidationError, match=r"'mask' has 6 along its dimension 'seq'"):
        validate_inputs({**ok, "mask": np.ones((3, 6), np.int64)}, shapes, 4, True)
    with pytest.raises(InputValidationError, match=r"expects \[-1, -1\]"):
        validate_inputs({**ok, "ids": np.zeros((3, 7, 1), np.int64)}, shapes, 4, True)


# -- the queue: one shape per batch, the oldest shape first ------------------------------------


def _queue_meta(batch: int) -> ExecutableMetadata:
    def anchor(name: str, kind: AnchorType, role: AnchorRole) -> Anchor:
        return Anchor(
            name,
            name,
            TensorInfo((batch, -1), F32),
            kind,
            role,
            (1,),
            batch_dim=0,
            dim_names=("", "f"),
        )

    return ExecutableMetadata(
        model_name="q",
        target=Target(),
        batch_size=batch,
        anchors=(
            anchor("x", AnchorType.INPUT, AnchorRole.USER_INPUT),
            anchor("y", AnchorType.OUTPUT, AnchorRole.USER_OUTPUT),
        ),
        programs=(Program(1, "main", ProgramKind.MAIN),),
        program_flow=ProgramFlow(main=(1,)),
        format_version=3,
    )


def _request(rows: int, width: int, seed: int) -> Request:
    x = (seed * 100 + np.arange(rows * width, dtype=np.float32)).reshape(rows, width)
    return Request({"x": x}, rows, asyncio.get_running_loop().create_future())


async def test_batches_hold_one_shape_and_the_oldest_shape_goes_first() -> None:
    clock = FakeClock()
    queue = Queue(_queue_meta(4), QueueConfig(batching_dim=0, timeout=5.0), clock=clock)
    async with running(queue) as (ref, session):
        first = submit(ref, _request(1, 3, 1))  # the oldest: width 3
        wide = [submit(ref, _request(1, 5, i)) for i in (2, 3, 4)]
        second = submit(ref, _request(2, 3, 5))
        await settle()
        assert session.seen == []  # no shape fills a batch of 4 yet
        full = submit(ref, _request(1, 5, 6))  # width 5 now fills one: it runs at once
        await settle()
        assert [b.inputs[0]["x"].shape for b in session.seen] == [(4, 5)]
        clock.advance(5.0)
        await settle()
        shapes = [b.inputs[0]["x"].shape for b in session.seen]
        assert shapes == [(4, 5), (4, 3)]  # width 3's three rows, padded to the batch
        assert session.seen[1].valid_rows == 3
        for req in (first, *wide, second, full):
            out = await req.future
            np.testing.assert_array_equal(out["y"], req.inputs["x"] * 2 + 1)


# -- end to end --------------------------------------------------------------------------------


async def test_many_callers_of_five_lengths_share_batches_and_get_their_own_answers(
    classifier: Path,
) -> None:
    rng = np.random.default_rng(7)
    ids = [rng.integers(0, 100, (1, LENGTHS[i % 5])).astype(np.int64) for i in range(320)]
    async with ModelRunner(classifier, ModelRunnerConfig(batching_dim=0)) as runner:
        inputs = runner.get_execute_inputs()
        assert inputs[0].shape == (8, -1)
        results = await asyncio.gather(*(runner.execute({"ids": x}) for x in ids))
        runs = sum(s.runs for s in runner.replica_states())
        by_size = runner.replica_states()[0].runs_by_size
    for x, got in zip(ids, results, strict=True):
        logits, hidden = _reference(x)
        np.testing.assert_allclose(got["logits"], logits, rtol=1e-5, atol=1e-5)
        assert got["hidden"].shape == hidden.shape == (1, x.shape[1], 16)
        np.testing.assert_allclose(got["hidden"], hidden, rtol=1e-6)
    # (warm-up and probe runs count too)
    assert runs <= 0.6 * len(ids), f"{runs} device runs for {len(ids)} requests"
    # Triton's batch_stats: the sizes the batches ran at, not the largest alone; a dynamic
    # model runs each batch at its own size (no padding to a bucket).
    assert set(by_size) <= set(range(1, 9)) and len(by_size) > 1, by_size
    assert sum(by_size.values()) <= runs


async def test_a_request_larger_than_the_batch_is_split_and_reassembled(classifier: Path) -> None:
    x = np.random.default_rng(3).integers(0, 100, (19, 11)).astype(np.int64)
    async with ModelRunner(classifier, ModelRunnerConfig(batching_dim=0)) as runner:
        got = await runner.execute({"ids": x})
        bad = runner.execute({"ids": np.zeros((2, 3, 4), np.int64)})
        with pytest.raises(InputValidationError, match="any size"):
            await bad
    logits, hidden = _reference(x)
    np.testing.assert_allclose(got["logits"], logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["hidden"], hidden, rtol=1e-6)


async def test_a_shape_whose_batch_passes_the_allocation_limit_is_refused_before_queueing(
    classifier: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODEL_RUNTIME_FLAGS", f"--max_allocation_bytes={64 << 20}")
    async with ModelRunner(classifier, ModelRunnerConfig(batching_dim=0)) as runner:
        # 8 rows x 2**21 int64 = 128 MiB for one batch buffer: refused, nothing allocated
        with pytest.raises(InputValidationError, match="allocation limit"):
            await runner.execute({"ids": np.zeros((1, 1 << 21), np.int64)})
        ok = await runner.execute({"ids": np.zeros((1, 5), np.int64)})
        assert ok["hidden"].shape == (1, 5, 16)


def test_replace_keeps_dim_names() -> None:  # frozen values stay values
    a = Anchor("x", "x", TensorInfo((2, -1), F32), AnchorType.INPUT, AnchorRole.USER_INPUT, (1,))
    assert replace(a, dim_names=("", "s")).dim_names == ("", "s")


async def test_more_rows_than_a_batch_with_no_shape_filling_one_are_flushed_by_shape() -> None:
    clock = FakeClock()
    queue = Queue(_queue_meta(4), QueueConfig(batching_dim=0, timeout=5.0), clock=clock)
    async with running(queue) as (ref, session):
        reqs = [submit(ref, _request(1, 3 + i % 2, i)) for i in range(6)]  # 3 + 3 rows
        await settle()
        assert session.seen == []
        clock.advance(5.0)  # the flush: each shape as a partial batch, the oldest first
        await settle()
        assert [b.inputs[0]["x"].shape for b in session.seen] == [(4, 3), (4, 4)]
        for req in reqs:
            out = await req.future
            np.testing.assert_array_equal(out["y"], req.inputs["x"] * 2 + 1)


def test_a_dynamic_batch_runs_at_its_own_size_a_fixed_one_at_its_bucket() -> None:
    dynamic = replace(_queue_meta(8), options={"batch_sizes": "1,2,4,8"})
    fixed = replace(
        dynamic,
        anchors=tuple(
            replace(a, tensor_info=TensorInfo((8, 5), F32), dim_names=()) for a in dynamic.anchors
        ),
        format_version=1,
    )
    config = QueueConfig(batching_dim=0)
    assert Layout(dynamic, config).bucket(3) == 3  # no padding of long sequences
    assert Layout(fixed, config).bucket(3) == 4  # the seed's buckets stand


async def test_batches_of_one_shape_in_flight_together_never_share_a_buffer() -> None:
    # Each shape has a small ring pool of its own: the two batches the device holds at once
    # (look_ahead 2) are in two buffers, and the next batch of that shape reuses one.
    queue = Queue(_queue_meta(4), QueueConfig(batching_dim=0, timeout=5.0), clock=FakeClock())
    async with running(queue, hold=True) as (ref, session):
        reqs = [submit(ref, _request(1, 3, i)) for i in range(8)]  # two full batches
        await settle()
        first, second = session.seen
        assert not np.shares_memory(first.inputs[0]["x"], second.inputs[0]["x"])
        session.release()  # computed now, from each batch's own buffer
        await settle()
        for req in reqs:
            out = await req.future
            np.testing.assert_array_equal(out["y"], req.inputs["x"] * 2 + 1)
        more = [submit(ref, _request(1, 3, 10 + i)) for i in range(4)]
        await settle()
        third = session.seen[2].inputs[0]["x"]
        assert any(np.shares_memory(third, b.inputs[0]["x"]) for b in (first, second))
        session.release()
        for req in more:
            np.testing.assert_array_equal((await req.future)["y"], req.inputs["x"] * 2 + 1)


def test_the_pools_of_the_shapes_kept_stay_within_their_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A small budget (room for the pools of two shapes of 4 float32 rows of 8 or fewer): the
    # first two shapes keep theirs; later shapes, and a shape too big for it, are served from
    # a buffer of their own per batch, and no pool is freed to make room for another.
    monkeypatch.setattr(shapes, "POOL_BYTES", 2 * 2 * 4 * 8 * 4)
    config = QueueConfig(batching_dim=0)
    meta = _queue_meta(4)
    groups = shapes.ShapeGroups(meta, config, Layout(meta, config))
    _, pool8 = groups.layout(((8,),))
    assert groups.layout(((8,),))[1] is pool8  # kept
    _, pool7 = groups.layout(((7,),))
    for width in (6, 5):
        _, one_off = groups.layout(((width,),))
        assert groups.layout(((width,),))[1] is not one_off  # a buffer per batch
        assert groups._held <= shapes.POOL_BYTES
    assert groups.layout(((8,),))[1] is pool8 and groups.layout(((7,),))[1] is pool7
    _, big = groups.layout(((100,),))
    assert groups.layout(((100,),))[1] is not big  # never kept


def test_shapes_used_in_turn_beyond_the_budget_allocate_no_more_than_a_buffer_per_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Three shapes used in turn, pools for two: the third costs one buffer per batch, and no
    # layout or pool is rebuilt (freeing an older pool to make room churned: a layout and
    # look_ahead buffers on every batch).
    monkeypatch.setattr(shapes, "POOL_BYTES", 2 * 2 * 4 * 8 * 4)
    made = {"layouts": 0, "buffers": 0}

    class CountedLayout(Layout):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            made["layouts"] += 1
            super().__init__(*args, **kwargs)

    class CountedPool(shapes.RingPool):
        def __init__(self, layout: Layout, size: int) -> None:
            made["buffers"] += size
            super().__init__(layout, size)

    monkeypatch.setattr(shapes, "Layout", CountedLayout)
    monkeypatch.setattr(shapes, "RingPool", CountedPool)
    config = QueueConfig(batching_dim=0)
    meta = _queue_meta(4)
    groups = shapes.ShapeGroups(meta, config, Layout(meta, config))
    for i in range(30):
        groups.layout((((8, 7, 6)[i % 3],),))
    assert made["layouts"] == 3
    assert made["buffers"] == 2 * config.look_ahead + 10  # two pools, then the third's batches


async def test_a_shape_fills_a_batch_at_once_after_a_caller_of_it_went_away() -> None:
    # The rows counted per shape (which decide whether one fills a batch without a scan of
    # the queue) forget a gone caller's rows once, when its request is dropped.
    clock = FakeClock()
    queue = Queue(_queue_meta(4), QueueConfig(batching_dim=0, timeout=5.0), clock=clock)
    async with running(queue) as (ref, session):
        gone = submit(ref, _request(1, 3, 0))
        gone.future.cancel()
        other = submit(ref, _request(1, 5, 1))
        await settle()
        clock.advance(5.0)  # the flush drops the gone request, runs the other's shape
        await settle()
        assert [b.inputs[0]["x"].shape for b in session.seen] == [(4, 5)]
        await other.future
        reqs = [submit(ref, _request(1, 3, 2 + i)) for i in range(4)]
        await settle()  # four rows of width 3: a full batch, at once (no timeout)
        assert [b.inputs[0]["x"].shape for b in session.seen] == [(4, 5), (4, 3)]
        for req in reqs:
            np.testing.assert_array_equal((await req.future)["y"], req.inputs["x"] * 2 + 1)


async def test_the_rest_of_a_request_split_over_batches_keeps_its_place_in_the_queue() -> None:
    # Width 3's first request has 6 rows and waits, with later requests of widths 5 and 3,
    # while the device holds two batches; when one ends, a full batch of width 3 takes 4 of
    # its rows, and its last 2 keep their place at the front: the next flush runs width 3
    # again (them and the later width-3 row) before width 5.
    clock = FakeClock()
    queue = Queue(_queue_meta(4), QueueConfig(batching_dim=0, timeout=5.0), clock=clock)
    async with running(queue, hold=True) as (ref, session):
        busy = [submit(ref, _request(1, 7, i)) for i in range(8)]  # two batches, held
        long = submit(ref, _request(6, 3, 10))
        wide = submit(ref, _request(1, 5, 11))
        late = submit(ref, _request(1, 3, 12))
        await settle()
        session.release()
        await settle()
        clock.advance(5.0)
        await settle()
        session.release()
        await settle()
        session.release()
        got = [(b.inputs[0]["x"].shape, b.valid_rows) for b in session.seen[2:]]
        assert got == [((4, 3), 4), ((4, 3), 3), ((4, 5), 1)]
        for req in (*busy, long, wide, late):
            np.testing.assert_array_equal((await req.future)["y"], req.inputs["x"] * 2 + 1)

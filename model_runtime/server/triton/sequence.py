"""``config.pbtxt``'s ``sequence_batching`` -> :class:`~model_runtime.sequences.SequenceConfig`.

What is served (Triton's fields, each checked; anything else fails the model, naming the
field): the ``direct`` and ``oldest`` strategies (their ``max_queue_delay_microseconds`` is the
batch timeout of the runner's dynamic batching, which batches the steps of different sequences
as it batches any requests; ``oldest``'s ``preferred_batch_size`` and ``preserve_ordering`` are
read and not used: steps are batched as they come, and each sequence's in its order),
``max_sequence_idle_microseconds`` (Triton's default, 1 s, when 0), ``control_input`` of kinds
START, END, READY (``int32_false_true``, ``fp32_false_true`` or ``bool_false_true``) and CORRID
(``data_type`` TYPE_INT32, TYPE_INT64, TYPE_UINT32, TYPE_UINT64 or TYPE_STRING), and ``state``
pairs with ``dims`` and a ``zero_data`` initial state (or none: zeros). Slots (live sequences at
once): ``max_candidate_sequences`` for ``oldest``, else ``max_batch_size`` times the instances,
as Triton's direct strategy has one slot per batch row per instance.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from model_runtime.errors import ConfigurationError
from model_runtime.sequences import Control, ControlKind, SequenceConfig, StatePair
from model_runtime.server.triton import model_config_pb2 as pb

__all__ = ["sequence_config"]

_SB = pb.ModelSequenceBatching
_KINDS = {
    _SB.Control.CONTROL_SEQUENCE_START: ControlKind.START,
    _SB.Control.CONTROL_SEQUENCE_END: ControlKind.END,
    _SB.Control.CONTROL_SEQUENCE_READY: ControlKind.READY,
    _SB.Control.CONTROL_SEQUENCE_CORRID: ControlKind.CORRID,
}
_CORRID_TYPES: dict[int, np.dtype[Any]] = {
    pb.TYPE_INT32: np.dtype(np.int32),
    pb.TYPE_INT64: np.dtype(np.int64),
    pb.TYPE_UINT32: np.dtype(np.uint32),
    pb.TYPE_UINT64: np.dtype(np.uint64),
    pb.TYPE_STRING: np.dtype(object),
}
_STATE_TYPES = {
    pb.TYPE_BOOL: np.bool_,
    pb.TYPE_UINT8: np.uint8,
    pb.TYPE_UINT16: np.uint16,
    pb.TYPE_UINT32: np.uint32,
    pb.TYPE_UINT64: np.uint64,
    pb.TYPE_INT8: np.int8,
    pb.TYPE_INT16: np.int16,
    pb.TYPE_INT32: np.int32,
    pb.TYPE_INT64: np.int64,
    pb.TYPE_FP16: np.float16,
    pb.TYPE_FP32: np.float32,
    pb.TYPE_FP64: np.float64,
}
#: Triton's default max_sequence_idle_microseconds.
DEFAULT_IDLE_US = 1_000_000


def _fail(where: Path | str, field: str, why: str) -> ConfigurationError:
    return ConfigurationError(f"{where}: sequence_batching.{field}: {why}")


def sequence_config(
    sb: pb.ModelSequenceBatching, where: Path | str, max_batch_size: int, instances: int
) -> SequenceConfig:
    """The sequence batching of a model whose config has ``sb``.

    Raises:
        ConfigurationError: a field we do not serve, or a value that does not fit (named).
    """
    if max_batch_size < 1:
        raise ConfigurationError(
            f"{where}: sequence_batching: needs max_batch_size >= 1 (a sequence model is "
            "served with a batch axis, one row per sequence in a batch)"
        )
    if sb.iterative_sequence:
        raise _fail(where, "iterative_sequence", "iterative sequences are not supported")
    strategy = sb.WhichOneof("strategy_choice") or "direct"
    slots = max_batch_size * max(1, instances)
    if strategy == "direct" and sb.direct.minimum_slot_utilization:
        raise _fail(where, "direct.minimum_slot_utilization", "is not supported")
    if strategy == "oldest":
        if sb.oldest.max_candidate_sequences < 0:
            raise _fail(where, "oldest.max_candidate_sequences", "must be >= 0")
        slots = sb.oldest.max_candidate_sequences or slots
    controls: list[Control] = []
    names: set[str] = set()
    for i, ci in enumerate(sb.control_input):
        at = f"control_input[{i}]"
        if not ci.name:
            raise _fail(where, f"{at}.name", "give the model input the control is fed to")
        if ci.name in names:
            raise _fail(where, f"{at}.name", f"{ci.name!r} is named twice")
        names.add(ci.name)
        if len(ci.control) != 1:
            raise _fail(where, f"{at}.control", "give exactly one control per control input")
        controls.append(_control(ci.name, ci.control[0], where, f"{at}.control[0]"))
    kinds = [c.kind for c in controls]
    for kind in set(kinds):
        if kinds.count(kind) > 1:
            raise _fail(where, "control_input", f"more than one {kind.value} control")
    states = []
    for i, st in enumerate(sb.state):
        at = f"state[{i}]"
        if not st.input_name or not st.output_name:
            raise _fail(where, at, "give input_name and output_name")
        if st.input_name in names:
            raise _fail(where, f"{at}.input_name", f"{st.input_name!r} is a control input")
        names.add(st.input_name)
        dtype = _STATE_TYPES.get(st.data_type)
        if dtype is None:
            raise _fail(where, f"{at}.data_type", f"{pb.DataType.Name(st.data_type)} is not served")
        dims = tuple(int(d) for d in st.dims)
        if not dims or any(d < 1 for d in dims):
            raise _fail(where, f"{at}.dims", f"{list(dims)}: give fixed sizes >= 1")
        if st.use_growable_memory:
            raise _fail(where, f"{at}.use_growable_memory", "is not supported")
        if len(st.initial_state) > 1:
            raise _fail(where, f"{at}.initial_state", "give at most one")
        for init in st.initial_state:
            if init.WhichOneof("state_data") != "zero_data":
                raise _fail(where, f"{at}.initial_state", "only zero_data is supported")
        states.append(StatePair(st.input_name, st.output_name, np.dtype(dtype), dims))
    idle = sb.max_sequence_idle_microseconds or DEFAULT_IDLE_US
    return SequenceConfig(tuple(controls), tuple(states), idle / 1e6, slots, strategy)


def _control(name: str, c: pb.ModelSequenceBatching.Control, where: Path | str, at: str) -> Control:
    kind = _KINDS[c.kind]
    if kind is ControlKind.CORRID:
        dtype = _CORRID_TYPES.get(c.data_type)
        if dtype is None:
            raise _fail(
                where, f"{at}.data_type", "CORRID needs TYPE_INT32/INT64/UINT32/UINT64/STRING"
            )
        return Control(kind, name, dtype)
    pairs: list[tuple[list[Any], np.dtype[Any]]] = [
        (list(c.int32_false_true), np.dtype(np.int32)),
        (list(c.fp32_false_true), np.dtype(np.float32)),
        (list(c.bool_false_true), np.dtype(np.bool_)),
    ]
    given = [(values, dtype) for values, dtype in pairs if values]
    if len(given) != 1 or len(given[0][0]) != 2:
        raise _fail(
            where,
            at,
            "give one of int32_false_true, fp32_false_true, bool_false_true: [false, true]",
        )
    (false, true), control_type = given[0]
    return Control(kind, name, control_type, false, true)

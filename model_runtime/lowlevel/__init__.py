"""The low-level API (seed section 10.2): Session, callbacks and predicates, queues, pools."""

from model_runtime.lowlevel import predicate_factory, ring_size_multiplier_factory
from model_runtime.lowlevel.errors import (
    AnchorsNotConnectedError,
    QueueDisconnectedError,
    QueueTimeoutError,
)
from model_runtime.lowlevel.policies import (
    AnchorCallbackPolicy,
    AnchorCallbackPredicate,
    AnchorWithPolicy,
    CallbackFactory,
    CallbackHandle,
    CallbackInfo,
    LaunchPolicy,
    PopefDataUsagePolicy,
    PopefDataUsagePredicate,
    ProgramsWithPolicy,
    SessionConfig,
)
from model_runtime.lowlevel.queue_manager import DEFAULT_QUEUE_TIMEOUT, QueueManager
from model_runtime.lowlevel.queues import (
    InputData,
    InputQueue,
    OutputData,
    OutputQueue,
    allocate_queue_storage,
)
from model_runtime.lowlevel.ring import RingMemoryPool, SpscRingBuffer, WriteSlot
from model_runtime.lowlevel.session import Session

__all__ = [
    "DEFAULT_QUEUE_TIMEOUT",
    "AnchorCallbackPolicy",
    "AnchorCallbackPredicate",
    "AnchorWithPolicy",
    "AnchorsNotConnectedError",
    "CallbackFactory",
    "CallbackHandle",
    "CallbackInfo",
    "InputData",
    "InputQueue",
    "LaunchPolicy",
    "OutputData",
    "OutputQueue",
    "PopefDataUsagePolicy",
    "PopefDataUsagePredicate",
    "ProgramsWithPolicy",
    "QueueDisconnectedError",
    "QueueManager",
    "QueueTimeoutError",
    "RingMemoryPool",
    "Session",
    "SessionConfig",
    "SpscRingBuffer",
    "WriteSlot",
    "allocate_queue_storage",
    "predicate_factory",
    "ring_size_multiplier_factory",
]

"""Model Runtime: load compiled model executables onto devices and serve many callers.

The public API. Names from the layers below the actors (errors, executable format, compiler)
are imported eagerly; names that live above the actors (runner, sessions, devices, embedded
runtime) are imported on first use, so ``import model_runtime`` stays cheap and the layering of
DESIGN.md §1 holds (``actors`` imports ``model_runtime.errors``, never the other way round at
import time).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from model_runtime.compiler import CompileOptions, compile_model
from model_runtime.errors import *  # noqa: F403
from model_runtime.errors import __all__ as _errors_all
from model_runtime.executable import (
    Anchor,
    AnchorRole,
    AnchorType,
    Executable,
    ExecutableMetadata,
    Program,
    ProgramFlow,
    ProgramKind,
    Target,
    TensorInfo,
)
from model_runtime.io import DataDesc
from model_runtime.logs import quiet_by_default
from model_runtime.runner_config import ModelRunnerConfig

if TYPE_CHECKING:  # real types for users' type checkers; imported lazily at run time
    from actors.device.faults import (
        FaultKind as FaultKind,
        FaultPlan as FaultPlan,
        FaultRule as FaultRule,
    )
    from actors.device.manager import (
        AttachedDevice as AttachedDevice,
        DeviceManager as DeviceManager,
    )
    from actors.device.wait import (
        DeviceConstraints as DeviceConstraints,
        DeviceWaitConfig as DeviceWaitConfig,
        DeviceWaitStrategy as DeviceWaitStrategy,
    )
    from actors.session.state import (
        ReplicaStatus as ReplicaStatus,
    )
    from model_runtime.blocking import (
        BlockingModelRunner as BlockingModelRunner,
    )
    from model_runtime.connection import (
        CompilationOnlyError as CompilationOnlyError,
        DeviceConnectionType as DeviceConnectionType,
        OnnxProgram as OnnxProgram,
        RuntimeConfiguration as RuntimeConfiguration,
        compile_and_run as compile_and_run,
        configure as configure,
        get_configuration as get_configuration,
    )
    from model_runtime.custom_ops import (
        CustomOp as CustomOp,
        Kernel as Kernel,
        codelet_expression_op as codelet_expression_op,
    )
    from model_runtime.embedded import (
        EngineConflictError as EngineConflictError,
        RuntimeContext as RuntimeContext,
        embedded_runtime_call as embedded_runtime_call,
        embedded_runtime_call_sync as embedded_runtime_call_sync,
        embedded_runtime_start as embedded_runtime_start,
        embedded_runtime_start_sync as embedded_runtime_start_sync,
        embedded_runtime_stop as embedded_runtime_stop,
    )
    from model_runtime.lowlevel import (
        AnchorCallbackPolicy as AnchorCallbackPolicy,
        AnchorsNotConnectedError as AnchorsNotConnectedError,
        AnchorWithPolicy as AnchorWithPolicy,
        CallbackInfo as CallbackInfo,
        InputData as InputData,
        InputQueue as InputQueue,
        LaunchPolicy as LaunchPolicy,
        OutputData as OutputData,
        OutputQueue as OutputQueue,
        PopefDataUsagePolicy as PopefDataUsagePolicy,
        ProgramsWithPolicy as ProgramsWithPolicy,
        QueueDisconnectedError as QueueDisconnectedError,
        QueueManager as QueueManager,
        QueueTimeoutError as QueueTimeoutError,
        RingMemoryPool as RingMemoryPool,
        Session as Session,
        SessionConfig as SessionConfig,
        SpscRingBuffer as SpscRingBuffer,
        WriteSlot as WriteSlot,
        allocate_queue_storage as allocate_queue_storage,
        predicate_factory as predicate_factory,
        ring_size_multiplier_factory as ring_size_multiplier_factory,
    )
    from model_runtime.runner import (
        ModelRunner as ModelRunner,
    )

quiet_by_default()

__version__ = "0.1.0"

#: name -> module it lives in, imported on first access.
_LAZY: dict[str, str] = {
    "ModelRunner": "model_runtime.runner",
    "BlockingModelRunner": "model_runtime.blocking",
    "ReplicaStatus": "actors.session.state",
    "DeviceManager": "actors.device.manager",
    "AttachedDevice": "actors.device.manager",
    "DeviceWaitConfig": "actors.device.wait",
    "DeviceWaitStrategy": "actors.device.wait",
    "DeviceConstraints": "actors.device.wait",
    "FaultPlan": "actors.device.faults",
    "FaultRule": "actors.device.faults",
    "FaultKind": "actors.device.faults",
    "Session": "model_runtime.lowlevel",
    "SessionConfig": "model_runtime.lowlevel",
    "LaunchPolicy": "model_runtime.lowlevel",
    "AnchorCallbackPolicy": "model_runtime.lowlevel",
    "PopefDataUsagePolicy": "model_runtime.lowlevel",
    "CallbackInfo": "model_runtime.lowlevel",
    "AnchorWithPolicy": "model_runtime.lowlevel",
    "ProgramsWithPolicy": "model_runtime.lowlevel",
    "QueueManager": "model_runtime.lowlevel",
    "InputQueue": "model_runtime.lowlevel",
    "OutputQueue": "model_runtime.lowlevel",
    "SpscRingBuffer": "model_runtime.lowlevel",
    "WriteSlot": "model_runtime.lowlevel",
    "InputData": "model_runtime.lowlevel",
    "OutputData": "model_runtime.lowlevel",
    "RingMemoryPool": "model_runtime.lowlevel",
    "allocate_queue_storage": "model_runtime.lowlevel",
    "predicate_factory": "model_runtime.lowlevel",
    "ring_size_multiplier_factory": "model_runtime.lowlevel",
    "AnchorsNotConnectedError": "model_runtime.lowlevel",
    "DeviceConnectionType": "model_runtime.connection",
    "RuntimeConfiguration": "model_runtime.connection",
    "configure": "model_runtime.connection",
    "get_configuration": "model_runtime.connection",
    "OnnxProgram": "model_runtime.connection",
    "compile_and_run": "model_runtime.connection",
    "CompilationOnlyError": "model_runtime.connection",
    "embedded_runtime_start": "model_runtime.embedded",
    "embedded_runtime_call": "model_runtime.embedded",
    "embedded_runtime_start_sync": "model_runtime.embedded",
    "embedded_runtime_call_sync": "model_runtime.embedded",
    "embedded_runtime_stop": "model_runtime.embedded",
    "RuntimeContext": "model_runtime.embedded",
    "EngineConflictError": "model_runtime.embedded",
    "CustomOp": "model_runtime.custom_ops",
    "Kernel": "model_runtime.custom_ops",
    "codelet_expression_op": "model_runtime.custom_ops",
    "QueueTimeoutError": "model_runtime.lowlevel",
    "SequenceRunner": "model_runtime.sequences",
    "SequenceTable": "model_runtime.sequences",
    "SequenceConfig": "model_runtime.sequences",
    "SequenceStep": "model_runtime.sequences",
    "StatePair": "model_runtime.sequences",
    "Control": "model_runtime.sequences",
    "ControlKind": "model_runtime.sequences",
    "QueueDisconnectedError": "model_runtime.lowlevel",
}

__all__ = [
    *_errors_all,
    *_LAZY,
    "Anchor",
    "AnchorRole",
    "AnchorType",
    "CompileOptions",
    "DataDesc",
    "Executable",
    "ExecutableMetadata",
    "ModelRunnerConfig",
    "Program",
    "ProgramFlow",
    "ProgramKind",
    "Target",
    "TensorInfo",
    "compile_model",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'model_runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

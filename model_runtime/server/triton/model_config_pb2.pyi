from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DataType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TYPE_INVALID: _ClassVar[DataType]
    TYPE_BOOL: _ClassVar[DataType]
    TYPE_UINT8: _ClassVar[DataType]
    TYPE_UINT16: _ClassVar[DataType]
    TYPE_UINT32: _ClassVar[DataType]
    TYPE_UINT64: _ClassVar[DataType]
    TYPE_INT8: _ClassVar[DataType]
    TYPE_INT16: _ClassVar[DataType]
    TYPE_INT32: _ClassVar[DataType]
    TYPE_INT64: _ClassVar[DataType]
    TYPE_FP16: _ClassVar[DataType]
    TYPE_FP32: _ClassVar[DataType]
    TYPE_FP64: _ClassVar[DataType]
    TYPE_STRING: _ClassVar[DataType]
    TYPE_BF16: _ClassVar[DataType]
TYPE_INVALID: DataType
TYPE_BOOL: DataType
TYPE_UINT8: DataType
TYPE_UINT16: DataType
TYPE_UINT32: DataType
TYPE_UINT64: DataType
TYPE_INT8: DataType
TYPE_INT16: DataType
TYPE_INT32: DataType
TYPE_INT64: DataType
TYPE_FP16: DataType
TYPE_FP32: DataType
TYPE_FP64: DataType
TYPE_STRING: DataType
TYPE_BF16: DataType

class ModelInstanceGroup(_message.Message):
    __slots__ = ("name", "count", "gpus", "kind")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_AUTO: _ClassVar[ModelInstanceGroup.Kind]
        KIND_GPU: _ClassVar[ModelInstanceGroup.Kind]
        KIND_CPU: _ClassVar[ModelInstanceGroup.Kind]
        KIND_MODEL: _ClassVar[ModelInstanceGroup.Kind]
    KIND_AUTO: ModelInstanceGroup.Kind
    KIND_GPU: ModelInstanceGroup.Kind
    KIND_CPU: ModelInstanceGroup.Kind
    KIND_MODEL: ModelInstanceGroup.Kind
    NAME_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    name: str
    count: int
    gpus: _containers.RepeatedScalarFieldContainer[int]
    kind: ModelInstanceGroup.Kind
    def __init__(self, name: _Optional[str] = ..., count: _Optional[int] = ..., gpus: _Optional[_Iterable[int]] = ..., kind: _Optional[_Union[ModelInstanceGroup.Kind, str]] = ...) -> None: ...

class ModelTensorReshape(_message.Message):
    __slots__ = ("shape",)
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, shape: _Optional[_Iterable[int]] = ...) -> None: ...

class ModelInput(_message.Message):
    __slots__ = ("name", "data_type", "format", "dims", "reshape", "optional")
    class Format(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        FORMAT_NONE: _ClassVar[ModelInput.Format]
        FORMAT_NHWC: _ClassVar[ModelInput.Format]
        FORMAT_NCHW: _ClassVar[ModelInput.Format]
    FORMAT_NONE: ModelInput.Format
    FORMAT_NHWC: ModelInput.Format
    FORMAT_NCHW: ModelInput.Format
    NAME_FIELD_NUMBER: _ClassVar[int]
    DATA_TYPE_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    DIMS_FIELD_NUMBER: _ClassVar[int]
    RESHAPE_FIELD_NUMBER: _ClassVar[int]
    OPTIONAL_FIELD_NUMBER: _ClassVar[int]
    name: str
    data_type: DataType
    format: ModelInput.Format
    dims: _containers.RepeatedScalarFieldContainer[int]
    reshape: ModelTensorReshape
    optional: bool
    def __init__(self, name: _Optional[str] = ..., data_type: _Optional[_Union[DataType, str]] = ..., format: _Optional[_Union[ModelInput.Format, str]] = ..., dims: _Optional[_Iterable[int]] = ..., reshape: _Optional[_Union[ModelTensorReshape, _Mapping]] = ..., optional: _Optional[bool] = ...) -> None: ...

class ModelOutput(_message.Message):
    __slots__ = ("name", "data_type", "dims", "label_filename", "reshape")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DATA_TYPE_FIELD_NUMBER: _ClassVar[int]
    DIMS_FIELD_NUMBER: _ClassVar[int]
    LABEL_FILENAME_FIELD_NUMBER: _ClassVar[int]
    RESHAPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    data_type: DataType
    dims: _containers.RepeatedScalarFieldContainer[int]
    label_filename: str
    reshape: ModelTensorReshape
    def __init__(self, name: _Optional[str] = ..., data_type: _Optional[_Union[DataType, str]] = ..., dims: _Optional[_Iterable[int]] = ..., label_filename: _Optional[str] = ..., reshape: _Optional[_Union[ModelTensorReshape, _Mapping]] = ...) -> None: ...

class ModelVersionPolicy(_message.Message):
    __slots__ = ("latest", "all", "specific")
    class Latest(_message.Message):
        __slots__ = ("num_versions",)
        NUM_VERSIONS_FIELD_NUMBER: _ClassVar[int]
        num_versions: int
        def __init__(self, num_versions: _Optional[int] = ...) -> None: ...
    class All(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    class Specific(_message.Message):
        __slots__ = ("versions",)
        VERSIONS_FIELD_NUMBER: _ClassVar[int]
        versions: _containers.RepeatedScalarFieldContainer[int]
        def __init__(self, versions: _Optional[_Iterable[int]] = ...) -> None: ...
    LATEST_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    SPECIFIC_FIELD_NUMBER: _ClassVar[int]
    latest: ModelVersionPolicy.Latest
    all: ModelVersionPolicy.All
    specific: ModelVersionPolicy.Specific
    def __init__(self, latest: _Optional[_Union[ModelVersionPolicy.Latest, _Mapping]] = ..., all: _Optional[_Union[ModelVersionPolicy.All, _Mapping]] = ..., specific: _Optional[_Union[ModelVersionPolicy.Specific, _Mapping]] = ...) -> None: ...

class ModelQueuePolicy(_message.Message):
    __slots__ = ("timeout_action", "default_timeout_microseconds", "allow_timeout_override", "max_queue_size")
    class TimeoutAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        REJECT: _ClassVar[ModelQueuePolicy.TimeoutAction]
        DELAY: _ClassVar[ModelQueuePolicy.TimeoutAction]
    REJECT: ModelQueuePolicy.TimeoutAction
    DELAY: ModelQueuePolicy.TimeoutAction
    TIMEOUT_ACTION_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_TIMEOUT_MICROSECONDS_FIELD_NUMBER: _ClassVar[int]
    ALLOW_TIMEOUT_OVERRIDE_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_SIZE_FIELD_NUMBER: _ClassVar[int]
    timeout_action: ModelQueuePolicy.TimeoutAction
    default_timeout_microseconds: int
    allow_timeout_override: bool
    max_queue_size: int
    def __init__(self, timeout_action: _Optional[_Union[ModelQueuePolicy.TimeoutAction, str]] = ..., default_timeout_microseconds: _Optional[int] = ..., allow_timeout_override: _Optional[bool] = ..., max_queue_size: _Optional[int] = ...) -> None: ...

class ModelDynamicBatching(_message.Message):
    __slots__ = ("preferred_batch_size", "max_queue_delay_microseconds", "preserve_ordering", "priority_levels", "default_priority_level", "default_queue_policy", "priority_queue_policy")
    class PriorityQueuePolicyEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: ModelQueuePolicy
        def __init__(self, key: _Optional[int] = ..., value: _Optional[_Union[ModelQueuePolicy, _Mapping]] = ...) -> None: ...
    PREFERRED_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_DELAY_MICROSECONDS_FIELD_NUMBER: _ClassVar[int]
    PRESERVE_ORDERING_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_LEVELS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_PRIORITY_LEVEL_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_QUEUE_POLICY_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_QUEUE_POLICY_FIELD_NUMBER: _ClassVar[int]
    preferred_batch_size: _containers.RepeatedScalarFieldContainer[int]
    max_queue_delay_microseconds: int
    preserve_ordering: bool
    priority_levels: int
    default_priority_level: int
    default_queue_policy: ModelQueuePolicy
    priority_queue_policy: _containers.MessageMap[int, ModelQueuePolicy]
    def __init__(self, preferred_batch_size: _Optional[_Iterable[int]] = ..., max_queue_delay_microseconds: _Optional[int] = ..., preserve_ordering: _Optional[bool] = ..., priority_levels: _Optional[int] = ..., default_priority_level: _Optional[int] = ..., default_queue_policy: _Optional[_Union[ModelQueuePolicy, _Mapping]] = ..., priority_queue_policy: _Optional[_Mapping[int, ModelQueuePolicy]] = ...) -> None: ...

class ModelSequenceBatching(_message.Message):
    __slots__ = ("direct", "oldest", "max_sequence_idle_microseconds", "control_input", "state", "iterative_sequence")
    class Control(_message.Message):
        __slots__ = ("kind", "int32_false_true", "fp32_false_true", "bool_false_true", "data_type")
        class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
            __slots__ = ()
            CONTROL_SEQUENCE_START: _ClassVar[ModelSequenceBatching.Control.Kind]
            CONTROL_SEQUENCE_READY: _ClassVar[ModelSequenceBatching.Control.Kind]
            CONTROL_SEQUENCE_END: _ClassVar[ModelSequenceBatching.Control.Kind]
            CONTROL_SEQUENCE_CORRID: _ClassVar[ModelSequenceBatching.Control.Kind]
        CONTROL_SEQUENCE_START: ModelSequenceBatching.Control.Kind
        CONTROL_SEQUENCE_READY: ModelSequenceBatching.Control.Kind
        CONTROL_SEQUENCE_END: ModelSequenceBatching.Control.Kind
        CONTROL_SEQUENCE_CORRID: ModelSequenceBatching.Control.Kind
        KIND_FIELD_NUMBER: _ClassVar[int]
        INT32_FALSE_TRUE_FIELD_NUMBER: _ClassVar[int]
        FP32_FALSE_TRUE_FIELD_NUMBER: _ClassVar[int]
        BOOL_FALSE_TRUE_FIELD_NUMBER: _ClassVar[int]
        DATA_TYPE_FIELD_NUMBER: _ClassVar[int]
        kind: ModelSequenceBatching.Control.Kind
        int32_false_true: _containers.RepeatedScalarFieldContainer[int]
        fp32_false_true: _containers.RepeatedScalarFieldContainer[float]
        bool_false_true: _containers.RepeatedScalarFieldContainer[bool]
        data_type: DataType
        def __init__(self, kind: _Optional[_Union[ModelSequenceBatching.Control.Kind, str]] = ..., int32_false_true: _Optional[_Iterable[int]] = ..., fp32_false_true: _Optional[_Iterable[float]] = ..., bool_false_true: _Optional[_Iterable[bool]] = ..., data_type: _Optional[_Union[DataType, str]] = ...) -> None: ...
    class ControlInput(_message.Message):
        __slots__ = ("name", "control")
        NAME_FIELD_NUMBER: _ClassVar[int]
        CONTROL_FIELD_NUMBER: _ClassVar[int]
        name: str
        control: _containers.RepeatedCompositeFieldContainer[ModelSequenceBatching.Control]
        def __init__(self, name: _Optional[str] = ..., control: _Optional[_Iterable[_Union[ModelSequenceBatching.Control, _Mapping]]] = ...) -> None: ...
    class InitialState(_message.Message):
        __slots__ = ("data_type", "dims", "zero_data", "data_file", "name")
        DATA_TYPE_FIELD_NUMBER: _ClassVar[int]
        DIMS_FIELD_NUMBER: _ClassVar[int]
        ZERO_DATA_FIELD_NUMBER: _ClassVar[int]
        DATA_FILE_FIELD_NUMBER: _ClassVar[int]
        NAME_FIELD_NUMBER: _ClassVar[int]
        data_type: DataType
        dims: _containers.RepeatedScalarFieldContainer[int]
        zero_data: bool
        data_file: str
        name: str
        def __init__(self, data_type: _Optional[_Union[DataType, str]] = ..., dims: _Optional[_Iterable[int]] = ..., zero_data: _Optional[bool] = ..., data_file: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...
    class State(_message.Message):
        __slots__ = ("input_name", "output_name", "data_type", "dims", "initial_state", "use_same_buffer_for_input_output", "use_growable_memory")
        INPUT_NAME_FIELD_NUMBER: _ClassVar[int]
        OUTPUT_NAME_FIELD_NUMBER: _ClassVar[int]
        DATA_TYPE_FIELD_NUMBER: _ClassVar[int]
        DIMS_FIELD_NUMBER: _ClassVar[int]
        INITIAL_STATE_FIELD_NUMBER: _ClassVar[int]
        USE_SAME_BUFFER_FOR_INPUT_OUTPUT_FIELD_NUMBER: _ClassVar[int]
        USE_GROWABLE_MEMORY_FIELD_NUMBER: _ClassVar[int]
        input_name: str
        output_name: str
        data_type: DataType
        dims: _containers.RepeatedScalarFieldContainer[int]
        initial_state: _containers.RepeatedCompositeFieldContainer[ModelSequenceBatching.InitialState]
        use_same_buffer_for_input_output: bool
        use_growable_memory: bool
        def __init__(self, input_name: _Optional[str] = ..., output_name: _Optional[str] = ..., data_type: _Optional[_Union[DataType, str]] = ..., dims: _Optional[_Iterable[int]] = ..., initial_state: _Optional[_Iterable[_Union[ModelSequenceBatching.InitialState, _Mapping]]] = ..., use_same_buffer_for_input_output: _Optional[bool] = ..., use_growable_memory: _Optional[bool] = ...) -> None: ...
    class StrategyDirect(_message.Message):
        __slots__ = ("max_queue_delay_microseconds", "minimum_slot_utilization")
        MAX_QUEUE_DELAY_MICROSECONDS_FIELD_NUMBER: _ClassVar[int]
        MINIMUM_SLOT_UTILIZATION_FIELD_NUMBER: _ClassVar[int]
        max_queue_delay_microseconds: int
        minimum_slot_utilization: float
        def __init__(self, max_queue_delay_microseconds: _Optional[int] = ..., minimum_slot_utilization: _Optional[float] = ...) -> None: ...
    class StrategyOldest(_message.Message):
        __slots__ = ("max_candidate_sequences", "preferred_batch_size", "max_queue_delay_microseconds", "preserve_ordering")
        MAX_CANDIDATE_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
        PREFERRED_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
        MAX_QUEUE_DELAY_MICROSECONDS_FIELD_NUMBER: _ClassVar[int]
        PRESERVE_ORDERING_FIELD_NUMBER: _ClassVar[int]
        max_candidate_sequences: int
        preferred_batch_size: _containers.RepeatedScalarFieldContainer[int]
        max_queue_delay_microseconds: int
        preserve_ordering: bool
        def __init__(self, max_candidate_sequences: _Optional[int] = ..., preferred_batch_size: _Optional[_Iterable[int]] = ..., max_queue_delay_microseconds: _Optional[int] = ..., preserve_ordering: _Optional[bool] = ...) -> None: ...
    DIRECT_FIELD_NUMBER: _ClassVar[int]
    OLDEST_FIELD_NUMBER: _ClassVar[int]
    MAX_SEQUENCE_IDLE_MICROSECONDS_FIELD_NUMBER: _ClassVar[int]
    CONTROL_INPUT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ITERATIVE_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    direct: ModelSequenceBatching.StrategyDirect
    oldest: ModelSequenceBatching.StrategyOldest
    max_sequence_idle_microseconds: int
    control_input: _containers.RepeatedCompositeFieldContainer[ModelSequenceBatching.ControlInput]
    state: _containers.RepeatedCompositeFieldContainer[ModelSequenceBatching.State]
    iterative_sequence: bool
    def __init__(self, direct: _Optional[_Union[ModelSequenceBatching.StrategyDirect, _Mapping]] = ..., oldest: _Optional[_Union[ModelSequenceBatching.StrategyOldest, _Mapping]] = ..., max_sequence_idle_microseconds: _Optional[int] = ..., control_input: _Optional[_Iterable[_Union[ModelSequenceBatching.ControlInput, _Mapping]]] = ..., state: _Optional[_Iterable[_Union[ModelSequenceBatching.State, _Mapping]]] = ..., iterative_sequence: _Optional[bool] = ...) -> None: ...

class ModelParameter(_message.Message):
    __slots__ = ("string_value",)
    STRING_VALUE_FIELD_NUMBER: _ClassVar[int]
    string_value: str
    def __init__(self, string_value: _Optional[str] = ...) -> None: ...

class ModelTransactionPolicy(_message.Message):
    __slots__ = ("decoupled",)
    DECOUPLED_FIELD_NUMBER: _ClassVar[int]
    decoupled: bool
    def __init__(self, decoupled: _Optional[bool] = ...) -> None: ...

class ModelConfig(_message.Message):
    __slots__ = ("name", "platform", "version_policy", "max_batch_size", "input", "output", "instance_group", "default_model_filename", "dynamic_batching", "sequence_batching", "parameters", "backend", "model_transaction_policy")
    class ParametersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: ModelParameter
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[ModelParameter, _Mapping]] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    PLATFORM_FIELD_NUMBER: _ClassVar[int]
    VERSION_POLICY_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_GROUP_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_MODEL_FILENAME_FIELD_NUMBER: _ClassVar[int]
    DYNAMIC_BATCHING_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_BATCHING_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    MODEL_TRANSACTION_POLICY_FIELD_NUMBER: _ClassVar[int]
    name: str
    platform: str
    version_policy: ModelVersionPolicy
    max_batch_size: int
    input: _containers.RepeatedCompositeFieldContainer[ModelInput]
    output: _containers.RepeatedCompositeFieldContainer[ModelOutput]
    instance_group: _containers.RepeatedCompositeFieldContainer[ModelInstanceGroup]
    default_model_filename: str
    dynamic_batching: ModelDynamicBatching
    sequence_batching: ModelSequenceBatching
    parameters: _containers.MessageMap[str, ModelParameter]
    backend: str
    model_transaction_policy: ModelTransactionPolicy
    def __init__(self, name: _Optional[str] = ..., platform: _Optional[str] = ..., version_policy: _Optional[_Union[ModelVersionPolicy, _Mapping]] = ..., max_batch_size: _Optional[int] = ..., input: _Optional[_Iterable[_Union[ModelInput, _Mapping]]] = ..., output: _Optional[_Iterable[_Union[ModelOutput, _Mapping]]] = ..., instance_group: _Optional[_Iterable[_Union[ModelInstanceGroup, _Mapping]]] = ..., default_model_filename: _Optional[str] = ..., dynamic_batching: _Optional[_Union[ModelDynamicBatching, _Mapping]] = ..., sequence_batching: _Optional[_Union[ModelSequenceBatching, _Mapping]] = ..., parameters: _Optional[_Mapping[str, ModelParameter]] = ..., backend: _Optional[str] = ..., model_transaction_policy: _Optional[_Union[ModelTransactionPolicy, _Mapping]] = ...) -> None: ...

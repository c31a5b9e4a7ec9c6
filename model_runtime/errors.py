"""The error hierarchy of Model Runtime.

Every error the runtime raises on purpose is a :class:`ModelRuntimeError`. The tree says who is
at fault: the caller (bad input), the file (bad executable), the machine (no device), the device
(runtime errors, with the recovery the seed prescribes), or the runtime's own lifecycle.

    ModelRuntimeError
    ├── ConfigurationError                 bad configuration value (env var, config file, option)
    │   └── FaultPlanError                 a fault plan string or rule that does not parse
    ├── InvalidExecutableError             the .mrx file(s) are not a valid executable
    │   ├── PackageHashMismatchError       the stored package hash does not match the contents
    │   └── ResourceLimitError             the memory it implies is over the allocation limit
    ├── CompileError                       an ONNX model cannot be compiled into an executable
    │   └── CustomOpError                  a custom op library is missing, not allowed or broken
    ├── InputValidationError               a caller's inputs/outputs do not fit the model
    │   └── ProtocolError                  a request breaks the inference protocol (HTTP 400)
    │       └── UnreadableFieldError       ... where Triton cannot read a field at all (500)
    ├── DeviceError                        something about devices
    │   ├── DeviceUnavailableError         no device could be attached (per the wait strategy)
    │   ├── DeviceNotFoundError            no such device id / no device of that size or kind
    │   ├── DeviceMemoryError              the executable does not fit the device's memory
    │   ├── UnsupportedExecutableError     the device cannot run it (dynamic dims on ipu-model)
    │   └── DeviceStateError               the device was asked to do something it cannot now
    ├── RuntimeFailure                     the device failed while running a program
    │   ├── ApplicationRuntimeError        the program failed (seed: application_runtime_error)
    │   ├── RecoverableRuntimeError        failed; carries the RecoveryAction that would recover
    │   ├── UnrecoverableRuntimeError      failed for good; the device cannot be used again
    │   ├── PythonModelError               a python model's code failed this request (Triton code)
    │   └── InstanceCrashedError           a python model's instance process died or was stopped
    │       └── PoisonRequestError         the request killed instances twice; not tried again
    ├── ExecutionTimeoutError              a request or a run passed its deadline
    │   └── RequestTimeoutError            ... the request's own timeout (Triton's, 503)
    ├── ActorError                         the actor machinery
    │   ├── ActorStoppedError              the actor stopped before it answered
    │   └── SupervisorEscalationError      restarts passed the supervisor's intensity
    ├── ModelNotFoundError                 the daemon's repository knows no model of that name
    │   └── UnknownModelError              ... as answered to a client, in Triton's words
    ├── ModelLoadError                     a model (version) failed to load (Triton's wording)
    ├── ModelControlError                  the model control mode forbids that load or unload
    ├── SharedMemoryError                  a shared memory region cannot be registered or used
    │   ├── SharedMemoryNotFoundError      no region of that name is registered
    │   ├── SharedMemoryExistsError        a region of that name is registered already
    │   ├── SharedMemoryArgumentError      a key, offset or size that the region or object refuses
    │   │   └── SharedMemoryShrunkError    the client shrank a region's object under its requests
    │   ├── SharedMemoryOpenError          the key opens no shared memory object
    │   ├── SharedMemoryOutputSizeError    an output is larger than its part of the region
    │   ├── SharedMemoryDisabledError      client shared memory is turned off in this server
    │   └── CudaSharedMemoryError          CUDA shared memory: this server has no GPUs
    └── RunnerStoppedError                 the runner is stopped or draining; request not taken
        └── ModelUnavailableError          no replica of the model is in service right now
            └── QueueFullError             the model's queue holds max_queue_size requests
                └── LevelQueueFullError    ... its priority level's queue (Triton's policy)

Errors raised by onnxruntime, the OS or safetensors are translated at the boundary where they
happen (``raise ... from exc``), so callers only ever need to catch ``ModelRuntimeError``.
"""

from __future__ import annotations

import enum

__all__ = [
    "ActorError",
    "ActorStoppedError",
    "ApplicationRuntimeError",
    "CompileError",
    "ConfigurationError",
    "CudaSharedMemoryError",
    "CustomOpError",
    "DeviceError",
    "DeviceMemoryError",
    "DeviceNotFoundError",
    "DeviceStateError",
    "DeviceUnavailableError",
    "ExecutionTimeoutError",
    "FaultPlanError",
    "InputValidationError",
    "InstanceCrashedError",
    "InvalidExecutableError",
    "LevelQueueFullError",
    "ModelControlError",
    "ModelLoadError",
    "ModelNotFoundError",
    "ModelRuntimeError",
    "ModelUnavailableError",
    "PackageHashMismatchError",
    "PoisonRequestError",
    "ProtocolError",
    "PythonModelError",
    "QueueFullError",
    "RecoverableRuntimeError",
    "RecoveryAction",
    "RequestTimeoutError",
    "ResourceLimitError",
    "RunnerStoppedError",
    "RuntimeFailure",
    "SharedMemoryArgumentError",
    "SharedMemoryDisabledError",
    "SharedMemoryError",
    "SharedMemoryExistsError",
    "SharedMemoryNotFoundError",
    "SharedMemoryOpenError",
    "SharedMemoryOutputSizeError",
    "SharedMemoryShrunkError",
    "SupervisorEscalationError",
    "UnknownModelError",
    "UnreadableFieldError",
    "UnrecoverableRuntimeError",
    "UnsupportedExecutableError",
]


class RecoveryAction(enum.Enum):
    """What must be reset to recover from a :class:`RecoverableRuntimeError` (seed names)."""

    IPU_RESET = "IPU_RESET"
    LINK_RESET = "LINK_RESET"
    PARTITION_RESET = "PARTITION_RESET"
    FULL_RESET = "FULL_RESET"


class ModelRuntimeError(Exception):
    """Root of every error Model Runtime raises on purpose."""


class ConfigurationError(ModelRuntimeError):
    """A configuration value (environment variable, config file, option) is invalid."""


class FaultPlanError(ConfigurationError):
    """A fault plan string or rule does not parse or makes no sense."""


class InvalidExecutableError(ModelRuntimeError):
    """The executable file(s) are not a valid executable; the message names file and defect."""


class PackageHashMismatchError(InvalidExecutableError):
    """The package hash stored in the executable does not match its contents."""


class ResourceLimitError(InvalidExecutableError):
    """Loading or starting the executable would allocate more memory than the configured limit
    (``--max_allocation_bytes`` in ``MODEL_RUNTIME_FLAGS``); nothing was allocated. ``needed``
    and ``limit`` are in bytes. The file may be intact: its metadata asks for too much here."""

    def __init__(self, message: str, *, needed: int = 0, limit: int = 0) -> None:
        super().__init__(message)
        self.needed = needed
        self.limit = limit

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (str(self),), {"needed": self.needed, "limit": self.limit})


class CompileError(ModelRuntimeError):
    """An ONNX model cannot be compiled into an executable; the message says why."""


class CustomOpError(CompileError):
    """A custom op library is not on the allow-list, cannot be imported, or is malformed."""


class InputValidationError(ModelRuntimeError):
    """A caller's inputs or outputs do not match what the model expects."""


class ProtocolError(InputValidationError):
    """The request does not follow the protocol or does not fit the model (HTTP 400, gRPC
    INVALID_ARGUMENT); the message names the tensor or field and the defect."""


class UnreadableFieldError(ProtocolError):
    """A request field Triton's HTTP front end cannot read at all (a negative shape
    dimension, which it reads as unsigned): Triton answers it INTERNAL (HTTP 500), in its JSON
    reader's words, and clients match on both."""


class DeviceError(ModelRuntimeError):
    """Base of errors about devices (finding, attaching, fitting, state)."""


class DeviceUnavailableError(DeviceError):
    """No matching device could be attached within the wait strategy's limits."""


class DeviceNotFoundError(DeviceError):
    """No device with that id, or no device of the requested size or kind, exists."""


class DeviceMemoryError(DeviceError):
    """The executable does not fit in the device's memory."""


class UnsupportedExecutableError(DeviceError):
    """The device cannot run the executable at all (a static device given dynamic dimensions)."""


class DeviceStateError(DeviceError):
    """The device was asked for something its state does not allow (no program, detached...)."""


class RuntimeFailure(ModelRuntimeError):
    """The device failed while running a program. ``replica`` names it when known."""

    def __init__(self, message: str, *, replica: int | None = None) -> None:
        super().__init__(message)
        self.replica = replica


class ApplicationRuntimeError(RuntimeFailure):
    """The program failed on the device (seed: ``poplar::application_runtime_error``)."""


class RecoverableRuntimeError(RuntimeFailure):
    """The device failed; performing ``recovery_action`` makes it usable again."""

    def __init__(
        self,
        message: str,
        recovery_action: RecoveryAction,
        *,
        replica: int | None = None,
    ) -> None:
        super().__init__(message, replica=replica)
        self.recovery_action = recovery_action

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (str(self), self.recovery_action), {"replica": self.replica})


class UnrecoverableRuntimeError(RuntimeFailure):
    """The device failed and cannot be used again in this process."""


class PythonModelError(RuntimeFailure):
    """A python model failed this request: its ``execute`` raised, returned an error response,
    or broke Triton's contract (the wrong count, not a response). ``code`` is Triton's error
    code name (``INTERNAL``, ``INVALID_ARG``, ...) the model gave or the contract implies."""

    def __init__(self, message: str, code: str = "INTERNAL", *, replica: int | None = None):
        super().__init__(message, replica=replica)
        self.code = code

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (str(self), self.code), {"replica": self.replica})


class InstanceCrashedError(RuntimeFailure):
    """A python model's instance process died (``returncode``: its exit code, or minus the
    signal) or was stopped by the watchdog, while it held this request."""

    def __init__(
        self, message: str, returncode: int | None = None, *, replica: int | None = None
    ) -> None:
        super().__init__(message, replica=replica)
        self.returncode = returncode

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (str(self), self.returncode), {"replica": self.replica})


class PoisonRequestError(InstanceCrashedError):
    """This request was held by instance processes that died twice: it is answered with this
    error and never tried again, so that it cannot take more instances down."""


class ExecutionTimeoutError(ModelRuntimeError):
    """A request, or a run on the device, passed its deadline."""


class RequestTimeoutError(ExecutionTimeoutError):
    """A request's own timeout (the caller's, or its model's queue policy) passed before it
    was answered: Triton's "Request timeout expired", which it answers UNAVAILABLE (HTTP 503)."""


class ActorError(ModelRuntimeError):
    """Base of errors from the actor machinery."""


class ActorStoppedError(ActorError):
    """The actor stopped (or was never started) before it could answer."""


class SupervisorEscalationError(ActorError):
    """Children restarted more often than the supervisor's intensity allows; it gave up."""


class RunnerStoppedError(ModelRuntimeError):
    """The runner is stopped or draining and did not take (or could not finish) the request."""


class ModelNotFoundError(ModelRuntimeError):
    """No model of that name is known to the daemon's repository (HTTP 404)."""


class UnknownModelError(ModelNotFoundError):
    """A request named a model, or a version of one, that the daemon does not serve; the
    message is Triton's, which clients match on: ``Request for unknown model: 'NAME' is not
    found`` (a name the repository does not know: HTTP 400, gRPC INVALID_ARGUMENT, Triton's
    codes) or ``Request for unknown model: 'NAME' version V is not found`` (a known model
    without that version: HTTP 404, gRPC NOT_FOUND)."""

    def __init__(self, name: str, version: str | None = None) -> None:
        which = "" if version is None else f" version {version}"
        super().__init__(f"Request for unknown model: '{name}'{which} is not found")
        self.model = name
        self.version = version


class ModelLoadError(ModelRuntimeError):
    """A model (version) failed to load; ``cause`` says why. The message starts with Triton's
    ``failed to load '<name>'``. A model that was serving before still serves."""

    def __init__(self, name: str, message: str, cause: BaseException | None = None) -> None:
        super().__init__(f"failed to load '{name}': {message}")
        self.cause = cause


class ModelControlError(ModelRuntimeError):
    """The model control mode does not let the repository API load or unload (HTTP 403)."""


class SharedMemoryError(ModelRuntimeError):
    """A call of Triton's system shared memory extension failed: registering, reading or
    writing a region. The message is Triton's, which clients match on; how each kind is answered
    (HTTP status, gRPC code) is :data:`model_runtime.server.answers.SHARED_MEMORY_ANSWERS`."""


class SharedMemoryNotFoundError(SharedMemoryError):
    """No region of that name is registered (Triton: NOT_FOUND)."""


class SharedMemoryExistsError(SharedMemoryError):
    """A region of that name is registered already (Triton: ALREADY_EXISTS)."""


class SharedMemoryArgumentError(SharedMemoryError):
    """A key, offset or byte size that the region, its object or the server's limits refuse
    (Triton: INVALID_ARG)."""


class SharedMemoryShrunkError(SharedMemoryArgumentError):
    """The object behind a region holds fewer bytes than were registered: its client shrank it
    (before or during the request). The request fails, the process does not (Triton:
    INVALID_ARG)."""


class SharedMemoryOpenError(SharedMemoryError):
    """The key opens no shared memory object this server may map (Triton: INTERNAL)."""


class SharedMemoryOutputSizeError(SharedMemoryError):
    """An output is larger than the part of its region the request gave it; the model ran, its
    result was not written (Triton: INTERNAL)."""


class SharedMemoryDisabledError(SharedMemoryError):
    """Client shared memory is turned off in this server (Triton: UNSUPPORTED)."""


class CudaSharedMemoryError(SharedMemoryError):
    """A CUDA shared memory region cannot be registered: this server has no GPUs (Triton built
    without GPU support: INVALID_ARG)."""


class ModelUnavailableError(RunnerStoppedError):
    """No replica of the model is in service now (each is out of service and being re-probed,
    or the model gave up); the request was not taken. ``__cause__`` is the last failure."""


class QueueFullError(ModelUnavailableError):
    """The model's queue already holds ``max_queue_size`` waiting requests: this one was
    refused at once, before anything was queued (HTTP 503; retry later)."""


class LevelQueueFullError(QueueFullError):
    """The request's priority level already holds its queue policy's ``max_queue_size``
    waiting requests (the model's other levels may have room): refused at once."""

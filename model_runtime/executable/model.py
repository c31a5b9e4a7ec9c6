"""The executable's model: anchors, programs, program flow, target (seed: PopEF model).

These are plain frozen values. The container (how they are stored in a ``.mrx`` file) lives in
:mod:`model_runtime.executable.container`; nothing here touches files.

How programs execute here: a ``main`` program's payload is an ONNX graph. Its graph inputs are
the user input anchors and the variables; the weights are initializers without data, marked as
external at one sentinel location, whose bytes are the executable's weight tensors (the device
supplies them when it builds its session, so onnxruntime can fold and prepack them; executables
compiled earlier, with weights as graph inputs, still load). Its graph outputs are the
output anchors (and the new values of variables, see ``output_to_variable``). A ``load`` program
uploads the weights and the variables' initial values to the device (the anchors it lists,
whose data is stored in the executable); a ``save`` program downloads the variables' current
values. Load and save programs have no payload: their work is the data movement the anchors
describe. No payload refers to anything outside the executable (see ``validate``).
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "FORMAT_VERSION",
    "Anchor",
    "AnchorRole",
    "AnchorType",
    "CustomOpRef",
    "ExecutableMetadata",
    "Program",
    "ProgramFlow",
    "ProgramKind",
    "Target",
    "TensorInfo",
    "dynamic_dims",
    "parse_batch_sizes",
    "required_format_version",
]

#: The newest format version this runtime reads and writes. Version 2 adds string constants
#: (``bytes`` weights whose data is two tensors, see :mod:`.strings`); an executable without
#: them is written as version 1 (:func:`required_format_version`), so a runtime that reads only
#: version 1 still loads it, and refuses one with strings by its version, not by a puzzling
#: anchor.
#: Version 3 adds dynamic dimensions (``-1`` in a user anchor's shape, named in its
#: ``dim_names``); an executable without them keeps the oldest version that describes it.
FORMAT_VERSION = 3
#: Format versions this runtime reads.
READABLE_FORMAT_VERSIONS = (1, 2, 3)
#: The first format version with string constants.
STRINGS_FORMAT_VERSION = 2
#: The first format version with dynamic dimensions.
DYNAMIC_FORMAT_VERSION = 3
#: How a dynamic dimension is written in a shape (Triton's and ONNX Runtime's ``-1``).
DYNAMIC = -1
#: The sizes the compiler runs every dynamic dimension at to prove it dynamic (one size for
#: all, so inputs that share a dimension under different names agree; large enough for
#: convolutions and pooling, small enough to run in no time). A session warms up at the first.
DYNAMIC_CHECK_SIZES = (32, 40)

#: Device kinds an executable may target.
DEVICE_KINDS = ("cpu", "ipu-model")


class AnchorType(enum.Enum):
    """Direction of an anchor, as the seed's PopEF ``TensorType``."""

    INPUT = "INPUT"
    OUTPUT = "OUTPUT"
    UNKNOWN = "UNKNOWN"


class AnchorRole(enum.Enum):
    """What an anchor carries (ours; the seed derives it from programs and data)."""

    USER_INPUT = "user_input"  # fed by callers for every main run
    USER_OUTPUT = "user_output"  # returned to callers after every main run
    WEIGHT = "weight"  # constant, uploaded by the load program, data stored in the file
    VARIABLE = "variable"  # mutable state: uploaded by load, updated by main, read by save


class ProgramKind(enum.Enum):
    LOAD = "load"
    MAIN = "main"
    SAVE = "save"


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """Shape and dtype of one tensor (seed: ``popef::TensorInfo``). A user anchor's shape may
    hold :data:`DYNAMIC` (``-1``) where a dimension takes any size per request."""

    shape: tuple[int, ...]
    dtype: np.dtype[Any]

    @property
    def is_dynamic(self) -> bool:
        """Some dimension takes any size (``-1``)."""
        return DYNAMIC in self.shape

    @property
    def num_elements(self) -> int:
        """Elements of the tensor; a dynamic dimension counts as 1 (the least it holds)."""
        n = 1
        for d in self.shape:
            n *= d if d > 0 else (0 if d == 0 else 1)
        return n

    @property
    def size_in_bytes(self) -> int:
        return self.num_elements * self.dtype.itemsize


@dataclass(frozen=True, slots=True)
class Anchor:
    """A named tensor that crosses the host/device boundary.

    ``handle`` is the tensor's name inside the program graphs. ``batch_dim`` is the axis that
    holds the executable's batch size for user inputs and outputs (``None``: not batched).
    ``has_data`` means the executable stores this anchor's data: a tensor named ``name``, or,
    for a ``bytes`` weight (a string constant), two tensors (see :mod:`.strings`).
    ``dim_names`` names each dimension of a dynamic user anchor (``""`` where it is fixed; empty
    when none is dynamic): the symbol the model gave it, so inputs sharing a symbol (a text
    model's ``seq``) are known to share its size.
    """

    name: str
    handle: str
    tensor_info: TensorInfo
    type: AnchorType
    role: AnchorRole
    programs: tuple[int, ...]
    is_per_replica: bool = False
    has_data: bool = False
    batch_dim: int | None = None
    dim_names: tuple[str, ...] = ()

    @property
    def shape(self) -> tuple[int, ...]:
        return self.tensor_info.shape

    @property
    def dtype(self) -> np.dtype[Any]:
        return self.tensor_info.dtype


@dataclass(frozen=True, slots=True)
class Program:
    """One program. ``payload`` names the ``uint8`` tensor holding its ONNX graph, if any."""

    id: int
    name: str
    kind: ProgramKind
    payload: str | None = None


@dataclass(frozen=True, slots=True)
class ProgramFlow:
    """Which programs run at load, for each main run, and at save (program ids, in order)."""

    load: tuple[int, ...] = ()
    main: tuple[int, ...] = ()
    save: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Target:
    """What the executable was compiled for.

    ``device_kind`` is one of ``cpu`` and ``ipu-model``. ``num_devices`` is the devices one
    replica spans. ``version`` is the IPU architecture version for ipu-model (0 for cpu).
    ``tiles_per_ipu`` is the ipu-model size (0: the version's default).
    """

    device_kind: str = "cpu"
    num_devices: int = 1
    version: int = 0
    tiles_per_ipu: int = 0


@dataclass(frozen=True, slots=True)
class CustomOpRef:
    """A custom op the executable uses: library module name, op name, library hash."""

    library: str
    op: str
    library_hash: str
    is_hashable: bool = False


def parse_batch_sizes(text: str | None, batch_size: int) -> tuple[int, ...] | None:
    """``"1,2,4,8"`` as sizes, or None when absent or malformed (not increasing positive
    integers ending at ``batch_size``; at most 64 of them)."""
    if not text:
        return None
    try:
        sizes = tuple(int(x) for x in text.split(",", 64))
    except ValueError:
        return None
    if len(sizes) > 64 or not sizes or sizes[-1] != batch_size or sizes[0] < 1:
        return None
    if any(a >= b for a, b in itertools.pairwise(sizes)):
        return None
    return sizes


def required_format_version(anchors: tuple[Anchor, ...]) -> int:
    """The oldest format version that can describe ``anchors``: 3 with a dynamic dimension, 2
    with a string constant (a ``bytes`` anchor with data), else 1."""
    if any(a.tensor_info.is_dynamic for a in anchors):
        return DYNAMIC_FORMAT_VERSION
    strings = any(a.has_data and a.dtype.kind == "O" for a in anchors)
    return STRINGS_FORMAT_VERSION if strings else 1


def dynamic_dims(anchors: tuple[Anchor, ...]) -> list[tuple[str, int, str]]:
    """``(anchor, dimension, name)`` of every dynamic dimension of ``anchors``."""
    return [
        (a.name, i, a.dim_names[i] if i < len(a.dim_names) else "")
        for a in anchors
        for i, d in enumerate(a.shape)
        if d == DYNAMIC
    ]


@dataclass(frozen=True, slots=True)
class ExecutableMetadata:
    """Everything in an executable but the tensor data. ``package_hash`` is "" until sealed."""

    model_name: str
    target: Target
    batch_size: int
    anchors: tuple[Anchor, ...]
    programs: tuple[Program, ...]
    program_flow: ProgramFlow
    device_iterations: int = 1
    replication_factor: int = 1
    #: main-program output anchor name -> variable anchor name it updates
    output_to_variable: Mapping[str, str] = field(default_factory=dict)
    custom_ops: tuple[CustomOpRef, ...] = ()
    options: Mapping[str, str] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    package_hash: str = ""

    def anchor(self, name: str) -> Anchor:
        for a in self.anchors:
            if a.name == name:
                return a
        raise KeyError(name)

    def program(self, program_id: int) -> Program:
        for p in self.programs:
            if p.id == program_id:
                return p
        raise KeyError(program_id)

    def anchors_with_role(self, role: AnchorRole) -> tuple[Anchor, ...]:
        return tuple(a for a in self.anchors if a.role is role)

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        """The batch sizes the main program runs, smallest first, ``batch_size`` last: its
        batch-size buckets when the compiler found it batch-agnostic (option ``batch_sizes``),
        else ``batch_size`` alone."""
        return parse_batch_sizes(self.options.get("batch_sizes"), self.batch_size) or (
            self.batch_size,
        )

    @property
    def run_sizes(self) -> tuple[int, ...]:
        """The batch sizes a batch may run at, smallest first: :attr:`batch_sizes`; or, for a
        bucketed executable with dynamic dimensions, every size up to ``batch_size`` (its
        program is planned per shape anyway, and padding a batch of long sequences to the
        next bucket would cost up to half its compute)."""
        sizes = self.batch_sizes
        if len(sizes) > 1 and self.is_dynamic:
            return tuple(range(1, self.batch_size + 1))
        return sizes

    @property
    def user_inputs(self) -> tuple[Anchor, ...]:
        return self.anchors_with_role(AnchorRole.USER_INPUT)

    @property
    def is_dynamic(self) -> bool:
        """Some user input or output has a dynamic dimension besides the batch."""
        return any(a.tensor_info.is_dynamic for a in (*self.user_inputs, *self.user_outputs))

    @property
    def user_outputs(self) -> tuple[Anchor, ...]:
        return self.anchors_with_role(AnchorRole.USER_OUTPUT)

    @property
    def execute_outputs(self) -> tuple[Anchor, ...]:
        """Outputs ``execute()`` returns: user outputs that do not update a variable (those
        stay visible to the low-level API's anchor callbacks)."""
        updates = self.output_to_variable
        return tuple(a for a in self.user_outputs if a.name not in updates)

    @property
    def weights(self) -> tuple[Anchor, ...]:
        return self.anchors_with_role(AnchorRole.WEIGHT)

    @property
    def variables(self) -> tuple[Anchor, ...]:
        return self.anchors_with_role(AnchorRole.VARIABLE)

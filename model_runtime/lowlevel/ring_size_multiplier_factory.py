"""Ring size multiplier factories (seed ``ring_size_multiplier_factory``).

A :data:`RingSizeMultiplierProd` gives, per anchor, the multiplier of its queue's ring size.
A queue holds ``multiplier`` tensors per element the executable reads from it in one run
(``device_iterations`` for main-program anchors, 1 for load/save ones). Anchors read once per
load (weights fed by the user) need no more than 1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from model_runtime.errors import ConfigurationError
from model_runtime.executable import Executable, ExecutableMetadata
from model_runtime.executable.model import Anchor

__all__ = ["RingSizeMultiplierProd", "ring_size_mult_for_main_progs", "ring_size_mult_for_progs"]

RingSizeMultiplierProd = Callable[[Anchor], int]


def _check(*multipliers: int) -> None:
    for m in multipliers:
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ConfigurationError(f"ring size multiplier {m!r} must be an integer >= 1")


def ring_size_mult_for_progs(
    programs: Sequence[int],
    selected_ring_size_multiplier: int,
    others_ring_size_multiplier: int = 1,
) -> RingSizeMultiplierProd:
    """``selected_ring_size_multiplier`` for anchors owned by ``programs``, else the other.

    Raises:
        ConfigurationError: a multiplier below 1.
    """
    _check(selected_ring_size_multiplier, others_ring_size_multiplier)
    wanted = frozenset(programs)

    def multiplier(anchor: Anchor) -> int:
        if wanted.intersection(anchor.programs):
            return selected_ring_size_multiplier
        return others_ring_size_multiplier

    return multiplier


def ring_size_mult_for_main_progs(
    model: Executable | ExecutableMetadata,
    main_ring_size_multiplier: int,
    load_save_ring_size_multiplier: int = 1,
) -> RingSizeMultiplierProd:
    """``main_ring_size_multiplier`` for anchors of ``model``'s main programs, else the other.

    Raises:
        ConfigurationError: a multiplier below 1.
    """
    meta = model.metadata if isinstance(model, Executable) else model
    return ring_size_mult_for_progs(
        meta.program_flow.main, main_ring_size_multiplier, load_save_ring_size_multiplier
    )

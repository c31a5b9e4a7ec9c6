"""The backend interface: what a device kind must do to run an executable's programs.

Small on purpose, so a new kind (``cuda`` next) is one more file. Every method is called from
the device's own worker thread, one call at a time, except :meth:`Backend.terminate`, which may
be called from any thread while another call is in flight.

Arrays a backend returns are freshly allocated per call: the caller owns them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from model_runtime.executable import Executable

__all__ = ["Backend"]


class Backend(Protocol):
    """One device's compute engine (see the module docstring)."""

    @property
    def executable(self) -> Executable | None:
        """The loaded executable (``None`` when nothing is loaded)."""
        ...

    def load(self, executable: Executable, frozen_inputs: Mapping[str, np.ndarray] | None) -> None:
        """Prepare ``executable`` and run its load programs (weights and variables to device).

        ``frozen_inputs`` (anchor name -> array) replace stored weights/variables or fix user
        inputs once. Raises: DeviceMemoryError (does not fit), InputValidationError (bad frozen
        input), ApplicationRuntimeError (the backend rejects the program).
        """
        ...

    def run_load(self) -> None:
        """Run the load programs again: weights and variables back to their loaded values.

        Raises: DeviceStateError (nothing loaded).
        """
        ...

    def run_main(
        self,
        batches: Sequence[Mapping[str, np.ndarray]],
        into: Sequence[Mapping[str, np.ndarray]] | None = None,
    ) -> list[dict[str, np.ndarray]]:
        """Run the main program once per batch (``len == device_iterations``), in this call.

        Variables are updated after each iteration. Returns one dict of user outputs (anchor
        name -> array) per batch. ``into`` (one mapping per batch): caller memory to write
        outputs to, each the output's exact shape, dtype and C-contiguous; the returned dict
        then holds those very arrays. Raises: DeviceStateError, InputValidationError,
        ApplicationRuntimeError.
        """
        ...

    def run_save(self) -> dict[str, np.ndarray]:
        """Copies of the variables' current values. Raises: DeviceStateError."""
        ...

    def reset(self) -> None:
        """Drop device state and reload: variables back to the executable's initial values.

        Raises: DeviceStateError (nothing loaded), ApplicationRuntimeError.
        """
        ...

    def restore_variables(self, values: Mapping[str, np.ndarray]) -> None:
        """Set variables (anchor name -> array). Raises: DeviceStateError, InputValidationError."""
        ...

    def unload(self) -> None:
        """Forget the executable and free device memory. Never raises."""
        ...

    def terminate(self) -> None:
        """Best-effort abort of an in-flight run (any thread). Never raises."""
        ...

"""Model Runtime: load compiled model executables onto devices and serve many callers."""

from model_runtime.errors import *  # noqa: F403
from model_runtime.errors import __all__ as _errors_all
from model_runtime.executable import Executable

__version__ = "0.1.0"

__all__ = [*_errors_all, "Executable"]

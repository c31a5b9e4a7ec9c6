"""``python -m model_runtime``: the ``model-runtime`` command line."""

import sys

from model_runtime.cli import main

sys.exit(main())

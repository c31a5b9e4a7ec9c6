"""``python -m model_runtime.server [MODEL ...] [options]``: run the daemon."""

import sys

from model_runtime.server.daemon.serve import main

sys.exit(main())

"""``python -m model_runtime.server [MODEL ...] [options]``: run the daemon."""

import sys

from model_runtime.server.daemon import main

sys.exit(main())

"""The Ray path's Serve options come from the daemon's: the proxies' end-to-end timeout is the
request timeout plus a margin (a replica's own 504 is heard first), none without one."""

from __future__ import annotations

import pytest

from model_runtime.server.daemon.options import DaemonOptions

launch = pytest.importorskip("model_runtime.ray.launch", exc_type=ImportError)


def test_the_proxies_time_requests_out_a_margin_after_the_replicas() -> None:
    opts = DaemonOptions(host="127.0.0.1", port=8123, request_timeout=6.0)
    assert launch.http_options(opts) == {
        "host": "127.0.0.1",
        "port": 8123,
        "request_timeout_s": 6.0 + launch.PROXY_TIMEOUT_MARGIN,
    }
    assert "request_timeout_s" not in launch.http_options(DaemonOptions(request_timeout=None))

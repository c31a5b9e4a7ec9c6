"""Who may do what, on the real daemon (issue 35): restricted API groups on both listeners with
tritonclient, TLS and mutual TLS for gRPC, HTTPS, and the refusal to start exposed."""

from __future__ import annotations

import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from test_daemon_support import (
    MODEL,
    REPO_ROOT,
    Daemon,
    metric,
    running,
    samples,
    start_daemon,
    stop_daemon,
    wait_for,
)
from tritonclient.utils import InferenceServerException

from model_runtime.demo import DEMO_ONNX_PATH
from model_runtime.errors import ConfigurationError
from model_runtime.server import build_parser, options_from_args
from tests.pki import write_pki

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

KEY, SECRET = "admin-key", "s3cret"
GRPC_KEY = f"triton-grpc-protocol-{KEY}"


def _refused(call: Callable[[], Any]) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value


def _http_infer(client: Any, **kw: Any) -> np.ndarray:
    pixels, _ = samples()
    x = httpclient.InferInput("pixels", [1, 64], "FP32")
    x.set_data_from_numpy(pixels[:1])
    out: np.ndarray = client.infer(MODEL, [x], **kw).as_numpy("logits")
    return out


def _grpc_infer(client: Any, **kw: Any) -> np.ndarray:
    pixels, _ = samples()
    x = grpcclient.InferInput("pixels", [1, 64], "FP32")
    x.set_data_from_numpy(pixels[:1])
    out: np.ndarray = client.infer(MODEL, [x], **kw).as_numpy("logits")
    return out


def test_a_restricted_repository_api_refuses_without_the_header_on_both_protocols(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "models"
    repo.mkdir()
    (repo / f"{MODEL}.onnx").write_bytes(DEMO_ONNX_PATH.read_bytes())
    args = (
        "--model-repository", str(repo), "--model-control-mode", "explicit",
        "--load-model", MODEL,
        "--http-restricted-api", f"model-repository:{KEY}={SECRET}",
        "--grpc-restricted-protocol", f"model-repository:{KEY}={SECRET}",
    )  # fmt: skip
    with running(tmp_path, *args) as d:
        with (
            httpclient.InferenceServerClient(f"127.0.0.1:{d.port}") as http,
            grpcclient.InferenceServerClient(f"127.0.0.1:{d.grpc_port}") as grpc,
        ):
            err = _refused(lambda: http.unload_model(MODEL))
            assert (err.status(), err.message()) == (
                "403",
                f"This API is restricted, expecting header '{KEY}'",
            )
            err = _refused(lambda: http.unload_model(MODEL, headers={KEY: "wrong"}))
            assert err.status() == "403"
            err = _refused(lambda: grpc.unload_model(MODEL))
            assert (err.status(), err.message()) == (
                "StatusCode.UNAVAILABLE",
                f"This protocol is restricted, expecting header '{GRPC_KEY}'",
            )
            err = _refused(lambda: grpc.get_model_repository_index())
            assert err.status() == "StatusCode.UNAVAILABLE"
            # Nothing changed, and inference is open.
            assert http.is_model_ready(MODEL) and grpc.is_model_ready(MODEL)
            _http_infer(http)
            _grpc_infer(grpc)
            # With the header, the repository API works.
            http.unload_model(MODEL, headers={KEY: SECRET})
            wait_for(lambda: not http.is_model_ready(MODEL), 20, "the unload")
            grpc.load_model(MODEL, headers={GRPC_KEY: SECRET})
            assert grpc.is_model_ready(MODEL)
            index = grpc.get_model_repository_index(headers={GRPC_KEY: SECRET})
            assert [m.name for m in index.models] == [MODEL]
        status, text = _get(d, "/metrics")
        assert status == 200
        counted = metric(
            text,
            'model_runtime_requests_restricted_total{group="model-repository",protocol="http"}',
        )
        assert counted == 2.0
        counted = metric(
            text,
            'model_runtime_requests_restricted_total{group="model-repository",protocol="grpc"}',
        )
        assert counted == 2.0


def _get(d: Daemon, path: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    req = urllib.request.Request(d.url(path), headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_restricted_inference_is_answered_only_with_the_header(tmp_path: Path) -> None:
    args = (
        "--http-restricted-api", f"inference:{KEY}={SECRET}",
        "--grpc-restricted-protocol", f"inference:{KEY}={SECRET}",
    )  # fmt: skip
    with (
        running(tmp_path, *args) as d,
        httpclient.InferenceServerClient(f"127.0.0.1:{d.port}") as http,
        grpcclient.InferenceServerClient(f"127.0.0.1:{d.grpc_port}") as grpc,
    ):
        assert _refused(lambda: _http_infer(http)).status() == "403"
        err = _refused(lambda: _grpc_infer(grpc))
        assert err.status() == "StatusCode.UNAVAILABLE"
        _, logits = samples()
        got = _http_infer(http, headers={KEY: SECRET})
        np.testing.assert_allclose(got, logits[:1], atol=1e-4)
        got = _grpc_infer(grpc, headers={GRPC_KEY: SECRET})
        np.testing.assert_allclose(got, logits[:1], atol=1e-4)
        assert http.is_server_ready() and grpc.get_model_metadata(MODEL).name == MODEL


def test_an_exposed_daemon_with_an_open_repository_api_does_not_start(tmp_path: Path) -> None:
    """A real start: the refusals below (bad certificates) are checked where the daemon checks
    them at start (``options_from_args``), and this one shows what a refusal is to the user: an
    exit status, the reason on stderr, nothing listening."""
    done = subprocess.run(
        [sys.executable, "-m", "model_runtime.server", "--host", "0.0.0.0", "--port", "0",
         "--grpc-port", "0", "--model-control-mode", "explicit"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, (done.stdout + done.stderr)[-2000:]
    assert "--http-restricted-api=model-repository:<header>=<secret>" in done.stderr, done.stderr
    assert "--allow-unrestricted-control" in done.stderr


# -- TLS -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate, as PEM."""
    return write_pki(tmp_path_factory.mktemp("pki"), ("server", "client", "other"))


def _start_tls(tmp_path: Path, *args: str) -> Daemon:
    return start_daemon(tmp_path, *args, wait_ready=False)


def test_grpc_over_tls_and_mutual_tls(tmp_path: Path, pki: dict[str, Path]) -> None:
    args = ("--grpc-use-ssl", "--grpc-server-cert", str(pki["server"]),
            "--grpc-server-key", str(pki["server_key"]))  # fmt: skip
    d = _start_tls(tmp_path, *args)
    try:
        url = f"127.0.0.1:{d.grpc_port}"
        with grpcclient.InferenceServerClient(
            url, ssl=True, root_certificates=str(pki["ca"])
        ) as tls:
            wait_for(lambda: tls.is_server_ready(), 60, "the daemon to be ready over TLS")
            _, logits = samples()
            np.testing.assert_allclose(_grpc_infer(tls), logits[:1], atol=1e-4)
        with grpcclient.InferenceServerClient(url) as plain:
            assert _refused(lambda: plain.is_server_live(client_timeout=5)).status() in (
                "StatusCode.UNAVAILABLE",
                "StatusCode.DEADLINE_EXCEEDED",
            )
    finally:
        stop_daemon(d)

    args += ("--grpc-use-ssl-mutual", "--grpc-root-cert", str(pki["ca"]))
    d = _start_tls(tmp_path, *args)
    try:
        url = f"127.0.0.1:{d.grpc_port}"
        with grpcclient.InferenceServerClient(
            url,
            ssl=True,
            root_certificates=str(pki["ca"]),
            private_key=str(pki["client_key"]),
            certificate_chain=str(pki["client"]),
        ) as mutual:
            wait_for(lambda: mutual.is_server_ready(), 60, "the daemon to be ready over mTLS")
            _grpc_infer(mutual)
        with grpcclient.InferenceServerClient(
            url, ssl=True, root_certificates=str(pki["ca"])
        ) as anonymous:  # TLS, but no client certificate: refused in the handshake
            assert _refused(lambda: anonymous.is_server_live(client_timeout=5)).status() in (
                "StatusCode.UNAVAILABLE",
                "StatusCode.DEADLINE_EXCEEDED",
            )
    finally:
        stop_daemon(d)


def test_https(tmp_path: Path, pki: dict[str, Path]) -> None:
    args = ("--http-use-ssl", "--http-server-cert", str(pki["server"]),
            "--http-server-key", str(pki["server_key"]))  # fmt: skip
    d = _start_tls(tmp_path, *args)
    try:
        context = ssl.create_default_context(cafile=str(pki["ca"]))
        url = f"https://127.0.0.1:{d.port}/v2/health/ready"

        def ready() -> bool:  # 503 until the models are loaded: the server listens first
            try:
                with urllib.request.urlopen(url, timeout=5, context=context) as resp:
                    return bool(resp.status == 200)
            except urllib.error.HTTPError as exc:
                if exc.code != 503:
                    raise
                return False

        wait_for(ready, 60, "the daemon to be ready over HTTPS")
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            urllib.request.urlopen(f"http://127.0.0.1:{d.port}/v2/health/ready", timeout=5)
    finally:
        stop_daemon(d)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--grpc-use-ssl", "--grpc-server-cert", "{server}", "--grpc-server-key", "{other_key}"],
         "do not load as a pair"),
        (["--grpc-use-ssl", "--grpc-server-cert", "{server}", "--grpc-server-key", "/nope.key"],
         "no such file '/nope.key'"),
        (["--grpc-use-ssl", "--grpc-server-cert", "{server}"],
         "--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key"),
        (["--http-use-ssl", "--http-server-cert", "{server}", "--http-server-key",
          "{server_key}", "--http-use-ssl-mutual"], "--http-use-ssl-mutual needs --http-root-cert"),
    ],
)  # fmt: skip
def test_bad_certificates_stop_the_start_with_a_clear_error(
    pki: dict[str, Path], flags: list[str], message: str
) -> None:
    """What ``python -m model_runtime.server`` checks before anything listens, where it checks
    it: a ConfigurationError, which the start prints to stderr and exits 2 with (the real
    start of the exposure test above)."""
    argv = [f.format(**{k: str(v) for k, v in pki.items()}) for f in flags]
    with pytest.raises(ConfigurationError) as refused:
        options_from_args(build_parser().parse_args(["--port", "0", "--grpc-port", "0", *argv]))
    assert message in str(refused.value)

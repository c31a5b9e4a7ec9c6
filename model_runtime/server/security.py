"""TLS for both listeners, and the daemon's refusal to start exposed without restrictions.

**TLS.** gRPC takes Triton's flags (``--grpc-use-ssl``, ``--grpc-server-cert``,
``--grpc-server-key``, ``--grpc-root-cert``, ``--grpc-use-ssl-mutual``), HTTP the same in its
own names (``--http-use-ssl`` ...). Certificate and key are read once, at start, and checked
together (Python's ``ssl`` loads the pair, so a key that is not the certificate's, a missing
file or a bad PEM is a :class:`~model_runtime.errors.ConfigurationError` that names the file
before anything listens); mutual TLS needs the root certificate that client certificates are
checked against, and refuses a client without one.

**Exposure.** Off loopback (``--host`` other than 127.0.0.0/8, ::1 or ``localhost``), a model
control mode other than ``none`` lets whoever reaches the port load and unload models, which
Triton's documentation warns can lead to code execution: the daemon refuses to start unless
the ``model-repository`` group is restricted on both protocols, and says which flags to add, or
the operator says ``--allow-unrestricted-control``.
"""

from __future__ import annotations

import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from model_runtime.errors import ConfigurationError
from model_runtime.server.restrict import Restrictions

__all__ = ["TLSFiles", "check_exposure", "grpc_credentials", "is_loopback", "ssl_context"]


@dataclass(frozen=True, slots=True)
class TLSFiles:
    """One listener's TLS: its certificate and key (PEM), the root certificate client
    certificates are checked against (None: none), and whether clients must present one."""

    cert: Path
    key: Path
    root: Path | None = None
    mutual: bool = False

    @classmethod
    def from_flags(
        cls,
        protocol: str,
        use: bool,
        cert: str | Path | None,
        key: str | Path | None,
        root: str | Path | None,
        mutual: bool,
    ) -> TLSFiles | None:
        """The files the ``--{protocol}-*ssl*`` flags name (None: TLS off).

        Raises:
            ConfigurationError: TLS on without a certificate or key, mutual TLS without a
                root certificate, or a file flag without ``--{protocol}-use-ssl``.
        """
        flag = f"--{protocol}"
        if not use:
            given = [n for n, v in (("server-cert", cert), ("server-key", key)) if v]
            if given or mutual or root:
                raise ConfigurationError(
                    f"{flag}-server-cert/-server-key/-root-cert/-use-ssl-mutual need {flag}-use-ssl"
                )
            return None
        if not cert or not key:
            raise ConfigurationError(
                f"{flag}-use-ssl needs {flag}-server-cert and {flag}-server-key"
            )
        if mutual and not root:
            raise ConfigurationError(
                f"{flag}-use-ssl-mutual needs {flag}-root-cert (what client certificates are "
                "checked against)"
            )
        return cls(Path(cert), Path(key), Path(root) if root else None, mutual)


def ssl_context(files: TLSFiles) -> ssl.SSLContext:
    """A server context of ``files``, read now (HTTPS for aiohttp, and the check of both).

    Raises:
        ConfigurationError: a file is missing or unreadable, not PEM, or the key is not the
            certificate's.
    """
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(files.cert, files.key)
    except FileNotFoundError as exc:
        raise ConfigurationError(f"TLS: no such file {exc.filename!r}") from exc
    except (OSError, ssl.SSLError) as exc:
        raise ConfigurationError(
            f"TLS: certificate {str(files.cert)!r} and key {str(files.key)!r} do not load "
            f"as a pair: {exc}"
        ) from exc
    if files.root is not None:
        try:
            context.load_verify_locations(cafile=files.root)
        except FileNotFoundError as exc:
            raise ConfigurationError(f"TLS: no such file {exc.filename!r}") from exc
        except (OSError, ssl.SSLError) as exc:
            raise ConfigurationError(
                f"TLS: root certificate {str(files.root)!r} does not load: {exc}"
            ) from exc
    context.verify_mode = ssl.CERT_REQUIRED if files.mutual else ssl.CERT_NONE
    return context


def grpc_credentials(files: TLSFiles) -> Any:
    """grpcio's server credentials of ``files``, read now and checked as :func:`ssl_context`
    checks them (grpcio itself would only fail at the first handshake).

    Raises:
        ConfigurationError: as :func:`ssl_context`.
    """
    ssl_context(files)
    pair = (files.key.read_bytes(), files.cert.read_bytes())
    root = files.root.read_bytes() if files.root is not None else None
    return grpc.ssl_server_credentials(
        [pair], root_certificates=root, require_client_auth=files.mutual
    )


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is reachable from this machine only."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def check_exposure(
    host: str,
    control_mode: str,
    http: Restrictions,
    grpc_: Restrictions,
    *,
    allow_unrestricted: bool = False,
) -> None:
    """Refuse to start a daemon that lets anyone reaching ``host`` manage its models.

    Raises:
        ConfigurationError: ``host`` is not loopback, ``control_mode`` is not ``none``, the
            ``model-repository`` group is open on a protocol, and ``allow_unrestricted`` is
            not set; the message names the flags that would fix it.
    """
    if allow_unrestricted or control_mode == "none" or is_loopback(host):
        return
    missing = []
    if http.get("model-repository") is None:
        missing.append("--http-restricted-api=model-repository:<header>=<secret>")
    if grpc_.get("model-repository") is None:
        missing.append("--grpc-restricted-protocol=model-repository:<header>=<secret>")
    if missing:
        raise ConfigurationError(
            f"--host {host} is not a loopback address and --model-control-mode {control_mode} "
            "lets any client load and unload models: add "
            + " and ".join(missing)
            + " (or --allow-unrestricted-control to accept that)"
        )

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
Triton's documentation warns can lead to code execution, and client shared memory lets them
have the daemon map any shared memory object it can open: the daemon refuses to start unless
the ``model-repository`` (``shared-memory``) group is restricted on both protocols, and says
which flags to add, or the operator says ``--allow-unrestricted-control``. Client shared memory
is off by default off loopback (where no client can share memory with the daemon anyway), so
the container's defaults start.
"""

from __future__ import annotations

import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from model_runtime.errors import ConfigurationError
from model_runtime.server.security.restrict import Restrictions

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
    for path in (files.cert, files.key, files.root):
        if path is not None and not path.is_file():
            raise ConfigurationError(f"TLS: no such file {str(path)!r}")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(files.cert, files.key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigurationError(
            f"TLS: certificate {str(files.cert)!r} and key {str(files.key)!r} do not load "
            f"as a pair: {exc}"
        ) from exc
    if files.root is not None:
        try:
            context.load_verify_locations(cafile=files.root)
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
    client_shm: bool = False,
    allow_unrestricted: bool = False,
) -> None:
    """Refuse to start a daemon that lets anyone reaching ``host`` manage its models, or map
    shared memory objects of the daemon's machine (``client_shm``).

    Raises:
        ConfigurationError: ``host`` is not loopback, ``allow_unrestricted`` is not set, and
            ``control_mode`` is not ``none`` while the ``model-repository`` group is open on a
            protocol, or ``client_shm`` is on while the ``shared-memory`` group is; the message
            names the flags that would fix it.
    """
    if allow_unrestricted or is_loopback(host):
        return
    wanted = []
    if control_mode != "none":
        wanted.append(("model-repository", f"--model-control-mode {control_mode}", "load and "
                       "unload models"))  # fmt: skip
    if client_shm:
        wanted.append(("shared-memory", "--allow-client-shm", "map this machine's shared memory"))
    for group, flag, what in wanted:
        missing = []
        if http.get(group) is None:
            missing.append(f"--http-restricted-api={group}:<header>=<secret>")
        if grpc_.get(group) is None:
            missing.append(f"--grpc-restricted-protocol={group}:<header>=<secret>")
        if missing:
            raise ConfigurationError(
                f"--host {host} is not a loopback address and {flag} lets any client {what}: "
                "add " + " and ".join(missing) + " (or --allow-unrestricted-control to accept "
                "that)"
            )

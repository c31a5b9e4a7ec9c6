"""A throwaway PKI for TLS tests and benchmarks: a CA and certificates it signs (P-256, valid
for a day, each for 127.0.0.1 and localhost), written as PEM files."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

__all__ = ["write_pki"]


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(subject: str, key: Any, issuer: str, issuer_key: Any, *, ca: bool = False) -> Any:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        alt = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(path: Path, cert: Any = None, key: Any = None) -> Path:
    if cert is not None:
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    else:
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    return path


def write_pki(directory: Path, names: Sequence[str] = ("server",)) -> dict[str, Path]:
    """Files in ``directory``: ``"ca"`` (ca.pem), and per name ``NAME`` (NAME.pem) and
    ``NAME_key`` (NAME.key), each certificate signed by the CA."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("test ca", ca_key, "test ca", ca_key, ca=True)
    files = {"ca": _pem(directory / "ca.pem", ca)}
    for who in names:
        key = ec.generate_private_key(ec.SECP256R1())
        files[f"{who}_key"] = _pem(directory / f"{who}.key", key=key)
        files[who] = _pem(directory / f"{who}.pem", _cert(who, key, "test ca", ca_key))
    return files

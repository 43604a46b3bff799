"""Throwaway certificate authorities and certificates for the TLS tests (the `cryptography`
package): a CA, a server certificate for 127.0.0.1/localhost, client certificates, expired ones."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pem:
    """A certificate and its private key, written as PEM files."""

    cert: Path
    key: Path


class CertificateAuthority:
    """A self-signed CA that issues leaf certificates into `folder`."""

    def __init__(self, folder: Path, name: str = "mq-scheduler test CA") -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = _now()
        self.cert = (
            _builder(subject, subject, self.key.public_key(), now - _DAY, now + 30 * _DAY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
        )
        slug = name.replace(" ", "-")
        self.pem = folder / f"{slug}.pem"
        self.pem.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, *, server: bool = True, expired: bool = False) -> Pem:
        """A certificate for `name` (a server's for 127.0.0.1 and localhost, or a client's);
        `expired`: valid for a day that ended yesterday."""
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = _now()
        start, end = (now - 3 * _DAY, now - _DAY) if expired else (now - _DAY, now + 30 * _DAY)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = _builder(subject, self.cert.subject, key.public_key(), start, end)
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        if server:
            names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        pem = Pem(self.folder / f"{name}.crt", self.folder / f"{name}.key")
        pem.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        pem.key.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        pem.key.chmod(0o600)
        return pem


_DAY = dt.timedelta(days=1)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(microsecond=0)


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    start: dt.datetime,
    end: dt.datetime,
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
    )

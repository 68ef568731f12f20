"""Site identities and mutual TLS for the fabric link (core layer of the fabric).

Every site has a key pair and a self-signed certificate naming it. Sites trust each other
by pinning certificates (``loomfs site add NAME --cert FILE`` on the hub), not through a
CA: a hub accepts exactly the spokes it was told about, and a spoke accepts exactly its
hub. Revoking a site is removing its certificate from the pinned set; contexts are rebuilt
from that set, so a revoked site's next handshake fails.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ..core.certs import LABELS_OID, certificate_labels, certificate_name
from ..errors import AlreadyExists, NotFound

KEY_FILE = "site.key"
CERT_FILE = "site.pem"
VALIDITY = datetime.timedelta(days=3650)


@dataclass(frozen=True, slots=True)
class SiteIdentity:
    name: str
    key_path: Path
    cert_path: Path

    @property
    def cert_pem(self) -> bytes:
        return self.cert_path.read_bytes()

    @property
    def labels(self) -> dict[str, str]:
        return certificate_labels(self.cert_pem)

    @classmethod
    def create(
        cls,
        directory: Path,
        name: str,
        hosts: Iterable[str] = (),
        labels: Mapping[str, str] | None = None,
    ) -> SiteIdentity:
        """A new key and self-signed certificate in ``directory`` (refuses to overwrite)."""
        key_path, cert_path = directory / KEY_FILE, directory / CERT_FILE
        if key_path.exists() or cert_path.exists():
            raise AlreadyExists(
                f"a site identity already exists in {directory}", path=str(directory)
            )
        directory.mkdir(parents=True, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        alt: list[x509.GeneralName] = [x509.DNSName(name)]
        for host in {"localhost", *hosts}:
            try:
                alt.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                alt.append(x509.DNSName(host))
        alt.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            # its own anchor: a pinned self-signed certificate must be allowed to sign itself
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.UnrecognizedExtension(
                    LABELS_OID, json.dumps(dict(labels or {}), sort_keys=True).encode()
                ),
                critical=False,
            )
            .sign(key, hashes.SHA256())
        )
        # the key is written readable by its owner only, before any byte of it lands
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(
                key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                )
            )
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return cls(name, key_path, cert_path)

    @classmethod
    def load(cls, directory: Path) -> SiteIdentity:
        key_path, cert_path = directory / KEY_FILE, directory / CERT_FILE
        if not key_path.exists() or not cert_path.exists():
            raise NotFound(
                f"no site identity in {directory}; create one with 'loomfs site init'",
                path=str(directory),
            )
        return cls(certificate_name(cert_path.read_bytes()), key_path, cert_path)

    def server_context(self, trusted: Iterable[bytes]) -> ssl.SSLContext:
        """For a hub: present this site's certificate, require one of the pinned ones."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.load_cert_chain(self.cert_path, self.key_path)
        context.verify_mode = ssl.CERT_REQUIRED
        pins = b"".join(trusted)
        if pins:
            context.load_verify_locations(cadata=pins.decode())
        return context

    def client_context(self, hub_cert: bytes) -> ssl.SSLContext:
        """For a spoke: present this site's certificate, accept only the pinned hub."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.load_cert_chain(self.cert_path, self.key_path)
        context.load_verify_locations(cadata=hub_cert.decode())
        # the pin is the identity: the hub may be reached by any address
        context.check_hostname = False
        return context

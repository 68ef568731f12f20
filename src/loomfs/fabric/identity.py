"""Site identities and TLS: mutual TLS for the fabric link, HTTPS for the REST and S3
listeners and the clients that reach them (core layer of the fabric).

Every site has a key pair and a self-signed certificate naming it. Sites trust each other
by pinning certificates (``loomfs site add NAME --cert FILE`` on the hub), not through a
CA: a hub accepts exactly the spokes it was told about, and a spoke accepts exactly its
hub. Revoking a site is removing its certificate from the pinned set; contexts are rebuilt
from that set, so a revoked site's next handshake fails.

A listener that serves HTTPS without certificate files of its own uses a second
self-signed certificate (``https.pem``), made once in the identity directory so that its
fingerprint, which the site logs at start, stays what its clients were told to trust.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import socket
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ..core.certs import LABELS_OID, certificate_labels, certificate_name
from ..errors import AlreadyExists, ConfigError, NotFound

KEY_FILE = "site.key"
CERT_FILE = "site.pem"
HTTPS_KEY_FILE = "https.key"
HTTPS_CERT_FILE = "https.pem"
# an anchor that is also the server's own certificate: strict verifiers want it said that
# it may sign (itself) and serve
HTTPS_EXTENSIONS: tuple[x509.ExtensionType, ...] = (
    x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=True,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    ),
    x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
)
VALIDITY = datetime.timedelta(days=3650)


def _write_self_signed(
    key_path: Path,
    cert_path: Path,
    name: str,
    hosts: Iterable[str],
    extensions: Iterable[x509.ExtensionType] = (),
) -> None:
    """A new EC key and a self-signed certificate for ``name``, valid for ``hosts``, this
    machine's loopback and ``localhost``, with ``extensions`` added; the key is written
    readable by its owner only, before any byte of it lands."""
    key_path.parent.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    alt: list[x509.GeneralName] = [x509.DNSName(name)]
    for host in sorted({"localhost", "127.0.0.1", *hosts} - {name}):
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            alt.append(x509.DNSName(host))
    now = datetime.datetime.now(datetime.UTC)
    builder = (
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
        # which key signed it: strict verifiers (Python 3.13's default) want both of an anchor
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key()), False)
    )
    for extension in extensions:
        builder = builder.add_extension(extension, critical=False)
    cert = builder.sign(key, hashes.SHA256())
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


def https_certificate(directory: Path, name: str, hosts: Iterable[str]) -> tuple[Path, Path]:
    """(certificate, key) of the self-signed certificate this site serves HTTPS with where
    it has no files of its own: made on first use, valid for ``hosts`` (the addresses it
    listens on), this machine's names and loopback; afterwards the same one, whatever the
    hosts, so that clients trusting it keep trusting it."""
    key_path, cert_path = directory / HTTPS_KEY_FILE, directory / HTTPS_CERT_FILE
    if not cert_path.exists():
        key_path.unlink(missing_ok=True)  # a key without its certificate: a start cut short
        names = {socket.gethostname(), socket.getfqdn(), "::1", *hosts} - {"", "0.0.0.0", "::"}
        _write_self_signed(key_path, cert_path, name, names, HTTPS_EXTENSIONS)
    return cert_path, key_path


def https_server_context(cert: Path, key: Path) -> ssl.SSLContext:
    """For a REST or S3 listener: present ``cert``; clients authenticate otherwise (HTTP
    Basic, SigV4), so none is asked for a certificate."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2  # what S3 clients still speak
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the TLS certificate {cert} and key {key}: {exc}") from None
    return context


def trusting(ca_cert: Path) -> ssl.SSLContext:
    """For a client of a REST or S3 listener: verify its certificate (and name) against
    ``ca_cert``: a site's self-signed ``https.pem``, or the CA that signed its files."""
    try:
        return ssl.create_default_context(cafile=str(ca_cert))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot read the trusted certificate {ca_cert}: {exc}") from None


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
        labels_ext = x509.UnrecognizedExtension(
            LABELS_OID, json.dumps(dict(labels or {}), sort_keys=True).encode()
        )
        _write_self_signed(key_path, cert_path, name, hosts, [labels_ext])
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

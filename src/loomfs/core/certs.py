"""What a site's certificate says (core layer): its pin, its name, its labels.

The site registry (``core.sites``) pins certificates by these and the fabric link
(``fabric.identity``) makes and presents them; both read them here, so the core layer
needs nothing from the fabric.
"""

from __future__ import annotations

import hashlib
import json

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID

from ..errors import ConfigError

# a private extension under the UUID arc (2.25, ITU-T X.667: no registration needed) that
# carries the site's labels, so the hub pins them with the certificate that signs them
LABELS_OID = x509.ObjectIdentifier("2.25.301612484716367426014213916858012405113")


def fingerprint(cert_pem: bytes) -> str:
    """SHA-256 of the certificate's DER form, hex: what a site is pinned by."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def certificate_labels(cert_pem: bytes) -> dict[str, str]:
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        ext = cert.extensions.get_extension_for_oid(LABELS_OID)
    except x509.ExtensionNotFound:
        return {}
    value = ext.value
    assert isinstance(value, x509.UnrecognizedExtension)
    labels = json.loads(value.value)
    return {str(k): str(v) for k, v in labels.items()}


def certificate_name(cert_pem: bytes) -> str:
    cert = x509.load_pem_x509_certificate(cert_pem)
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not names:
        raise ConfigError("certificate has no common name (site name)")
    return str(names[0].value)
